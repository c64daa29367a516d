-- Renew leases still owned by us (or lost with a Redis restart); never steal a taken-over lease.
for i = 1, #KEYS, 2 do
  local owner = redis.call('HGET', KEYS[i + 1], ARGV[i])
  if not owner or owner == ARGV[i + 1] then
    redis.call('ZADD', KEYS[i], ARGV[#ARGV], ARGV[i])
    redis.call('HSET', KEYS[i + 1], ARGV[i], ARGV[i + 1])
  end
end
return 1
