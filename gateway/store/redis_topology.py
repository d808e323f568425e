"""Where ``RedisStore``'s commands go: one Redis, a Sentinel-managed primary, or a Cluster.

``RedisStore`` is written against ``Topology``: a client for ordinary commands
(redis-py routes each by its key), a client for blocking reads, a ``Route`` per
key for the group commit's pipelines, ``refresh`` after a redirect or a
refused connection, and control messages between nodes. The URL picks it:

- ``redis://``, ``rediss://``, ``unix://``: one server (``SingleTopology``);
- ``redis+sentinel://H:P[,H:P…]/MASTER`` (``rediss+sentinel://`` for TLS to
  the primary): the primary Sentinel names now, followed across a failover;
- ``redis+cluster://H:P[,H:P…]`` (``rediss+cluster://``): a Redis Cluster.
  Every session's keys carry the hash tag ``{SID}``, so one session lives in
  one slot and its scripts and pipelines go to one node; control messages
  use sharded pub/sub (``SSUBSCRIBE``/``SPUBLISH``, Redis ≥ 7), so each goes
  to one shard instead of being broadcast to every node of the cluster.

Only public redis-py API is used: ``get_connection``/``release`` of a pool,
``acquire_connection``/``release`` of a ``ClusterNode``, ``get_node_from_key``
and ``nodes_manager.initialize`` of ``RedisCluster``.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff

from gateway.store.redis_scripts import SCRIPTS

__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_SCHEMES",
    "SINGLE_SCHEMES",
    "ClusterTopology",
    "Route",
    "SingleTopology",
    "Topology",
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


class Route(abc.ABC):
    """Where the group commit sends the appends of one node: the connection it keeps.

    One batch is in flight at a time, so one connection per node suffices; it
    is kept rather than checked out per flush, which costs more CPU (and a
    loop tick) than a small flush itself.
    """

    name: str
    _held: AbstractConnection | None = None

    async def connection(self) -> AbstractConnection:
        """This route's connection (maybe not connected yet: ``connect`` it)."""
        if self._held is None:
            self._held = await self._checkout()
        return self._held

    async def close(self) -> None:
        """Give the kept connection back."""
        held, self._held = self._held, None
        if held is not None:
            await self._checkin(held)

    @abc.abstractmethod
    async def _checkout(self) -> AbstractConnection: ...

    @abc.abstractmethod
    async def _checkin(self, conn: AbstractConnection) -> None: ...


class _PoolRoute(Route):
    def __init__(self, name: str, pool: ConnectionPool) -> None:
        self.name = name
        self._pool = pool
        self._get: Callable[[], Awaitable[AbstractConnection]] = pool.get_connection

    async def _checkout(self) -> AbstractConnection:
        return await self._get()

    async def _checkin(self, conn: AbstractConnection) -> None:
        await self._pool.release(conn)


class _NodeRoute(Route):
    def __init__(self, node: ClusterNode) -> None:
        self.name = node.name
        self.node = node

    async def _checkout(self) -> AbstractConnection:
        return self.node.acquire_connection()

    async def _checkin(self, conn: AbstractConnection) -> None:
        assert isinstance(conn, Connection)  # what acquire_connection gives
        self.node.release(conn)


