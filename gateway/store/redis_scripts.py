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
    "CREATE",
    "DELETE",
    "INCR_WINDOW",
    "RELEASE",
    "RENEW",
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
# ARGV: node, ttl_ms, max_log, first_seq, n_entries, data_1..data_n, history...
# Seqs are first_seq + i: the caller checked they are consecutive, so only the
# bytes travel. The log's last seq comes from XREVRANGE COUNT 1 (O(log N), no
# extra write); a meta ``last_seq`` field would cost an HSET per append and
# could disagree with the stream. Only the last XADD trims: once per call.
APPEND = LuaScript(
    """
local owner = redis.call('GET', KEYS[4])
if owner ~= ARGV[1] then
  return redis.error_reply('LEASELOST ' .. (owner or ''))
end
local n = tonumber(ARGV[5])
if n > 0 then
  local first = tonumber(ARGV[4])
  local last = 0
  local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if top[1] then
    last = tonumber(string.match(top[1][1], '^%d+'))
  end
  if first ~= last + 1 then
    return redis.error_reply('SEQCONFLICT ' .. string.format('%d', last))
  end
  for i = 1, n - 1 do
    redis.call('XADD', KEYS[2], string.format('%d-0', first + i - 1), 'd', ARGV[5 + i])
  end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3],
    string.format('%d-0', first + n - 1), 'd', ARGV[5 + n])
end
local h = 6 + n
while h <= #ARGV do
  local stop = math.min(h + 999, #ARGV)
  redis.call('RPUSH', KEYS[3], unpack(ARGV, h, stop))
  h = stop + 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
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

# KEYS: lease, gone. ARGV: node, ttl_ms. A deleted session (``gone`` set by
# DELETE) cannot be leased again: a node that has not heard of the delete yet
# cannot write the session back (its appends are fenced by the lease).
ACQUIRE = LuaScript(
    """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local owner = redis.call('GET', KEYS[1])
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
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

# KEYS: meta, log, history, lease, gone. ARGV: ttl_ms. Everything of the
# session goes at once, and ``gone`` fences it for ttl_ms (see ACQUIRE).
# Returns how many of meta/log/history existed (0: no such session).
DELETE = LuaScript(
    """
local existed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('DEL', KEYS[4])
redis.call('SET', KEYS[5], '1', 'PX', ARGV[1])
return existed
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
)
