"""Which Redis errors a starting node stops on (``gateway.store.redis_refusal``): only
those no wait can fix. A Redis that is down, loading, full or failing over is waited for."""

from __future__ import annotations

import pytest
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

from gateway.store.redis_refusal import refusal

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
