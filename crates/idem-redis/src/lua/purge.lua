-- KEYS: candidate records; ARGV: now, limit. Deletes those expired at now,
-- at most limit. Reply: how many were deleted.
local now, limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for _, k in ipairs(KEYS) do
  if n >= limit then break end
  local ea = redis.call('HGET', k, 'ea')
  if ea and tonumber(ea) <= now then
    redis.call('DEL', k)
    n = n + 1
  end
end
return n
