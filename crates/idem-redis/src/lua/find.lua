-- KEYS[1] the (scope, key) index (zset: operation by created_at)
-- ARGV: now, limit, record key head ('PREFIX:r:LEN:SCOPE:'), record key tail (':KEY')
-- Reply: flat list of {operation, fingerprint, status, fence, created_at, lease_until,
-- expires_at, resource_id, response_status, response_headers, response_body} for up
-- to `limit` live records, by (created_at, operation) descending. Members whose
-- record is gone (released, purged, dropped by its TTL) or expired at now are
-- removed on the way: release and purge leave them behind.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, found, offset = {}, 0, 0
while found < limit do
  local page = redis.call('ZREVRANGE', KEYS[1], offset, offset + 99)
  if #page == 0 then break end
  local gone = {}
  for i = 1, #page do
    if found >= limit then break end
    local op = page[i]
    local r = redis.call('HMGET', ARGV[3] .. #op .. ':' .. op .. ARGV[4],
      'fp', 'st', 'fence', 'ca', 'lu', 'ea', 'rid', 'rs', 'rh', 'rb')
    if r[1] and tonumber(r[6]) > now then
      table.insert(out, op)
      for j = 1, 10 do table.insert(out, r[j] or '') end
      found = found + 1
    else
      table.insert(gone, op)
    end
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
  end
  offset = offset + #page - #gone
end
return out
