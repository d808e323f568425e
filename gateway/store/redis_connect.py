"""Store URLs to redis-py clients: one server, Sentinel or Cluster (see ``redis_topology``).

The URL picks the setup: ``redis://``, ``rediss://``, ``unix://`` one server;
``redis+sentinel://H:P[,H:P…]/MASTER[/DB]`` the primary Sentinel names;
``redis+cluster://H:P[,H:P…]`` a Redis Cluster (``rediss+…`` for TLS to the
Redis servers). ``USER:PASSWORD@`` before the hosts is for the Redis servers
(the sentinels are asked without).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff

from gateway.store.redis_topology import ClusterTopology, SingleTopology, Topology

# redis-py 8.1 leaves Sentinel's constructor unannotated and 8.2 annotates it:
# a call through this typed name type-checks on both without a ``type: ignore``.
_new_sentinel: Callable[..., Sentinel] = Sentinel

__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_SCHEMES",
    "SINGLE_SCHEMES",
    "open_redis_client",
    "open_topology",
    "parse_hosts",
]

SINGLE_SCHEMES: Final = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEMES: Final = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES: Final = ("redis+sentinel://", "rediss+sentinel://")

_USAGE: Final = (
    "use redis+cluster://HOST:PORT[,HOST:PORT…] or "
    "redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME"
)


@dataclass(frozen=True, slots=True)
class _MultiHostUrl:
    """``SCHEME://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…][/PATH][?QUERY]``, taken apart."""

    tls: bool
    hosts: list[tuple[str, int]]
    path: str
    username: str | None
    password: str | None
    query: dict[str, str]


