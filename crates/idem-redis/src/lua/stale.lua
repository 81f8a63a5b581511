-- KEYS[1] in-progress index (zset: record key by lease end)
-- ARGV: now, cursor lease end, cursor record key ('' for none), limit
-- Reply: flat list of {record key, fingerprint, status, fence, created_at,
-- lease_until, expires_at} for up to `limit` stale records, by (lease end,
-- record key). Index entries whose record is gone, finished or expired are
-- dropped on the way (the record's Redis TTL does not clean the index).
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[4])
local cursor_score, cursor_key = ARGV[2], ARGV[3]
local out, found, offset = {}, 0, 0
while found < limit do
  local page = redis.call('ZRANGEBYSCORE', KEYS[1], cursor_score, now, 'WITHSCORES', 'LIMIT', offset, 100)
  if #page == 0 then break end
  offset = offset + #page / 2
  for i = 1, #page, 2 do
    local k, score = page[i], page[i + 1]
    local after = cursor_key == '' or tonumber(score) > tonumber(cursor_score)
      or (tonumber(score) == tonumber(cursor_score) and k > cursor_key)
    if after and found < limit then
      local r = redis.call('HMGET', k, 'fp', 'st', 'fence', 'ca', 'lu', 'ea')
      if r[1] and r[2] == '0' and tonumber(r[6]) > now then
        table.insert(out, k)
        for j = 1, 6 do table.insert(out, r[j]) end
        found = found + 1
      elseif not r[1] or r[2] ~= '0' then
        redis.call('ZREM', KEYS[1], k)
        offset = offset - 1
      end
    end
  end
end
return out
