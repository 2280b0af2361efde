"""The controller's Lua scripts: every write to a group record is one of these, so the checks
and the write are one atomic step in Redis.

Each write script first checks the leader lease (its value must be the writer's
"<holder> <token>": a deposed controller's late write is refused) and the record version the
decision was made on, then what makes the write safe (see ``ELECT``), then writes the record
with version + 1 and appends what changed to the ``group-changes`` stream. They answer
``{1, "", <record as flat hash>}`` or ``{0, <reason>}``; the reasons are those of
controller/actions.py, and controller/sim/store.py models every check in the same order
(tests/controller/test_scripts_contract.py compares the two).

Keys of the group's brokers are built inside the scripts from a prefix passed in ARGV (the
record names the master only once read), as meta's LIST_SCRIPT does.
"""

from __future__ import annotations

from controller.actions import (
    BAD_FENCE,
    NOT_ASKED,
    NOT_IN_SYNC,
    NOT_LEADER,
    NOT_SILENT,
    STALE,
)
from meta.groups.scripts import COMMON as _COMMON

# KEYS: lease, record, changes stream, groups set. ARGV: holder ("<name> <token>"), token,
# expected version, stream max length, group, then the script's own arguments from ARGV[6].
# The group joins the groups set so the controller reads its record back (a group known
# from the broker registry only has none before its first write).
_WRITE_PRELUDE = (
    _COMMON
    + f"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {{0, '{NOT_LEADER}'}} end
if num(KEYS[2], 'version') ~= tonumber(ARGV[3]) then return {{0, '{STALE}'}} end
local now = now_ms()
local version = num(KEYS[2], 'version') + 1
local epoch = num(KEYS[2], 'epoch')
local master = str(KEYS[2], 'master')
local function written(...)
  redis.call('HSET', KEYS[2], 'version', version, 'token', ARGV[2], 'changed_ms', now, ...)
  redis.call('SADD', KEYS[4], ARGV[5])
end
local function publish(kind, ...)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'kind', kind, 'group', ARGV[5],
             'version', version, ...)
end
local function answer() return {{1, '', redis.call('HGETALL', KEYS[2])}} end
"""
)

# ARGV[6..]: new master, in_sync JSON, min epoch, silence ms, unclean "1"/"0", reason,
# replica key prefix. The old master cannot be confirming when: its stored heartbeat says
# it resigned from this epoch (it restarted), or it obeys the current fence (switchover), or
# Redis has stored nothing from it for the election silence (it stopped by its own clock
# safety_margin_ms before). A group's first election has no old master.
ELECT = (
    _WRITE_PRELUDE
    + f"""
if master ~= '' then
  local old = ARGV[12] .. master
  local stopped = num(old, 'resigned_epoch') >= epoch and redis.call('EXISTS', old) == 1
  local fence = str(KEYS[2], 'fence')
  if fence ~= '' and num(old, 'epoch') == epoch
     and num(old, 'fenced_version') == num(KEYS[2], 'fence_version') then
    stopped = true
  end
  if not stopped and now - num(old, 'at_ms') < tonumber(ARGV[9]) then
    return {{0, '{NOT_SILENT}'}}
  end
  if ARGV[10] ~= '1' and not contains(cjson.decode(str(KEYS[2], 'in_sync')), ARGV[6]) then
    return {{0, '{NOT_IN_SYNC}'}}
  end
end
local new_epoch = math.max(epoch + 1, tonumber(ARGV[8]))
written('epoch', new_epoch, 'master', ARGV[6], 'in_sync', ARGV[7], 'fence', '',
        'fence_version', 0)
publish('group.master', 'epoch', new_epoch, 'master', ARGV[6], 'in_sync', ARGV[7],
        'previous', master, 'reason', ARGV[11])
return answer()
"""
)

# ARGV[6..]: epoch, in_sync JSON, added JSON, reason, replica key prefix. Added replicas must
# still be asked for by the master's stored heartbeat: it counts them for confirms from
# before it asks until a heartbeat without them is stored (meta/groups/contract.py).
SET_IN_SYNC = (
    _WRITE_PRELUDE
    + f"""
local in_sync = cjson.decode(ARGV[7])
if epoch ~= tonumber(ARGV[6]) or not contains(in_sync, master) then
  return {{0, '{STALE}'}}