def parse_hosts(url: str) -> _MultiHostUrl:
    """Split a ``redis+cluster://`` or ``redis+sentinel://`` URL (``ValueError`` says how to fix it)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme.endswith(("+cluster", "+sentinel")):
        raise ValueError(f"not a cluster or sentinel URL: {url!r}; {_USAGE}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"bad host:port {item!r} in {url!r}; {_USAGE}")
        hosts.append((host.strip("[]"), int(port)))
    return _MultiHostUrl(
        tls=scheme.startswith("rediss"),
        hosts=hosts,
        path=unquote(path),
        username=username,
        password=password,
        query=dict(parse_qsl(query)),
    )


def open_topology(
    url: str,
    *,
    socket_timeout: float,
    connect_timeout: float,
    health_check_interval: float,
    max_connections: int,
    max_blocking_connections: int | None,
    retry_window: float,
    on_connect: Callable[[AbstractConnection], Awaitable[None]] | None,
) -> Topology:
    """The topology for ``url``; connects to nothing yet."""
    common: dict[str, Any] = {
        "protocol": 2,  # replies are parsed in their RESP2 shapes
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": health_check_interval,
    }
    if url.startswith(CLUSTER_SCHEMES):
        return _open_cluster(
            url, common, socket_timeout, max_connections, max_blocking_connections, retry_window
        )
    if url.startswith(SENTINEL_SCHEMES):
        return _open_sentinel(url, common, socket_timeout, max_connections, on_connect)
    if not url.startswith(SINGLE_SCHEMES):
        raise ValueError(f"unsupported Redis URL {url!r}")
    # Fail fast and let the caller decide: one immediate retry covers a pooled
    # connection that died idle; anything longer is an outage to report.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout,
        socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 1),
        redis_connect_func=on_connect,
        **common,
    )
    if str(pool.connection_kwargs.get("protocol")) != "2":
        raise ValueError(f"RedisStore speaks RESP2; remove protocol= from the Redis URL {url!r}")
    # No socket timeout: a blocking read legitimately waits, and wait_log
    # bounds it with its own deadline. No retry: a retried XREAD BLOCK would
    # wait its full time again, past that deadline; the follower retries.
    blocking_pool = ConnectionPool.from_url(
        url,
        max_connections=max_blocking_connections,
        socket_timeout=None,
        retry=Retry(NoBackoff(), 0),
        **common,
    )
    kw = pool.connection_kwargs
    address = (
        None if "path" in kw else (str(kw.get("host", "localhost")), int(kw.get("port", 6379)))
    )
    where = f"unix:{kw['path']}" if address is None else f"{address[0]}:{address[1]}"
    return SingleTopology(
        Redis.from_pool(pool), Redis.from_pool(blocking_pool), where, address=address
    )


def open_redis_client(
    url: str,
    *,
    socket_timeout: float = 3.0,
    connect_timeout: float = 2.0,
    max_connections: int = 16,
) -> Any:
    """A plain redis-py asyncio client for any store URL, for single-key commands.

    For tools that inspect what the store wrote (tests, benches): one server,
    the primary Sentinel names, or a Cluster (which routes each command by
    its key), so they accept every URL the store does. The gateway itself
    reaches Redis only through the store's interfaces (``gateway.store.base``).
    ``aclose()`` it when done.
    """
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
    }
    if url.startswith(CLUSTER_SCHEMES):
        parsed = parse_hosts(url)
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
            max_connections=max_connections,
            **common,
            **_auth(parsed),
        )
    if url.startswith(SENTINEL_SCHEMES):
        parsed = parse_hosts(url)
        name, _, db = parsed.path.partition("/")
        if not name:
            raise ValueError(f"no master name in {url!r}; {_USAGE}")
        sentinel = _new_sentinel(
            parsed.hosts, sentinel_kwargs={**common, "retry": Retry(NoBackoff(), 0)}
        )
        options = {**common, **_auth(parsed), **({"db": int(db)} if db else {})}
        return sentinel.master_for(name, max_connections=max_connections, **options)
    return Redis.from_url(url, max_connections=max_connections, **common)


def _auth(parsed: _MultiHostUrl) -> dict[str, Any]:
    auth: dict[str, Any] = {}
    if parsed.username:
        auth["username"] = parsed.username
    if parsed.password is not None:
        auth["password"] = parsed.password
    if parsed.tls:
        auth["ssl"] = True
    return auth


def _retries(window: float) -> Retry:
    """Backoff 50 ms doubling to 500 ms, as many tries as fit in ``window`` seconds."""
    tries, spent, delay = 0, 0.0, 0.05
    while spent < window:
        spent += delay
        delay = min(delay * 2, 0.5)
        tries += 1
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), max(tries, 1))


def _open_cluster(
    url: str,
    common: dict[str, Any],
    socket_timeout: float,
    max_connections: int,
    max_blocking_connections: int | None,
    retry_window: float,
) -> ClusterTopology:
    parsed = parse_hosts(url)
    if parsed.path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0; remove /{parsed.path} from {url!r}")
    options = {**common, **_auth(parsed)}
    nodes = [ClusterNode(host, port) for host, port in parsed.hosts]
    client = RedisCluster(
        startup_nodes=nodes,
        socket_timeout=socket_timeout,
        max_connections=max_connections,
        retry=_retries(retry_window),
        **options,
    )
    # The group commit's lanes route and take their connections here, on a
    # client that runs no command itself: when a command of ``client`` meets a
    # dead node, redis-py closes every connection of that client, and the
    # lanes of the healthy masters must not lose theirs mid-batch.
    lanes = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
        socket_timeout=socket_timeout,
        max_connections=max_connections,
        **options,
    )
    blocking = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
        socket_timeout=None,
        max_connections=max_blocking_connections or 100_000,
        retry=Retry(NoBackoff(), 0),
        **options,
    )
    where = "cluster " + ",".join(f"{h}:{p}" for h, p in parsed.hosts)
    node_options = {**options, "socket_timeout": None}
    return ClusterTopology(client, blocking, lanes, where, node_options)


def _open_sentinel(
    url: str,
    common: dict[str, Any],
    socket_timeout: float,
    max_connections: int,
    on_connect: Callable[[AbstractConnection], Awaitable[None]] | None,
) -> SingleTopology:
    parsed = parse_hosts(url)
    name, _, db = parsed.path.partition("/")
    if not name:
        raise ValueError(f"no master name in {url!r}; {_USAGE}")
    options = {**common, **_auth(parsed)}
    if db:
        options["db"] = int(db)
    # The sentinels themselves: no password, no TLS (as sentinels usually run).
    # Asking the sentinels fails over to the next one at once: redis-py's
    # default retry would back off for seconds per sentinel first.
    sentinel = _new_sentinel(
        parsed.hosts,
        sentinel_kwargs={
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": common["socket_connect_timeout"],
            "retry": Retry(NoBackoff(), 0),
        },
    )
    client = sentinel.master_for(
        name,
        socket_timeout=socket_timeout,
        max_connections=max_connections,
        retry=Retry(NoBackoff(), 1),
        redis_connect_func=on_connect,
        **options,
    )
    blocking = sentinel.master_for(
        name, socket_timeout=None, retry=Retry(NoBackoff(), 0), **options
    )
    where = f"sentinel master {name!r} via " + ",".join(f"{h}:{p}" for h, p in parsed.hosts)
    return SingleTopology(client, blocking, where, kind="redis-sentinel", sentinel=sentinel)
