-- KEYS[1] record, KEYS[2] in-progress index
-- ARGV: fence, status, resource_id ('' or 's' .. id), response_status, headers, body,
--       acknowledged ('1': the store waits for replicas after this call)
-- Reply: 1 applied, 0 stale fence, 2 stale fence but this fence completed the
-- record before: a repeated completion (its first answer was lost, or its
-- replicas did not acknowledge it in time). With acknowledged set, the
-- script then writes again (the record's expiry), so that the wait after this call
-- covers the first completion too (replicas apply writes in order).
local r = redis.call('HMGET', KEYS[1], 'st', 'fence')
if r[2] == ARGV[1] and r[1] and r[1] ~= '0' then
  if ARGV[7] == '1' then
    -- Rewrites the record's own expiry: a write Redis replicates and does
    -- not refuse when its memory is full.
    local at = redis.call('PEXPIRETIME', KEYS[1])
    if at > 0 then redis.call('PEXPIREAT', KEYS[1], at) end
  end
  return 2
end
if r[1] ~= '0' or r[2] ~= ARGV[1] then
  return 0
end
-- A finished record has no lease: its lease end is written empty, which
-- every reader takes as none (as an absent field), in the same call.
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'lu', '', 'rid', ARGV[3], 'rs', ARGV[4], 'rh', ARGV[5], 'rb', ARGV[6])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
