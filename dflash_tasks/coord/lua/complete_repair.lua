-- Record a chunk's repair round once: counters move only on its first completion.
-- KEYS: leases, owners, repairs (set of "chunk:round"), stats; ARGV: chunk, "chunk:round", name, value, ...
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('SADD', KEYS[3], ARGV[2]) == 1 then
  for i = 3, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[4], ARGV[i], ARGV[i + 1]) end
  return 1
end
return 0
