"""Where ``RedisStore``'s commands go: one Redis, a Sentinel-managed primary, or a Cluster.

``RedisStore`` is written against ``Topology``: a client for ordinary commands
(redis-py routes each by its key), a client for blocking reads, a ``Route`` per
key for the group commit's pipelines, ``refresh`` after a redirect or a
refused connection, and control messages between nodes. The URL picks it
(``gateway.store.redis_connect``):

- one server, or the primary Sentinel names now, followed across a failover
  (``SingleTopology``);
- a Redis Cluster (``ClusterTopology``). Every session's keys carry the hash tag ``{SID}``, so one session lives in
  one slot and its scripts and pipelines go to one node; control messages
  use sharded pub/sub (``SSUBSCRIBE``/``SPUBLISH``, Redis ≥ 7), so each goes
  to one shard instead of being broadcast to every node of the cluster.

Only public redis-py API is used here: ``get_connection``/``release`` of a
pool, ``acquire_connection``/``release`` of a ``ClusterNode``,
``get_node_from_key`` and ``nodes_manager.initialize`` of ``RedisCluster``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.store.redis_scripts import SCRIPTS

log = logging.getLogger("gateway.store.redis")

CLUSTER_CLOSE_WAIT: Final = 2.0
"""Seconds a Cluster client's ``aclose`` may wait for the client's lock (see
``_close_cluster_client``) before its connections are closed without it."""

# Replies (as redis-py raises them) that mean "not here or not now": MOVED is an AskError.
_REDIRECTS: Final = (
    AskError,
    TryAgainError,
    ClusterDownError,
    MasterDownError,
    ReadOnlyError,
    BusyLoadingError,
)

__all__ = ["ClusterTopology", "Route", "SingleTopology", "Topology"]


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

    def address(self) -> tuple[str, int] | None:
        """The one TCP server behind the URL, to probe at start (None: a socket file,
        several servers, or one Sentinel names)."""
        return None

    def single_server_connection(self) -> Callable[[], AbstractConnection] | None:
        """Makes a new connection to the one server every key lives on (None: several).

        For ``gateway.store.redis_pipe``, which needs every append on one connection.
        """
        return None

    async def exchange(self, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` to ``key``'s node on one connection, in order; their replies.

        For a command that must follow another on the same connection (``WAIT``
        after a write). A connection of its own, not a lane's: a lane may be
        mid-batch. An error reply raises, as redis-py raises it.
        """
        try:
            return await self._exchange_once(key, commands)
        except _REDIRECTS:
            # A failover this client has not noticed (nobody else may append
            # to that shard to learn it, e.g. while every session there waits
            # on this very call): learn the owner, then ask it.
            await self.refresh()
            return await self._exchange_once(key, commands)
        except (RedisConnectionError, OSError):
            with contextlib.suppress(Exception):
                await self.refresh()  # the caller's next try goes to the new owner
            raise

    async def _exchange_once(self, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        conn = await self._checkout(key)
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            return [await conn.read_response() for _ in commands]
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        finally:
            await self._checkin(key, conn)

    @abc.abstractmethod
    async def _checkout(self, key: str) -> AbstractConnection:
        """A connection to ``key``'s node, for ``exchange``."""

    @abc.abstractmethod
    async def _checkin(self, key: str, conn: AbstractConnection) -> None:
        """Give ``exchange``'s connection back."""

    @abc.abstractmethod
    async def blocking(self, key: str, *args: Any) -> Any:
        """A command that may block (``XREAD BLOCK``) on ``key``'s node, on its own pool."""

    @abc.abstractmethod
    async def publish(self, channel: str, data: bytes) -> int:
        """Send ``data`` to the listeners of ``channel``; how many got it (see ``Store.publish``)."""

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
        address: tuple[str, int] | None = None,
    ) -> None:
        self.kind = kind
        self._sentinel = sentinel
        self._address = address  # None with a Sentinel: the primary moves
        self.where = where
        self.client = client
        self._blocking = blocking_client
        self._blocking_cmd: Callable[..., Awaitable[Any]] = blocking_client.execute_command
        self._route = _PoolRoute(where, client.connection_pool)

    def route(self, key: str) -> Route:
        return self._route

    def address(self) -> tuple[str, int] | None:
        return self._address

    def single_server_connection(self) -> Callable[[], AbstractConnection]:
        make: Callable[[], AbstractConnection] = self.client.connection_pool.make_connection
        return make

    async def _checkout(self, key: str) -> AbstractConnection:
        conn: AbstractConnection = await self.client.connection_pool.get_connection()
        return conn

    async def _checkin(self, key: str, conn: AbstractConnection) -> None:
        await self.client.connection_pool.release(conn)

    async def blocking(self, key: str, *args: Any) -> Any:
        return await self._blocking_cmd(*args)

    async def publish(self, channel: str, data: bytes) -> int:
        return int(await self.client.execute_command("PUBLISH", channel, data))

    @contextlib.asynccontextmanager
    async def messages(self, channel: str) -> AsyncIterator[AsyncIterator[bytes]]:
        pubsub = self._blocking.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            yield _pubsub_messages(pubsub, "message")
        finally:
            with contextlib.suppress(Exception):
                await _aclose_pubsub(pubsub)

    async def close(self) -> None:
        await self._route.close()
        await self.client.aclose()
        await self._blocking.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose()


