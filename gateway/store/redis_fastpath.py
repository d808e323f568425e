"""The append hot path's shortcuts past redis-py, isolated and measured.

1. ``pack_append``: the append's ``EVALSHA`` packed as RESP bytes once, in
   ``append``, instead of by redis-py's generic ``pack_commands`` at flush
   time (which encodes every argument through its ``Encoder``).
2. ``reply_lines``: the replies read in bulk from the connection's private
   ``_reader`` (an ``asyncio.StreamReader``) and split into lines, instead of
   one ``read_response`` (one parser call and await) per reply. The append
   script only answers ``:1`` or one error line, ``WAIT`` an integer, and a
   bare ``XADD`` (``pack_xadd``) its ID as a bulk string, joined into one
   line (``join_bulk``), so a reply is a line. Safe because the connection is the group commit's for
   the round trip and idle before it (RESP2, no push messages).
3. ``take_transport``: a connected connection's transport, which
   ``gateway.store.redis_pipe`` then reads with a protocol of its own (the log
   writer's rounds answered from ``data_received``, no await per round).

Measured with ``tests/bench/store_bench.py`` (1,000 sessions each appending one
60-byte event as fast as the store answers, one local redis-server 7.0, redis-py
8.1, Python 3.11, a 2-core machine shared with other jobs; median of 5 runs of
3 s; client CPU per append is the steadier figure, appends/s moves with the
machine's load):

=================================================  ==============  ==========
path                                               client CPU/app  appends/s
=================================================  ==============  ==========
redis-py ``pack_commands`` + ``read_response``         33.6 µs       25,300
``pack_append`` + ``read_response``                    14.5 µs       32,300
``pack_append`` + ``reply_lines`` (what runs)          10.4 µs       33,900
=================================================  ==============  ==========

(Before this module, with the same two shortcuts inline: 12.1 µs, 53,700/s
on a quieter machine.) So redis-py's generic packer costs about 2x the whole
append's client CPU, and its parser 40 % more than bulk reads.

Everything else in the store uses only public API. The group commit falls
back to ``read_response`` by itself when a connection has no ``_reader``
stream (``fast_replies``), and ``tests/store/test_redis_fastpath.py`` fails
loudly if redis-py changes what these shortcuts rely on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Final, cast

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.store.redis_scripts import APPEND, ROUND
from gateway.store.redis_seqmemo import TRUST

__all__ = [
    "APPEND_HEAD",
    "bare_entry",
    "bulk",
    "closed_by_server",
    "fast_replies",
    "join_bulk",
    "pack_append",
    "pack_append_at",
    "pack_round",
    "pack_xadd",
    "reply_lines",
    "take_transport",
    "with_check",
]


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


APPEND_HEAD: Final = bulk(b"EVALSHA") + bulk(APPEND.sha.encode()) + bulk(b"4")
"""``EVALSHA <sha> 4``: the constant start of every packed append."""


def pack_append(
    key: bytes,
    node: bytes,
    limits: bytes,
    first: int,
    entries: Sequence[bytes],
    history: Sequence[bytes],
    check: bytes,
) -> bytes:
    """``EVALSHA APPEND 4 {key}meta {key}log {key}history {key}lease node limits first n check …``.

    ``key`` is the session's key prefix (``rtgw:{SID}:``), ``limits`` the
    packed ``ttl_ms`` and ``max_log`` (constant per store, packed once),
    ``check`` the packed flag (``gateway.store.redis_seqmemo``).
    """
    first_b = b"%d" % first
    n_b = b"%d" % len(entries)
    parts = [
        b"*%d\r\n" % (13 + len(entries) + len(history)),
        APPEND_HEAD,
        b"$%d\r\n%bmeta\r\n" % (len(key) + 4, key),
        b"$%d\r\n%blog\r\n" % (len(key) + 3, key),
        b"$%d\r\n%bhistory\r\n" % (len(key) + 7, key),
        b"$%d\r\n%blease\r\n" % (len(key) + 5, key),
        b"$%d\r\n%b\r\n" % (len(node), node),
        limits,
        b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(first_b), first_b, len(n_b), n_b),
        check,
    ]
    for data in entries:
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    for item in history:
        parts.append(b"$%d\r\n%b\r\n" % (len(item), item))
    return b"".join(parts)


XADD_HEAD: Final = b"*9\r\n" + bulk(b"XADD")
XADD_OPTIONS: Final = bulk(b"NOMKSTREAM") + bulk(b"MAXLEN") + bulk(b"~")


def pack_xadd(key: bytes, max_log: bytes, seq: int, data: bytes) -> bytes:
    """``XADD {key}log NOMKSTREAM MAXLEN ~ max_log <seq>-0 d data``: a bare append.

    No script and no lease read: the fence is in the log (``redis_scripts.ACQUIRE``).
    ``NOMKSTREAM``: a deleted session's log is not made again (the reply is nil).
    """
    entry_id = b"%d-0" % seq
    return b"".join(
        (
            XADD_HEAD,
            b"$%d\r\n%blog\r\n" % (len(key) + 3, key),
            XADD_OPTIONS,
            max_log,
            b"$%d\r\n%b\r\n$1\r\nd\r\n$%d\r\n%b\r\n" % (len(entry_id), entry_id, len(data), data),
        )
    )


def bare_entry(
    check: bytes, entries: Sequence[tuple[int, bytes]], history: Sequence[bytes]
) -> bytes | None:
    """The one entry's data when an append goes as a bare XADD (``pack_xadd``): one
    event, no history item, where the log's end is known (``check`` is ``TRUST``)."""
    if check is TRUST and len(entries) == 1 and not history:
        return entries[0][1]
    return None


