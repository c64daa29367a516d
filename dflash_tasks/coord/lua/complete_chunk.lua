-- Mark a chunk done once: counters move only on the first completion of a chunk.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('SADD', KEYS[3], ARGV[1]) == 1 then
  for i = 2, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[4], ARGV[i], ARGV[i + 1]) end
  return 1
end
return 0
