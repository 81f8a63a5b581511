-- KEYS[1] the epoch of one place (hash: epoch, counter; no TTL: it never
-- expires, and is not a record: no other script reads it)
-- ARGV: candidate epoch, written only when the place has none
-- Reply: {epoch, counter after this advance, created (1: written now, 0: not)}
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then
  -- Absent (or a hash without its epoch, which only a hand could leave):
  -- written afresh, its counter at 1.
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'counter', 1)
  return {ARGV[1], 1, 1}
end
return {epoch, redis.call('HINCRBY', KEYS[1], 'counter', 1), 0}
