-- Take (or re-take) a lease unless a different owner holds a live one. Returns 1 on success.
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > tonumber(ARGV[3]) then
  local owner = redis.call('HGET', KEYS[2], ARGV[1])
  if owner and owner ~= ARGV[2] then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
