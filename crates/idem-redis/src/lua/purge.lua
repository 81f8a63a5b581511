-- KEYS[1] in-progress index, KEYS[2..] candidate records; ARGV: now, limit. Deletes those expired at now,
-- at most limit. Reply: how many were deleted.
local now, limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for i = 2, #KEYS do
  local k = KEYS[i]
  if n >= limit then break end
  local ea = redis.call('HGET', k, 'ea')
  if ea and tonumber(ea) <= now then
    redis.call('DEL', k)
    redis.call('ZREM', KEYS[1], k)
    n = n + 1
  end
end
return n
