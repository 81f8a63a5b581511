-- KEYS[1] record, KEYS[2] fence counter (the prefix's on one server, the
-- record's own on a cluster), KEYS[3] in-progress index (zset by lease end),
-- KEYS[4] the (scope, key) index (zset: operation by created_at)
-- ARGV: fingerprint, now, lease_until, expires_at (milliseconds), operation,
--       drop_at (when Redis may drop the keys: expires_at plus a margin for
--       a Redis clock that runs ahead of the callers'), fence kind ('1': the
--       counter is the record's own, '0': the prefix's), acknowledged ('1': the
--       store waits for replicas after this call: a replay writes the record's
--       expiry again, so that the wait covers the completion it answers with)
-- Reply: {outcome, fence, created_at, lease_until, expires_at, status,
--         resource_id, response_status, response_headers, response_body}
-- outcome: 0 acquired, 1 in flight, 2 replay, 3 mismatch, 4 takeover
-- (named once, in idem_core::transition::ClaimCode).
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'fp', 'st', 'fence', 'ca', 'lu', 'ea', 'rid', 'rs', 'rh', 'rb')
local taken = 0
if r[1] and tonumber(r[6]) > now then
  if r[1] ~= ARGV[1] then
    return {3, r[3], r[4], r[5] or '', r[6], r[2], '', '', '', ''}
  end
  if r[2] ~= '0' then
    if ARGV[8] == '1' then
      -- Rewrites the record's own expiry: a write Redis replicates and
      -- does not refuse when its memory is full.
      local at = redis.call('PEXPIRETIME', KEYS[1])
      if at > 0 then redis.call('PEXPIREAT', KEYS[1], at) end
    end
    return {2, r[3], r[4], '', r[6], r[2], r[7] or '', r[8] or '', r[9] or '', r[10] or ''}
  end
  if tonumber(r[5]) > now then
    return {1, r[3], r[4], r[5], r[6], r[2], '', '', '', ''}
  end
  taken = 4
end
local f
if ARGV[7] == '1' then
  -- A fence of the record's own: above every fence this record ever had
  -- (the counter lives as long as the record's keys), and at least the
  -- server's clock in microseconds, so a counter that has expired starts
  -- again above every fence it gave while it lived. Formatted by hand:
  -- Lua would print a number this large with an exponent.
  local t = redis.call('TIME')
  local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if r[3] and tonumber(r[3]) > last then last = tonumber(r[3]) end
  if last >= n then n = last + 1 end
  f = string.format('%.0f', n)
  redis.call('SET', KEYS[2], f, 'KEEPTTL')
  if redis.call('PEXPIREAT', KEYS[2], ARGV[6], 'GT') == 0 then
    redis.call('PEXPIREAT', KEYS[2], ARGV[6], 'NX')
  end
else
  f = redis.call('INCR', KEYS[2])
end
-- A key that holds a record (or anything) is cleared first, so that no
-- field of its last answer survives; a new key has nothing to clear.
if r[1] or r[2] or r[3] or r[4] or r[5] or r[6] or r[7] or r[8] or r[9] or r[10] then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'st', '0', 'fence', f, 'ca', ARGV[2], 'lu', ARGV[3], 'ea', ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[3], KEYS[1])
-- The (scope, key) index lives at least as long as its longest-lived record.
-- GT alone never sets a TTL on a key without one (it counts as infinite), so
-- NX covers a new index.
-- NX first: a new index (the common case, one operation per key) takes
-- its TTL in one call; an index with a TTL only ever moves it later.
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[5])
if redis.call('PEXPIREAT', KEYS[4], ARGV[6], 'NX') == 0 then
  redis.call('PEXPIREAT', KEYS[4], ARGV[6], 'GT')
end
return {taken, f, ARGV[2], ARGV[3], ARGV[4], '0', '', '', '', ''}
