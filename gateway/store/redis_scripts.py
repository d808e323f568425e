"""The Lua scripts of ``RedisStore``: every check-then-write step, atomic on the server.

Kept apart from the I/O (``gateway.store.redis``) so the data rules can be read
in one place. Each script touches only keys of one hash slot (a session's keys
share the hash tag ``{SID}``; the other scripts take one key), so they run
unchanged on one Redis and on a Redis Cluster.

The SHA1 of each script is computed here, locally: calling by SHA needs no
round trip to learn it.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = [
    "ACQUIRE",
    "APPEND",
    "CONFIRM",
    "CREATE",
    "DELETE",
    "HOLD_BYTES",
    "INCR_WINDOW",
    "KEEP",
    "READ_PAGE",
    "RECORD",
    "RELEASE",
    "RELEASE_BYTES",
    "RENEW",
    "ROUND",
    "SCRIPTS",
    "SET_META",
    "SLOT_ACQUIRE",
    "SLOT_RENEW",
    "LuaScript",
]


class LuaScript:
    """A Lua script and its SHA1, computed locally: no round trip to learn it."""

    __slots__ = ("sha", "src")

    def __init__(self, src: str) -> None:
        self.src = src
        self.sha = hashlib.sha1(src.encode()).hexdigest()


# KEYS: meta, log, history, lease.
# ARGV: node, ttl_ms, max_log, first_seq, n_entries, check, data_1..data_n, history...
# Seqs are first_seq + i: the caller checked they are consecutive, so only the
# bytes travel; each entry's stream id is its seq (``seq-0``; ``seq-1`` when
# ``check`` is "1", which passes a fence: see ACQUIRE), so XADD itself refuses
# a seq at or below the log's last (a duplicate, an overlap, another writer's
# race): nothing is read for that. Only the last XADD trims: once per call.
#
# ``check`` "1": the log's last seq is read (XREVRANGE COUNT 1) and must be
# first_seq - 1 (a gap is refused too), and the idle TTL of the three keys is
# restarted. "0": the caller knows the log ended at first_seq - 1 a moment ago
# (its own last append of this session, answered ``1``, within the TTL's
# refresh period: ``gateway.store.redis_seqmemo``); the log cannot have shrunk
# since (trimming keeps its last entry, expiry is further away than that
# period), so only a longer log can make it wrong, and XADD refuses that. The
# lease is checked on every call, whatever ``check`` says: that is the fence.
# Measured in Redis's own count: 5 commands per append before (EVALSHA, GET,
# XREVRANGE, XADD, PTTL), 3 with "0" (tests/bench/store_bench.py).
APPEND = LuaScript(
    """
local owner = redis.call('GET', KEYS[4])
if owner ~= ARGV[1] then
  return redis.error_reply('LEASELOST ' .. (owner or ''))
end
local n = tonumber(ARGV[5])
local check = ARGV[6] == '1'
local first = tonumber(ARGV[4])
if check then
  local last = 0
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then
    last = tonumber(string.match(top[1][1], '^%d+'))
  end
  if n > 0 and first ~= last + 1 then
    return redis.error_reply('SEQCONFLICT ' .. string.format('%d', last))
  end
end
if n > 0 then
  local ok
  local id = check and '%d-1' or '%d-0'
  if n == 1 then
    ok = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3],
      string.format(id, first), 'd', ARGV[7])
  else
    ok = redis.pcall('XADD', KEYS[2], string.format(id, first), 'd', ARGV[7])
  end
  if type(ok) == 'table' and ok.err then
    if not string.find(ok.err, 'smaller', 1, true) then
      return ok
    end
    local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
    local last = 0
    if top[1] then
      last = tonumber(string.match(top[1][1], '^%d+'))
    end
    return redis.error_reply('SEQCONFLICT ' .. string.format('%d', last))
  end
  for i = 2, n - 1 do
    redis.call('XADD', KEYS[2], string.format(id, first + i - 1), 'd', ARGV[6 + i])
  end
  if n > 1 then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3],
      string.format(id, first + n - 1), 'd', ARGV[6 + n])
  end
