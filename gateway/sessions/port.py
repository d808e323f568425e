"""The port between the edge and the node: all ``gateway.edge`` may ask of ``gateway.sessions``.

The edge (handshakes, client connections, the HTTP API) serves clients; the
node drives sessions. The edge sees the node only as a ``NodePort``, a
session driven here only as a ``DrivenSession``, one tailed from another
node's log only as a ``FollowedSession`` (both in ``gateway.sessions.
subscriber``, the seam between sessions and connections), and the store only as an
``EdgeStore``: reads of a session's record and log, creating a minted one,
and the store's services for keys, slots, rights and readiness. It cannot
append to a log, take a lease or edit a session's record behind the node's
back, and it names no runtime or store class; the node, its runtimes and
its followers satisfy these Protocols by their shape (mypy checks that
where the node is handed to the edge, in ``gateway.app``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, MutableMapping
from typing import Any, Protocol

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.sessions.control import ClientConnectionLike
from gateway.sessions.limits import Limits
from gateway.sessions.policy import KeyPolicies
from gateway.sessions.setup import SessionSetups
from gateway.sessions.subscriber import DrivenSession, FollowedSession
from gateway.store.base import Bus, Counters, Health, LogEntry, Secrets
from gateway.upstream.base import UpstreamFactory
from protocol.configuration import SessionConfig
from protocol.events import Usage
from tools.allowlist import KeyAllowLists

__all__ = ["CONFIG_QUOTA", "UNUSED", "EdgeStore", "NodePort", "config_bytes"]

UNUSED = "unused"
"""Meta field: "1" on a session made by the HTTP API that no client has connected to yet."""
CONFIG_QUOTA = "config:{key}"
"""The store's byte quota of the configurations of one key's sessions (``Store.hold_bytes``)."""


def config_bytes(meta: dict[str, str]) -> int:
    """What a session's configuration counts against its key's quota: its stored JSON's bytes."""
    return len(meta.get("config", "").encode())


class EdgeStore(Counters, Secrets, Bus, Health, Protocol):
    """The store as the edge may use it: a session's record, log and recording read, a
    minted session created, and the services of keys (``Secrets``), connection slots and
    quotas (``Counters``), rights (``Bus``) and readiness (``Health``)."""

    async def get_meta(self, sid: str) -> dict[str, str] | None: ...

    async def create_session(
        self, sid: str, meta: Mapping[str, str], ttl: float | None = None
    ) -> bool: ...

    async def last_seq(self, sid: str) -> int: ...

    async def read_log(
        self, sid: str, after: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[LogEntry]: ...

    async def lease_owner(self, sid: str) -> str | None: ...

    async def read_recording(self, sid: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """A page of the session's recording (``Recordings.read_recording``)."""
        ...


class NodePort(Protocol):
    """The node as the edge sees it (``gateway.sessions.node.Node``)."""

    draining: bool

    @property
    def config(self) -> Config: ...

    @property
    def node_id(self) -> str: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def store(self) -> EdgeStore: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def policies(self) -> KeyPolicies: ...

    @property
    def key_tools(self) -> KeyAllowLists: ...

    @property
    def setups(self) -> SessionSetups: ...

    @property
    def upstream_factory(self) -> UpstreamFactory: ...

    @property
    def connections(self) -> MutableMapping[str, ClientConnectionLike]:
        """Client connections on this node by id: the node's commands reach them."""
        ...

    @property
    def store_retry_delay(self) -> float: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None: ...

    def new_session_id(self) -> str: ...

    async def create_session(self, owner: str = "") -> DrivenSession: ...

    async def record_session(self, sid: str, owner: str) -> None: ...

    def policies_changed(self) -> None: ...

    async def drive(self, sid: str, *, owner: str = "") -> DrivenSession | None: ...

    async def follow(self, sid: str) -> FollowedSession: ...

    async def forward(self, sid: str, frame: bytes, conn: str) -> bool: ...

    async def ask_to_hand_over(self, sid: str) -> None: ...

    async def delete_session(self, sid: str) -> bool: ...

    def live_state(self, sid: str) -> tuple[Usage, SessionConfig] | None:
        """A session driven here: its usage and configuration as they are now."""
        ...

    async def finish_turns(self, deadline: float) -> None:
        """Wait for running turns (up to ``deadline`` s), then for their logs to flush."""
        ...