class Topology(abc.ABC):
    """The servers behind a store URL; see the module docstring."""

    kind: str
    where: str
    """Where Redis is, for error messages (``host:port``, ``cluster a:1,b:2``, …)."""
    client: Any
    """Ordinary commands: ``execute_command`` routes each by its key."""

    @abc.abstractmethod
    def route(self, key: str) -> Route:
        """The node that holds ``key`` now (as far as this client knows)."""

    async def prepare(self) -> None:  # noqa: B027 - a single server has nothing to learn
        """Learn the topology once, before the first ``route`` (which does not connect)."""

    async def refresh(self) -> None:  # noqa: B027 - a single server has nothing to learn
        """Learn the topology again (after MOVED, or a node that refused connections)."""

    @abc.abstractmethod
    async def blocking(self, key: str, *args: Any) -> Any:
        """A command that may block (``XREAD BLOCK``) on ``key``'s node, on its own pool."""

    @abc.abstractmethod
    async def publish(self, channel: str, data: bytes) -> None:
        """Send ``data`` to the listeners of ``channel`` (fire and forget)."""

    @abc.abstractmethod
    def messages(
        self, channel: str
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Subscribed to ``channel`` on entry; iterate for messages; any error ends it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every connection."""


class SingleTopology(Topology):
    """One server: a ``redis://`` URL, or the primary a Sentinel names."""

    def __init__(
        self,
        client: Redis,
        blocking_client: Redis,
        where: str,
        kind: str = "redis",
        sentinel: Sentinel | None = None,
    ) -> None:
        self.kind = kind
        self._sentinel = sentinel
        self.where = where
        self.client = client
        self._blocking = blocking_client
        self._blocking_cmd: Callable[..., Awaitable[Any]] = blocking_client.execute_command
        self._route = _PoolRoute(where, client.connection_pool)

    def route(self, key: str) -> Route:
        return self._route

    async def blocking(self, key: str, *args: Any) -> Any:
        return await self._blocking_cmd(*args)

    async def publish(self, channel: str, data: bytes) -> None:
        await self.client.execute_command("PUBLISH", channel, data)

    @contextlib.asynccontextmanager
    async def messages(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        pubsub = self._blocking.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            yield _pubsub_messages(pubsub, "message")
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._route.close()
        await self.client.aclose()
        await self._blocking.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose()


async def _pubsub_messages(pubsub: Any, kind: str) -> AsyncIterator[bytes]:
    """The data of ``kind`` messages; ends when the server unsubscribes us (slot moved)."""
    while True:
        message = await pubsub.get_message(timeout=30.0)
        if message is None:
            continue
        if message.get("type") == kind:
            yield message["data"]
        elif message.get("type") == "sunsubscribe":
            return  # the slot moved (failover, resharding): subscribe at its new owner


class ClusterTopology(Topology):
    """A Redis Cluster: commands routed by hash slot, sharded pub/sub."""

    kind = "redis-cluster"

    def __init__(
        self,
        client: RedisCluster,
        blocking_client: RedisCluster,
        where: str,
        node_options: dict[str, Any],
    ) -> None:
        self.where = where
        self.client = client
        self._blocking = blocking_client
        self._node_options = node_options
        self._routes: dict[str, _NodeRoute] = {}
        self._ready = False

    async def _initialized(self) -> None:
        if not self._ready:
            await self.client.initialize()
            await self._blocking.initialize()
            for script in SCRIPTS:  # on every primary: appends rarely meet NOSCRIPT
                await self.client.script_load(script.src)
            self._ready = True

    def route(self, key: str) -> Route:
        node = self.client.get_node_from_key(key)
        route = self._routes.get(node.name)
        if route is None or route.node is not node:
            # New (or re-learnt) node: the old one's connection goes with it.
            route = self._routes[node.name] = _NodeRoute(node)
        return route

    async def prepare(self) -> None:
        await self._initialized()

    async def refresh(self) -> None:
        await self._initialized()
        await self.client.nodes_manager.initialize()

    async def blocking(self, key: str, *args: Any) -> Any:
        await self._initialized()
        node = self._blocking.get_node_from_key(key)
        try:
            return await self._blocking.execute_command(*args, target_nodes=node)
        except Exception:
            # A failover or resharding: the next call should go to the new owner.
            with contextlib.suppress(Exception):
                await self._blocking.nodes_manager.initialize()
            raise

    async def publish(self, channel: str, data: bytes) -> None:
        """``SPUBLISH`` at the channel's shard; once more after a refresh if nobody heard it.

        A replica (a master demoted by a failover this client has not noticed)
        takes ``SPUBLISH`` without ``MOVED``, so no error would ever correct a
        stale slot map here: nobody listening is the hint. Control messages
        are rare, so the extra ``CLUSTER SLOTS`` costs nothing that matters.
        """
        await self._initialized()
        node = self.client.get_node_from_key(channel)
        heard = await self.client.execute_command("SPUBLISH", channel, data, target_nodes=node)
        if not heard:
            await self.client.nodes_manager.initialize()
            fresh = self.client.get_node_from_key(channel)
            if fresh.name != node.name:
                await self.client.execute_command("SPUBLISH", channel, data, target_nodes=fresh)

    @contextlib.asynccontextmanager
    async def messages(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """``SSUBSCRIBE`` on the channel's shard, on a connection of its own.

        A plain client to the shard's node, not ``RedisCluster.pubsub()``: the
        caller's loop already reconnects, and on any end (the node died, or
        Redis sent ``sunsubscribe`` because the slot moved) the slots are learnt
        again, so the next subscription goes to the new owner.
        """
        await self._initialized()
        node = self.client.get_node_from_key(channel)
        client = Redis(host=node.host, port=node.port, **self._node_options)
        # Subscribe messages are not ignored: Redis says ``sunsubscribe`` when
        # the slot moves away from this node, and that must end the loop.
        pubsub = client.pubsub()
        try:
            await pubsub.ssubscribe(channel)
            yield _pubsub_messages(pubsub, "smessage")
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            with contextlib.suppress(Exception):
                await client.aclose()
            with contextlib.suppress(Exception):
                await self.client.nodes_manager.initialize()

    async def close(self) -> None:
        for route in self._routes.values():
            await route.close()
        await self.client.aclose()
        await self._blocking.aclose()


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
    where = (
        f"unix:{kw['path']}"
        if "path" in kw
        else f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"
    )
    return SingleTopology(Redis.from_pool(pool), Redis.from_pool(blocking_pool), where)


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
    blocking = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
        socket_timeout=None,
        max_connections=max_blocking_connections or 100_000,
        retry=Retry(NoBackoff(), 0),
        **options,
    )
    where = "cluster " + ",".join(f"{h}:{p}" for h, p in parsed.hosts)
    node_options = {**options, "socket_timeout": None}
    return ClusterTopology(client, blocking, where, node_options)


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
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
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