end
local h = 7 + n
local ttl = tonumber(ARGV[2])
if h <= #ARGV then
  while h <= #ARGV do
    local stop = math.min(h + 999, #ARGV)
    redis.call('RPUSH', KEYS[3], unpack(ARGV, h, stop))
    h = stop + 1
  end
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if check then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
"""
)

# A log writer's round on one server (``gateway.store.redis_rounds``): the
# appends of many sessions in one call, each as APPEND would make it, and
# every lease read by one MGET. KEYS: meta, log, history, lease of each
# session. ARGV: node, ttl_ms, max_log, then per session: first_seq, n_entries,
# check, n_history, data_1..data_n, history_1..history_m. Redis's own count
# for a round of N one-event sessions: N + 2 commands (EVALSHA, MGET, N XADDs),
# against 3N as N APPEND calls. Only for one server: a Cluster refuses keys of
# several slots in one script (there each session takes APPEND).
# Each session's writes are made with pcall, so one session's failure is its
# own. Returns a status line, each session's outcome joined by '|': '1', or
# the error APPEND would have answered ('LEASELOST …', 'SEQCONFLICT …', …).
ROUND = LuaScript(
    """
local node = ARGV[1]
local ttl = tonumber(ARGV[2])
local leases = {}
for i = 4, #KEYS, 4 do
  leases[#leases + 1] = KEYS[i]
end
local owners = redis.call('MGET', unpack(leases))
local function last_of(log)
  local top = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
  if top[1] then
    return tonumber(string.match(top[1][1], '^%d+'))
  end
  return 0
end
local function conflict(log)
  return 'SEQCONFLICT ' .. string.format('%d', last_of(log))
end
local function failed(reply)
  return (string.gsub(reply.err, '|', '/'))
end
local function one(k, a)
  local first = tonumber(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  local check = ARGV[a + 2] == '1'
  local d = a + 4
  local h = d + n
  local stop = h + tonumber(ARGV[a + 3]) - 1
  if check and n > 0 and first ~= last_of(KEYS[k + 2]) + 1 then
    return conflict(KEYS[k + 2])
  end
  local sub = check and '%d-1' or '%d-0'
  for i = 0, n - 1 do
    local id = string.format(sub, first + i)
    local ok
    if i == n - 1 then
      ok = redis.pcall('XADD', KEYS[k + 2], 'MAXLEN', '~', ARGV[3], id, 'd', ARGV[d + i])
    else
      ok = redis.pcall('XADD', KEYS[k + 2], id, 'd', ARGV[d + i])
    end
    if type(ok) == 'table' and ok.err then
      if i == 0 and string.find(ok.err, 'smaller', 1, true) then
        return conflict(KEYS[k + 2])
      end
      return failed(ok)
    end
  end
  while h <= stop do
    local last = math.min(h + 999, stop)
    local ok = redis.pcall('RPUSH', KEYS[k + 3], unpack(ARGV, h, last))
    if type(ok) == 'table' and ok.err then
      return failed(ok)
    end
    h = last + 1
  end
  if tonumber(ARGV[a + 3]) > 0 then
    redis.call('PEXPIRE', KEYS[k + 3], ttl)
  end
  if check then
    redis.call('PEXPIRE', KEYS[k + 1], ttl)
    redis.call('PEXPIRE', KEYS[k + 2], ttl)
    redis.call('PEXPIRE', KEYS[k + 3], ttl)
  end
  return '1'
end
local out = {}
local a = 4
for s = 1, #owners do
  local next_a = a + 4 + tonumber(ARGV[a + 1]) + tonumber(ARGV[a + 3])
  if owners[s] ~= node then
    out[s] = 'LEASELOST ' .. (owners[s] or '')
  else
    out[s] = one((s - 1) * 4, a)
  end
  a = next_a
end
return {ok = table.concat(out, '|')}
"""
)

# KEYS: meta, log, history. ARGV: ttl_ms, field, value, ...
CREATE = LuaScript(
    """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return 1
"""
)

# KEYS: meta, log, history. ARGV: ttl_ms. The log's last seq, and a write that
# replicas must apply after every earlier write of the session (the idle TTL
# restarted, as an append restarts it): a ``WAIT`` sent after this on the same
# connection confirms that a replica has the whole log up to that seq. A
# script that only read would give ``WAIT`` nothing to wait for.
CONFIRM = LuaScript(
    """
local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if not top[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return tonumber(string.match(top[1][1], '^%d+'))
"""
)

# Same keys and args as CREATE; only touches a session that exists, so a late
# write cannot resurrect an expired session as a partial meta hash.
SET_META = LuaScript(
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return 1
"""
)

# KEYS: lease, gone, log. ARGV: node, ttl_ms. A deleted session (``gone`` set by
# DELETE) cannot be leased again: a node that has not heard of the delete yet
# cannot write the session back (its appends are fenced by the lease).
#
# Taking a lease nobody holds also fences the log (the fence in the log, see
# ``gateway.store.redis_rounds``): the stream's last ID is set to
# ``<top + 1>-0``. A node's unchecked append (a bare XADD, no lease read) is
# always ``<seq>-0`` with seq just past its own last append, which is at most
# the log's top: Redis refuses it from here on (an ID at or below the last),
# so a node that lost its lease while it was paused or cut off cannot write
# after the next owner took the session. The new owner's first append reads
# the log's end and the lease (``check`` "1") and writes ``<seq>-1``, past the
# fence. A fence is never lowered: the next is computed from a top at least as high.
ACQUIRE = LuaScript(
    """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local owner = redis.call('GET', KEYS[1])
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local top = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if top[1] then
    local seq = tonumber(string.match(top[1][1], '^%d+'))
    redis.call('XSETID', KEYS[3], string.format('%d-0', seq + 1))
  end
  return 1
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

RENEW = LuaScript(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
)

# The lease keeper's renewals on one server (``keep_leases``). KEYS: leases.
# ARGV: node, ttl_ms. One MGET, then a PEXPIRE per lease still this node's:
# 1 command per session per renewal (+ 2 per call of up to 500), against 4
# for ACQUIRE (EVALSHA, EXISTS, GET, PEXPIRE). Per lease: 1 renewed, 0 held
# by another node, -1 held by nobody (the caller takes it back with ACQUIRE,
# which checks that the session was not deleted). One server only: the
# leases of a call are in many slots.
KEEP = LuaScript(
    """
local owners = redis.call('MGET', unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  if owners[i] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    out[i] = 1
  elseif owners[i] then
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
"""
)

# KEYS: lease. ARGV: node.
RELEASE = LuaScript(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
)

# KEYS: meta, log, history, lease, gone, rec. ARGV: ttl_ms. Everything of the
# session goes at once, its recording too, and ``gone`` fences it for ttl_ms
# (see ACQUIRE). Returns how many of meta/log/history existed (0: no such session).
DELETE = LuaScript(
    """
local existed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('DEL', KEYS[4], KEYS[6])
redis.call('SET', KEYS[5], '1', 'PX', ARGV[1])
return existed
"""
)

# KEYS: meta, rec. ARGV: ttl_ms, limit, lines, cut. A session's recording
# (gateway.store.redis_recordings): written only while the session's meta
# exists (a deleted or expired session is not written back), cut once at
# ``limit`` bytes: the whole lines of the write that fit before it, then the
# ``cut`` line (the recording ends at most ``limit`` bytes long, cut line
# included), and the meta's ``recording`` says so: nothing is written after it,
# whichever node writes; it is ``on`` from the first write. The kept lines end
# at the last newline within the room (found on the reversed room: one pass).
# Each write restarts its idle TTL.
# Returns its size, -1 (no session) or -2 (cut).
RECORD = LuaScript(
    """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local size = redis.call('STRLEN', KEYS[2])
if redis.call('HGET', KEYS[1], 'recording') == 'cut' then
  if size > 0 then
    redis.call('PEXPIRE', KEYS[2], ARGV[1])
  end
  return -2
end
if size + string.len(ARGV[3]) > tonumber(ARGV[2]) then
  local room = tonumber(ARGV[2]) - size - string.len(ARGV[4])
  if room > 0 then
    local head = string.sub(ARGV[3], 1, room)
    local back = string.find(string.reverse(head), '\\n', 1, true)
    if back then
      redis.call('APPEND', KEYS[2], string.sub(head, 1, string.len(head) - back + 1))
    end
  end
  redis.call('APPEND', KEYS[2], ARGV[4])
  redis.call('HSET', KEYS[1], 'recording', 'cut')
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  return -2
end
if string.len(ARGV[3]) > 0 then
  if size == 0 then
    redis.call('HSET', KEYS[1], 'recording', 'on')
  end
  size = redis.call('APPEND', KEYS[2], ARGV[3])
end
if size > 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
return size
"""
)

# Limits (gateway.sessions.limits). KEYS: counter. ARGV: amount, ttl_ms. The TTL is set
# once, when the window's counter is created: adding never extends a window.
INCR_WINDOW = LuaScript(
    """
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return v
"""
)

# KEYS: slots (sorted set member → deadline in ms of the server's clock, so
# nodes with skewed clocks agree). ARGV: member, limit, ttl_ms. Expired members
# (a dead node's connections) are dropped before counting.
SLOT_ACQUIRE = LuaScript(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
if limit > 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: slots. ARGV: ttl_ms, member... Only members still live are extended.
SLOT_RENEW = LuaScript(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
"""
)

# KEYS: log. ARGV: first seq to read, limit, max_bytes. The log entries from
# that seq on, up to ``limit`` of them and no more than fit in ``max_bytes`` of
# data (the first always comes, whatever its size). Read in batches sized by
# the largest entry seen so far, starting with one, so neither this script nor
# the reply holds much more than the page: a plain XRANGE COUNT 500 over
# ~1 MB events once made a 500 MB reply.
READ_PAGE = LuaScript(
    """
local seq = tonumber(ARGV[1])
local left = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local out = {}
local bytes = 0
local biggest = 1
local count = 1
while left > 0 and bytes < cap do
  local got = redis.call('XRANGE', KEYS[1], string.format('%d-0', seq), '+',
    'COUNT', math.min(count, left))
  if #got == 0 then
    break
  end
  for i = 1, #got do
    local size = string.len(got[i][2][2])
    if #out > 0 and bytes + size > cap then
      return out
    end
    out[#out + 1] = got[i]
    bytes = bytes + size
    left = left - 1
    if size > biggest then
      biggest = size
    end
  end
  seq = tonumber(string.match(got[#got][1], '^%d+')) + 1
  count = math.max(1, math.min(64, math.floor((cap - bytes) / biggest)))
end
return out
"""
)

# Byte quotas (the configurations a key's sessions store). KEYS: deadlines
# (sorted set member → deadline, ms of the server's clock), sizes (hash member
# → bytes), total (the live members' sum, kept so a call never adds them all
# up). ARGV: member, size, limit, ttl_ms. Expired members are taken out first,
# at most 1000 a call (a call never runs long; until the rest go, the total
# counts them, which only errs towards refusing). Returns {held 0/1, total}.
HOLD_BYTES = LuaScript(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1000)
for i = 1, #expired do
  total = total - tonumber(redis.call('HGET', KEYS[2], expired[i]) or '0')
  redis.call('HDEL', KEYS[2], expired[i])
  redis.call('ZREM', KEYS[1], expired[i])
end
local size = tonumber(ARGV[2])
local after = total - tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') + size
local limit = tonumber(ARGV[3])
if limit > 0 and after > limit then
  if #expired > 0 then
    redis.call('SET', KEYS[3], total, 'KEEPTTL')
  end
  return {0, total}
end
redis.call('HSET', KEYS[2], ARGV[1], size)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
redis.call('SET', KEYS[3], after)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
for i = 1, 3 do
  redis.call('PEXPIREAT', KEYS[i], last[2])
end
return {1, after}
"""
)

# KEYS: as HOLD_BYTES. ARGV: member.
RELEASE_BYTES = LuaScript(
    """
local size = redis.call('HGET', KEYS[2], ARGV[1])
if size then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DECRBY', KEYS[3], size)
end
return 1
"""
)

SCRIPTS: Final = (
    APPEND,
    CREATE,
    SET_META,
    DELETE,
    ACQUIRE,
    RENEW,
    RELEASE,
    INCR_WINDOW,
    SLOT_ACQUIRE,
    SLOT_RENEW,
    READ_PAGE,
    HOLD_BYTES,
    RELEASE_BYTES,
    CONFIRM,
    RECORD,
    ROUND,
    KEEP,
)
