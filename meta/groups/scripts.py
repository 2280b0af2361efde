"""The Lua a broker runs on Redis (its heartbeat), and the helpers every group script shares
(controller/scripts.py builds the controller's writes on them)."""

from __future__ import annotations

COMMON = """
local function num(key, field) return tonumber(redis.call('HGET', key, field) or '0') end
local function str(key, field) return redis.call('HGET', key, field) or '' end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function contains(list, item)
  for _, x in ipairs(list) do if x == item then return true end end
  return false
end
local function hash(key)
  local flat = redis.call('HGETALL', key)
  local found = {}
  for i = 1, #flat, 2 do found[flat[i]] = flat[i + 1] end
  return found
end
"""

# KEYS: replica, record, members, groups. ARGV: group, broker id, seq, then field/value pairs.
# A heartbeat older than the stored one (overtaken on the way, or duplicated) is not stored:
# the master's withdrawals from the in-sync set rely on it. The answer is always the record.
HEARTBEAT = (
    COMMON
    + """
local now = now_ms()
if tonumber(ARGV[3]) > tonumber(redis.call('HGET', KEYS[1], 'seq') or '-1') then
  redis.call('HSET', KEYS[1], 'seq', ARGV[3], 'at_ms', now, unpack(ARGV, 4))
end
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[1])
return {now, redis.call('HGETALL', KEYS[2])}
"""
)