end
local added = cjson.decode(ARGV[8])
if #added > 0 then
  local replica = ARGV[10] .. master
  if str(replica, 'role') ~= 'master' or num(replica, 'epoch') ~= epoch then
    return {{0, '{NOT_ASKED}'}}
  end
  local asked = cjson.decode(redis.call('HGET', replica, 'caught_up') or '[]')
  for _, id in ipairs(added) do
    if not contains(asked, id) then return {{0, '{NOT_ASKED}'}} end
  end
end
written('in_sync', ARGV[7])
publish('group.in_sync', 'epoch', epoch, 'master', master, 'in_sync', ARGV[7],
        'reason', ARGV[9])
return answer()
"""
)

# KEYS[5]: the switchover request, consumed. ARGV[6..]: epoch, target, request id, rescue
# "1"/"0" (a rescue's target may be outside the in-sync set).
STOP_CONFIRMING = (
    _WRITE_PRELUDE
    + f"""
if epoch ~= tonumber(ARGV[6]) or str(KEYS[2], 'fence') ~= '' then
  return {{0, '{BAD_FENCE}'}}
end
if ARGV[7] == master
   or (ARGV[9] ~= '1' and not contains(cjson.decode(str(KEYS[2], 'in_sync')), ARGV[7])) then
  return {{0, '{NOT_IN_SYNC}'}}
end
written('fence', ARGV[7], 'fence_version', version)
redis.call('DEL', KEYS[5])
publish('group.fence', 'epoch', epoch, 'master', master, 'fence', ARGV[7],
        'request', ARGV[8])
return answer()
"""
)

# ARGV[6..]: epoch, reason.
RESUME_CONFIRMING = (
    _WRITE_PRELUDE
    + f"""
if epoch ~= tonumber(ARGV[6]) or str(KEYS[2], 'fence') == '' then
  return {{0, '{BAD_FENCE}'}}
end
written('fence', '', 'fence_version', 0)
publish('group.fence', 'epoch', epoch, 'master', master, 'fence', '', 'reason', ARGV[7])
return answer()
"""
)

# ARGV[6]: down JSON. For operators; brokers and gateways do not act on it.
MARK_DOWN = (
    _WRITE_PRELUDE
    + """
version = version + tonumber(ARGV[7])
written('down', ARGV[6])
return answer()
"""
)

# KEYS: lease, changes stream. ARGV: holder, max length, group, broker, its epoch, epoch.
DEMOTE = f"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {{0, '{NOT_LEADER}'}} end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', 'group.demote',
           'group', ARGV[3], 'broker', ARGV[4], 'stale_epoch', ARGV[5], 'epoch', ARGV[6])
return {{1, ''}}
"""

# KEYS: lease, token counter. ARGV: holder name, ttl ms. Answers {token, expires ms, holder}:
# token 0 when another holds it. Holding it again extends it with the same token.
HOLD_LEASE = (
    _COMMON
    + """
local now = now_ms()
local held = redis.call('GET', KEYS[1])
if held then
  local name, token = string.match(held, '^(.*) (%d+)$')
  if name ~= ARGV[1] then return {0, now + redis.call('PTTL', KEYS[1]), name} end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {tonumber(token), now + tonumber(ARGV[2]), name}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
return {token, now + tonumber(ARGV[2]), ARGV[1]}
"""
)

# KEYS: lease. ARGV: holder name.
DROP_LEASE = """
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(.*) %d+$') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

# KEYS: lease, groups, registry. ARGV: key prefix, registry lease prefix. One atomic read of
# everything the controller decides on, as JSON (cjson).
READ_STATE = (
    _COMMON
    + """
local function quote(s)
  return (string.gsub(s, '[^%w%-%._~]', function(c) return string.format('%%%02X', c:byte()) end))
end
local state = {now = now_ms(), lease = redis.call('GET', KEYS[1]) or '', groups = {},
               registry = {}}
for _, group in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local q = quote(group)
  local replicas = {}
  for _, id in ipairs(redis.call('SMEMBERS', ARGV[1] .. 'group-members:' .. q)) do
    replicas[id] = hash(ARGV[1] .. 'replica:' .. q .. ':' .. id)
  end
  state.groups[group] = {record = hash(ARGV[1] .. 'group:' .. q), replicas = replicas,
                         switchover = redis.call('GET', ARGV[1] .. 'switchover:' .. q) or ''}
end
local flat = redis.call('HGETALL', KEYS[3])
for i = 1, #flat, 2 do
  local key = cjson.decode(flat[i])
  local alive = redis.call('EXISTS', ARGV[2] .. quote(key[1]) .. ':' .. key[2])
  table.insert(state.registry, {key[1], key[2], alive})
end
return cjson.encode(state)
"""
)
