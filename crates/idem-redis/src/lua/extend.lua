-- KEYS[1] record, KEYS[2] in-progress index, KEYS[3] the (scope, key) index,
-- KEYS[4] fence counter (as claim.lua's KEYS[2]);
-- ARGV: fence, lease_until (ms), drop_at (lease_until plus the expiry margin,
-- as claim.lua's drop_at).
-- Reply: 1 applied (the lease ends at the later of its end and ARGV[2], and
-- the record expires no earlier than that), 0 stale fence (no record,
-- another fence, finished): nothing changed.
-- An expired record still takes its own fence's heartbeat, as complete.lua
-- takes its result: nobody else has claimed it.
local r = redis.call('HMGET', KEYS[1], 'st', 'fence', 'lu', 'ea')
if r[1] ~= '0' or r[2] ~= ARGV[1] then
  return 0
end
local to = tonumber(ARGV[2])
if not r[3] or tonumber(r[3]) < to then
  redis.call('HSET', KEYS[1], 'lu', ARGV[2])
  -- The stale listing reads the index by lease end.
  redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
end
-- The record lives at least as long as its lease: a claim (and the purge)
-- would otherwise treat it as gone while its execution still runs. Its
-- keys' Redis TTLs rise with it (GT: never lower, and never set on a key
-- without one, such as the prefix's fence counter on one server): the
-- (scope, key) index outlives every record it lists, and a record's own
-- fence counter lives as long as the record.
if not r[4] or tonumber(r[4]) < to then
  redis.call('HSET', KEYS[1], 'ea', ARGV[2])
  redis.call('PEXPIREAT', KEYS[1], ARGV[3], 'GT')
  redis.call('PEXPIREAT', KEYS[3], ARGV[3], 'GT')
  redis.call('PEXPIREAT', KEYS[4], ARGV[3], 'GT')
end
return 1