async def _aclose_pubsub(pubsub: Any) -> None:
    """Close a PubSub through a typed callable: redis-py 8.1 leaves ``aclose``
    unannotated and 8.2 annotates it, so calling it directly would need a
    ``type: ignore`` on one of the two and fail ``warn_unused_ignores`` on the other."""
    aclose: Callable[[], Awaitable[None]] = pubsub.aclose
    await aclose()


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
        lanes_client: RedisCluster,
        where: str,
        node_options: dict[str, Any],
    ) -> None:
        self.where = where
        self.client = client
        self._blocking = blocking_client
        # Routes and connections of the group commit, and ``exchange``'s: a
        # client that runs no command, so redis-py never closes them all
        # because a command met a dead node (``_open_cluster``).
        self._lanes = lanes_client
        self._node_options = node_options
        self._routes: dict[str, _NodeRoute] = {}
        self._ready = False

    async def _initialized(self) -> None:
        if not self._ready:
            await self.client.initialize()
            await self._blocking.initialize()
            await self._lanes.initialize()
            for script in SCRIPTS:  # on every primary: appends rarely meet NOSCRIPT
                await self.client.script_load(script.src)
            self._ready = True

    def _lane_node(self, key: str) -> ClusterNode:
        node = self._lanes.get_node_from_key(key)
        if node is None:
            raise RedisClusterException(f"no master known for {key!r} yet")
        return node

    def route(self, key: str) -> Route:
        node = self._lane_node(key)
        route = self._routes.get(node.name)
        if route is None or route.node is not node:
            # New (or re-learnt) node: the old one's connection goes with it.
            route = self._routes[node.name] = _NodeRoute(node)
        return route

    async def prepare(self) -> None:
        await self._initialized()

    async def _checkout(self, key: str) -> AbstractConnection:
        await self._initialized()
        conn: AbstractConnection = self._lane_node(key).acquire_connection()
        return conn

    async def _checkin(self, key: str, conn: AbstractConnection) -> None:
        assert isinstance(conn, Connection)  # what acquire_connection gives
        node = self._lanes.get_node(host=conn.host, port=conn.port)
        if node is not None:
            node.release(conn)

    async def refresh(self) -> None:
        await self._initialized()
        await self._lanes.nodes_manager.initialize()
        for name, route in list(self._routes.items()):
            if self._lanes.get_node(node_name=name) is not route.node:
                del self._routes[name]  # a node that left (or was re-learnt)
                with contextlib.suppress(Exception):
                    await route.close()

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

    async def publish(self, channel: str, data: bytes) -> int:
        """``SPUBLISH`` at the channel's shard; once more after a refresh if nobody heard it.

        A replica (a master demoted by a failover this client has not noticed)
        takes ``SPUBLISH`` without ``MOVED``, so no error would ever correct a
        stale slot map here: nobody listening is the hint. Control messages
        are rare, so the extra ``CLUSTER SLOTS`` costs nothing that matters.
        """
        await self._initialized()
        node = self.client.get_node_from_key(channel)
        heard = int(await self.client.execute_command("SPUBLISH", channel, data, target_nodes=node))
        if not heard:
            await self.client.nodes_manager.initialize()
            fresh = self.client.get_node_from_key(channel)
            if fresh.name != node.name:
                heard = int(
                    await self.client.execute_command("SPUBLISH", channel, data, target_nodes=fresh)
                )
        return heard

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
                await _aclose_pubsub(pubsub)
            with contextlib.suppress(Exception):
                await client.aclose()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10.0):  # a hung node must not hold the listener
                    await self.client.nodes_manager.initialize()

    async def close(self) -> None:
        for route in self._routes.values():
            await route.close()
        for client in (self.client, self._blocking, self._lanes):
            await _close_cluster_client(client)


async def _close_cluster_client(client: RedisCluster) -> None:
    """``client.aclose()``, bounded. It takes the client's lock, which a topology
    refresh holds while it asks the nodes for the slots, and a refresh can take
    long: a dead node's connect retries, or the blocking client's ``CLUSTER
    SLOTS``, which has no socket timeout, on a node that accepts and never
    answers. A store's close after a master was killed took over 15 s once in a
    CI run and once in ~40 local runs (where it waited was not captured; the
    test now reports it). Past ``CLUSTER_CLOSE_WAIT`` the nodes' connections are
    closed without the lock; the refresh, if it ever ends, finds them closed."""
    try:
        async with asyncio.timeout(CLUSTER_CLOSE_WAIT):
            await client.aclose()
    except TimeoutError:
        log.warning(
            "a Redis Cluster client did not close within %gs (a topology refresh held "
            "it); closing its connections without waiting",
            CLUSTER_CLOSE_WAIT,
        )
        nodes = client.nodes_manager
        await nodes.aclose()
        await nodes.aclose("startup_nodes")
