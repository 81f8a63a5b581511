-- KEYS[1] record, KEYS[2] in-progress index; ARGV: fence. Reply: 1 applied, 0 stale fence.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[1] ~= '0' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
