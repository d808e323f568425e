"""Which Redis errors a starting node stops on (``gateway.store.redis_refusal``): only
those no wait can fix. A Redis that is down, loading, full or failing over is waited for."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import pytest
import redis
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    InvalidResponse,
    MaxClientsReachedError,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.redis import RedisStore
from gateway.store.redis_refusal import refusal
from tests.support.not_redis import ASKED, PROTECTED, RESET, NotRedis
from tests.support.redis_server import RedisServer

WHERE = "127.0.0.1:6379"


@pytest.mark.parametrize(
    "exc",
    [
        RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        RedisTimeoutError("Timeout connecting to server"),
        BusyLoadingError("Redis is loading the dataset in memory"),
        MaxClientsReachedError("max number of clients reached"),
        MasterNotFoundError("No master found for 'mymaster'"),
        ResponseError("READONLY You can't write against a read only replica."),
        RedisClusterException(
            "Redis Cluster cannot be connected. Please provide at least one reachable node: "
            "Error 111 connecting to 127.0.0.1:7000. Connection refused."
        ),
    ],
)
def test_what_waiting_may_fix_is_not_a_refusal(exc: Exception) -> None:
    assert refusal(exc, WHERE) is None


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (AuthenticationError("Authentication required."), "needs a password"),
        (AuthenticationError("invalid username-password pair or user is disabled."), "correct it"),
        (
            AuthenticationError("AUTH <password> called without any password configured"),
            "has no password",
        ),
        (NoPermissionError("this user has no permissions to run the 'eval' command"), "ACL"),
        (ResponseError("DB index is out of range"), "`databases`"),
        (InvalidResponse("Protocol Error: b'SSH-2.0-OpenSSH_9.6'"), "not as Redis does"),
        (RedisConnectionError("Connection closed by server."), "not as Redis does"),
        (
            RedisClusterException("… reachable node: Cluster mode is not enabled on this node"),
            "is not a Redis Cluster",
        ),
        (
            RedisClusterException("… reachable node: invalid username-password pair"),
            "refused the store URL's user or password",
        ),
    ],
)
def test_what_waiting_cannot_fix_says_what_to_change(exc: Exception, says: str) -> None:
    line = refusal(exc, WHERE)
    assert line is not None and says in line and "\n" not in line


# The words redis-py has for a server that hung up, whichever packet its pool met first:
# they do not tell a banner-and-close from a reset, so the store asks the port itself.
AMBIGUOUS = [
    RedisConnectionError("Connection closed by the server before write"),
    RedisConnectionError("Connection has data"),
    RedisConnectionError("Error 104 while writing to socket. Connection reset by peer."),
]


@pytest.mark.parametrize("exc", AMBIGUOUS)
@pytest.mark.parametrize(
    ("port_does", "says"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "it spoke first: b'HTTP/1.1 400"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "it spoke first: b'SSH-2.0"),
        (PROTECTED, "refuses this node: DENIED Redis is running in protected mode"),
        (b"", "answers, but not as Redis"),  # no word, then hung up: asked again, refused
        (RESET, None),  # waited for, whatever redis-py's words
        (b"-ERR max number of clients reached\r\n", None),  # a full Redis: waited for
    ],
)
@pytest.mark.timeout(20)
async def test_a_port_that_speaks_first_is_refused_and_one_that_resets_is_waited_for(
    exc: Exception, port_does: bytes | str, says: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = NotRedis(port_does)
    why = await _refusal(port, exc, monkeypatch)
    if says is None:
        assert why is None
    else:
        assert why is not None and says in why
        if port_does != PROTECTED:  # a Redis that refuses says so in its own words
            assert why.startswith(f"127.0.0.1:{port.port} answers, but not as Redis")


@pytest.mark.timeout(20)
async def test_a_port_silent_until_asked_is_judged_by_what_redis_py_met(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP is silent until asked, as Redis is: silence says nothing, so redis-py's own
    "closed by server" (the 400 and the hang-up it met) stands, and the start is refused."""
    port = NotRedis(ASKED)
    why = await _refusal(port, RedisConnectionError("Connection closed by server."), monkeypatch)
    assert why is not None and why.startswith(f"127.0.0.1:{port.port} answers, but not as Redis")


async def _refusal(port: NotRedis, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The store's start check against ``port`` when redis-py's PING fails with ``exc``."""
    store = RedisStore(f"redis://127.0.0.1:{port.port}/0")
    try:

        async def ping(*_: object) -> NoReturn:
            raise exc

        monkeypatch.setattr(store._r, "execute_command", ping)
        return await store.refusal()
    finally:
        port.sock.close()
        await store.close()


@pytest.mark.timeout(30)
async def test_a_full_redis_is_waited_for(tmp_path: Path) -> None:
    """A real Redis at its ``maxclients`` writes ``-ERR max number of clients reached``
    before it is asked and hangs up: Redis's own refusal, one a wait may fix, so the
    start goes on and waits (it is not "not Redis")."""
    server = RedisServer(tmp_path, extra=["--maxclients", "1"])
    server.start()
    holder = redis.Redis.from_url(server.url)
    store = RedisStore(server.url)
    try:
        holder.ping()  # the one client it takes
        assert await store.refusal() is None
    finally:
        holder.close()
        await store.close()
        server.stop()
