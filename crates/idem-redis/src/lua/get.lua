-- KEYS[1] record; ARGV: now.
-- Reply: {} when absent or expired, else
-- {fingerprint, status, fence, created_at, lease_until, expires_at,
--  resource_id, response_status, response_headers, response_body}
local r = redis.call('HMGET', KEYS[1], 'fp', 'st', 'fence', 'ca', 'lu', 'ea', 'rid', 'rs', 'rh', 'rb')
if not r[1] or tonumber(r[6]) <= tonumber(ARGV[1]) then
  return {}
end
for i = 1, 10 do
  if not r[i] then r[i] = '' end
end
return r
