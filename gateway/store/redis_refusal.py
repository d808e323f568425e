"""A Redis that refuses this node for good, told apart from a Redis that is down.

A Redis that is down, restarting or busy answers later: the node waits for it
(``/readyz`` 503, clients 503) and goes on by itself. A wrong password, a
database number past the server's ``databases``, an ACL user without the
commands the store runs, or a port where something else than Redis answers
never get better by waiting: ``refusal`` names the change to make, so a
starting node can stop with that one line instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Final

from redis.exceptions import (
    AuthenticationError,
    InvalidResponse,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = [
    "Unasked",
    "closed_at_once",
    "connection_lost",
    "not_redis",
    "refusal",
    "spoken_first",
    "unasked_words",
]

_HUNG_UP: Final = ("closed by server", "while writing to socket", "while reading from")
_URL: Final = "in --store (GATEWAY_STORE, REDIS_URL): redis://[USER]:PASSWORD@HOST:PORT/DB"


def refusal(exc: BaseException, where: str) -> str | None:
    """What to change when ``exc`` says Redis at ``where`` refuses for good; None when
    a retry may fix it (a refused or timed-out connection, a loading Redis)."""
    text = str(exc).rstrip(".")
    if isinstance(exc, RedisClusterException):  # each node's reason, in its own words
        if "Cluster mode is not enabled" in text:
            return (
                f"Redis at {where} is not a Redis Cluster (cluster-enabled is off): give "
                "--store (GATEWAY_STORE, REDIS_URL) as redis://HOST:PORT/DB for one server"
            )
        if "username-password" in text or "Authentication required" in text:
            return f"Redis at {where} refused the store URL's user or password ({text}): correct it {_URL}"
        return None
    if isinstance(exc, AuthenticationError):
        if "without any password configured" in text:
            return (
                f"Redis at {where} has no password, but the store URL gives one: remove "
                f"the password {_URL}, or set requirepass on that Redis"
            )
        if "required" in text.lower():
            return f"Redis at {where} needs a password: give it {_URL}"
        return (
            f"Redis at {where} refused the store URL's user or password ({text}): correct it {_URL}"
        )
    if isinstance(exc, NoPermissionError):
        return (
            f"Redis at {where} refused the store URL's user: {text}; grant that user every "
            "command on the store's keys (ACL SETUSER … ~rtgw:* +@all), or use another user"
        )
    if isinstance(exc, ResponseError):
        if "DB index is out of range" in text or "invalid DB index" in text:
            return (
                f"Redis at {where} has no such database ({text}): the number after the "
                "last / of the store URL must be below that Redis's `databases` setting "
                "(16 unless redis.conf says otherwise)"
            )
        if text.startswith("DENIED"):
            return f"Redis at {where} refuses this node: {text}"
        return None
    if isinstance(exc, InvalidResponse) or closed_at_once(exc):
        return not_redis(where, text)
    return None


def not_redis(where: str, detail: str) -> str:
    """What to change when something else than Redis answers at ``where``."""
    return (
        f"{where} answers, but not as Redis does ({detail}): is --store (GATEWAY_STORE, "
        "REDIS_URL) pointing at Redis's port (6379 unless redis.conf says otherwise), "
        "does its scheme (redis:// or rediss:// for TLS) match the server's, and is "
        "the Redis behind a proxy there running?"
    )


def unasked_words(said: bytes, where: str) -> str | None:
    """What to change when the port at ``where`` spoke first; None: wait for it.

    Redis itself speaks first to refuse a connection at accept: ``-DENIED`` in
    protected mode (a client from another host, no password set), which no wait
    fixes, and ``-ERR max number of clients reached``, which one may. Its error
    line goes through ``refusal`` as a reply would; anything else is not Redis.
    """
    line = said.split(b"\r\n", 1)[0].decode(errors="replace")
    if line.startswith("-"):  # RESP's error: Redis refusing this connection
        return refusal(ResponseError(line[1:]), where)
    return not_redis(where, f"it spoke first: {said[:40]!r}")


class Unasked(enum.Enum):
    """What a port did before it was asked anything, when it said no word."""

    SILENT = "silent"  # nothing within the wait (Redis, a TLS port, HTTP), or no connection
    CLOSED = "closed"  # hung up without a word
    RESET = "reset"  # reset the connection: a proxy whose Redis is down


async def spoken_first(host: str, port: int, wait: float = 0.25) -> bytes | Unasked:
    """What the server at ``host:port`` says before it is asked anything, in ``wait``
    seconds: its words, or what it did instead (``Unasked``).

    Asked because redis-py words a port that speaks first and hangs up (SSH,
    SMTP, a banner, an HTTP error) as it words a reset: "closed by the server
    before write", "Connection has data", "while writing to socket", depending on
    which packet its pool meets first. A reset is a proxy whose Redis is down, to
    be waited for; words nobody asked for are a service that is not Redis, which
    no wait fixes. Silence says nothing: Redis is silent, and so is HTTP.
    """
    try:
        async with asyncio.timeout(wait):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return await reader.read(1024) or Unasked.CLOSED
            finally:
                writer.close()
    except ConnectionResetError:
        return Unasked.RESET
    except (OSError, TimeoutError):  # refused, unreachable, or quiet as Redis is
        return Unasked.SILENT


def closed_at_once(exc: BaseException) -> bool:
    """The server took the connection, then hung up without a reply: not Redis, or a
    Redis shutting down this moment, or a proxy whose Redis is down (the caller asks
    again for a while before deciding)."""
    # redis-py's words for a connection that was made and then lost; not for a failed
    # connect ("connecting to"), a full server, or Sentinel finding no primary.
    return connection_lost(exc) and any(words in str(exc) for words in _HUNG_UP)


def connection_lost(exc: BaseException) -> bool:
    """redis-py lost the connection or could not make it (not a refused password, a
    timeout or an error reply)."""
    return isinstance(exc, RedisConnectionError) and not isinstance(exc, AuthenticationError)