def pack_append_at(
    key: bytes,
    node: bytes,
    limits: bytes,
    first: int,
    entries: Sequence[bytes],
    history: Sequence[bytes],
    check: bytes,
) -> tuple[bytes, int]:
    """``pack_append``, and where in it the ``check`` flag starts (``with_check``)."""
    command = pack_append(key, node, limits, first, entries, history, check)
    tail = len(check)
    for data in (*entries, *history):
        tail += len(b"$%d\r\n" % len(data)) + len(data) + 2
    return command, len(command) - tail


def with_check(command: bytes, at: int, check: bytes) -> bytes:
    """A packed append with its ``check`` flag (at ``at``, ``pack_append_at``) replaced."""
    return command[:at] + check + command[at + len(check) :]


ROUND_HEAD: Final = bulk(b"EVALSHA") + bulk(ROUND.sha.encode())
"""``EVALSHA <sha>``: the constant start of every packed round (``pack_round``)."""

# One session's part of a round: key prefix, first seq, entries, history, check.
RoundPart = tuple[bytes, int, Sequence[bytes], Sequence[bytes], bytes]


def pack_round(node: bytes, limits: bytes, parts: Sequence[RoundPart]) -> bytes:
    """``EVALSHA ROUND 4S {key}meta {key}log {key}history {key}lease … node limits …``.

    The appends of several sessions as one call of the ``ROUND`` script (one
    server only: their keys are in different slots).
    """
    keys: list[bytes] = []
    args: list[bytes] = [b"$%d\r\n%b\r\n" % (len(node), node), limits]
    count = 3 + 4 * len(parts) + 3
    for key, first, entries, history, check in parts:
        keys.append(
            b"$%d\r\n%bmeta\r\n$%d\r\n%blog\r\n$%d\r\n%bhistory\r\n$%d\r\n%blease\r\n"
            % (len(key) + 4, key, len(key) + 3, key, len(key) + 7, key, len(key) + 5, key)
        )
        first_b, n_b, h_b = b"%d" % first, b"%d" % len(entries), b"%d" % len(history)
        args.append(
            b"$%d\r\n%b\r\n$%d\r\n%b\r\n%b$%d\r\n%b\r\n"
            % (len(first_b), first_b, len(n_b), n_b, check, len(h_b), h_b)
        )
        for data in entries:
            args.append(b"$%d\r\n%b\r\n" % (len(data), data))
        for item in history:
            args.append(b"$%d\r\n%b\r\n" % (len(item), item))
        count += 4 + len(entries) + len(history)
    nkeys = b"%d" % (4 * len(parts))
    return b"".join([b"*%d\r\n" % count, ROUND_HEAD, bulk(nkeys), *keys, *args])


def fast_replies(conn: AbstractConnection) -> bool:
    """Whether ``reply_lines`` can read this (connected) connection's replies."""
    return isinstance(getattr(conn, "_reader", None), asyncio.StreamReader)


def closed_by_server(conn: AbstractConnection) -> bool:
    """Whether Redis closed this idle connection (a restart): reconnect before sending.

    Without it a flush would be sent on a dead socket and fail as "maybe
    stored"; redis-py's pool checks this on checkout, but the group commit
    keeps its connection (see ``Route``).
    """
    reader = getattr(conn, "_reader", None)
    return isinstance(reader, asyncio.StreamReader) and reader.at_eof()


async def reply_lines(conn: AbstractConnection, count: int) -> AsyncIterator[list[bytes]]:
    """The next ``count`` replies (``:1``, ``-ERR …``), read in bulk; see the module.

    Each is one line; a bulk reply (a bare XADD's ID) is handed on as ``$`` and
    its value (``$-1``: nil), as ``join_bulk`` makes it.
    """
    reader: asyncio.StreamReader = getattr(conn, "_reader")  # noqa: B009 - the measured shortcut
    rest = b""
    while count > 0:
        chunk = await reader.read(65536)
        if not chunk:
            raise RedisConnectionError("Redis closed the connection")
        buffer = rest + chunk
        *lines, rest = buffer.split(b"\r\n")
        if b"$" in buffer:
            lines, header = join_bulk(lines)
            rest = header + rest
        count -= len(lines)
        if count < 0:
            raise RedisConnectionError("more replies than commands: protocol out of sync")
        if lines:
            yield lines


def join_bulk(lines: list[bytes]) -> tuple[list[bytes], bytes]:
    """Each bulk reply (``$N``, then its value) of ``lines`` as one line, ``$`` + the
    value; and a last header whose value has not arrived, to read again (``b""``: none)."""
    out: list[bytes] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if line.startswith(b"$") and line != b"$-1":
            if i + 1 == n:
                return out, line + b"\r\n"
            out.append(b"$" + lines[i + 1])
            i += 2
            continue
        out.append(line)
        i += 1
    return out, b""


def take_transport(conn: AbstractConnection) -> asyncio.Transport | None:
    """The connected ``conn``'s transport, for a protocol of our own (``redis_pipe``).

    redis-py reads through an ``asyncio.StreamReader`` fed by the transport;
    once the caller sets another protocol on it, ``conn`` must not be used again.
    None: a connection that does not read through a stream transport.
    """
    writer = getattr(conn, "_writer", None)
    if not isinstance(writer, asyncio.StreamWriter) or not fast_replies(conn):
        return None
    transport = writer.transport
    # uvloop's transports are not asyncio.Transport subclasses: check what is used.
    if all(callable(getattr(transport, name, None)) for name in ("set_protocol", "write", "abort")):
        return cast(asyncio.Transport, transport)
    return None
