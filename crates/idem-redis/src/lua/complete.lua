-- KEYS[1] record, KEYS[2] in-progress index
-- ARGV: fence, status, resource_id ('' or 's' .. id), response_status, headers, body
-- Reply: 1 applied, 0 stale fence.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] ~= '0' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'rid', ARGV[3], 'rs', ARGV[4], 'rh', ARGV[5], 'rb', ARGV[6])
redis.call('HDEL', KEYS[1], 'lu')
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
