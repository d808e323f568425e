"""One gateway node: the services its sessions share, and the sessions it drives.

A node drives a session while it holds the session's lease in the store. It
loads the session from the store when a client attaches (any node can: the
store has everything), renews the leases of all its sessions from one task,
and gives a session up when its last client left and no turn runs, so the next
client may be served by any node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final

from gateway.config import Config
from gateway.metrics import Metrics
from gateway.pricing import PriceTable
from gateway.sessions.control import (
    BROADCAST_CHANNEL,
    ClientConnectionLike,
    CommandRelay,
    Deleted,
    decode_control,
    encode_control,
    node_channel,
)
from gateway.sessions.follower import LogFollower
from gateway.sessions.guardrail_rules import GuardrailsFile
from gateway.sessions.limits import Limits
from gateway.sessions.loading import first_use, meta_float, prepare_tools, read_history
from gateway.sessions.logwriter import LogWriter
from gateway.sessions.policy import KeyPolicies, within
from gateway.sessions.port import UNUSED
from gateway.sessions.recorder import Recorders, secrets_to_scrub
from gateway.sessions.resumption import META_KEY, decode_resume_point
from gateway.sessions.runtime import SessionRuntime
from gateway.sessions.setup import SessionServices, SessionSetups, UpstreamFactories
from gateway.sessions.takeover import rerun_interrupted
from gateway.sessions.workspaces import WorkspaceSweeper
from gateway.store.base import RECORDING, Store, StoreError
from gateway.tracing import Tracing
from gateway.upstream import providers
from gateway.upstream.base import UpstreamFactory
from protocol.configuration import SessionConfig, encode_config
from protocol.events import (
    Usage,
)
from tools.allowlist import KeyAllowLists
from tools.base import ToolContext
from tools.executor import Executor
from tools.registry import Registry

__all__ = ["Node", "UpstreamFactories"]

log = logging.getLogger("gateway.sessions.node")

POLICY_REOPENS_PER_SECOND: Final = 20.0
"""Listening sessions whose provider connection a key policy edit replaces, a second."""
_CONFIG_RETRY_MOST: Final = 5.0
"""Seconds at most between tries to store a configuration while the store is away."""


class Node:
    def __init__(
        self,
        config: Config,
        store: Store,
        upstream_factory: UpstreamFactory,
        registry: Registry,
        *,
        metrics: Metrics | None = None,
        prices: PriceTable | None = None,
        tracing: Tracing | None = None,
        factories: UpstreamFactories | None = None,
    ) -> None:
        """``factories`` makes upstream factories for sessions that pick another
        provider or model; without it they get only ``upstream_factory``'s."""
        self.config = config
        self.node_id = config.node_id
        self.store = store
        self.upstream_factory = upstream_factory
        executor = Executor(
            registry, timeout=config.tool_timeout, max_output=config.tool_max_output
        )
        self.metrics = metrics or Metrics()
        # Per-key turn and token limits (gateway.sessions.limits); free when they are off.
        self.limits = Limits(config, store, self.metrics)
        # What each key may set in its sessions (--key-policy-file).
        self.policies = KeyPolicies(config.key_policy_file or None, known_providers=providers.NAMES)
        # Per-key allow-lists of tools, as the edge read them at handshakes (keys file `tools=`).
        self.key_tools = KeyAllowLists()
        # What each session's configuration makes of this node (prompt, tools, provider).
        # The node's guardrails (--guardrails), re-read when the file changes.
        guardrails = GuardrailsFile(config.guardrails or None)
        self.setups = SessionSetups(
            config, registry, upstream_factory, self.policies, factories, guardrails
        )
        self.runtimes: dict[str, SessionRuntime] = {}
        # The flight recorder: recordings written on the log writer's rounds.
        recorders = Recorders(
            store,
            limit=config.record_max_bytes,
            audio=config.record_audio,
            secrets=secrets_to_scrub(config, registry),
        )
        self.log_writer = LogWriter(
            store,
            self.node_id,
            linger=config.log_linger,
            lease_ttl=config.lease_ttl,
            on_round=recorders.ride,
        )
        self.services = SessionServices(
            config=config,
            metrics=self.metrics,
            log_writer=self.log_writer,
            limits=self.limits,
            executor=executor,
            upstream_factory=upstream_factory,
            system_prompt=self.setups.system_prompt,
            tool_context=self.tool_context,
            store=store,
            prices=prices or PriceTable(),
            tracing=tracing or Tracing.off(),
            session_setup=self.setups.setup,
            recorders=recorders,
        )
        # Removes the workspaces of sessions that ended (expired in the store).
        self.workspaces = WorkspaceSweeper(
            Path(config.workspace_root),
            store,
            driven=self.runtimes.__contains__,
            session_ttl=config.session_ttl,
            every=config.workspace_sweep_every,
        )
        self.followers: dict[str, LogFollower] = {}
        # Client connections on this node by id, for replies to forwarded commands.
        self.connections: dict[str, ClientConnectionLike] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Commands between this node and the others (both directions).
        self.relay = CommandRelay(
            store,
            self.node_id,
            lease_ttl=config.lease_ttl,
            runtimes=self.runtimes,
            connections=self.connections,
            spawn=self.spawn,
            drive=self.drive,
        )
        self.draining = False
        self._keeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._keeper = asyncio.create_task(self._keep_leases(), name="lease-keeper")
        self.spawn(self.workspaces.run(), "workspace-sweeper")
        self.spawn(
            self.store.listen(node_channel(self.node_id), self.relay.on_message),
            "control-listener",
        )
        self.spawn(self.store.listen(BROADCAST_CHANNEL, self._on_control), "broadcast-listener")

    async def stop(self) -> None:
        """Close every session this node drives (their clients are told to reconnect)."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(BaseException):
                await self._keeper
        for follower in list(self.followers.values()):
            follower.stop()
        await asyncio.gather(
            *(rt.close("node shutting down") for rt in list(self.runtimes.values())),
            return_exceptions=True,
        )
        await self.log_writer.close()
        if self.services.recorders is not None:
            await self.services.recorders.close()
        await self.services.checkers.aclose()
        # Listeners and the sweeper end before the store closes under them: a
        # task still unsubscribing on a closed client would outlive the node.
        background = list(self._background)
        for task in background:
            task.cancel()
        if background:
            _, stuck = await asyncio.wait(background, timeout=5.0)
            for task in stuck:
                log.warning("%s did not stop within 5 s of the node's stop", task.get_name())

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ sessions

    def new_session_id(self) -> str:
        """24 URL-safe characters (144 random bits), never starting with ``-``:
        an id is typed after command-line flags (``gateway recording get ID``),
        where a leading dash reads as an option."""
        while True:
            sid = secrets.token_urlsafe(18)
            if not sid.startswith("-"):
                return sid

    async def create_session(self, owner: str = "") -> SessionRuntime:
        """A new session driven by this node, not stored until ``record_session``.

        The edge stores it at its first turn: a connection that never sends a
        message leaves no 24-hour session record behind.
        """
        sid = self.new_session_id()
        runtime = await self.drive(sid, owner=owner)
        if runtime is None:  # pragma: no cover - a fresh random id cannot be leased elsewhere
            raise RuntimeError(f"new session {sid} is leased by another node")
        return runtime

    async def record_session(self, sid: str, owner: str) -> None:
        """Store the session ``sid`` as owned by ``owner`` (an API key id); then it
        can be resumed, from any node, until it idles out (``session_ttl``)."""
        runtime = self.runtimes.get(sid)
        setup = runtime.setup if runtime is not None else self.setups.default
        await self.store.create_session(sid, self.setups.session_meta(owner, setup))
        if runtime is not None:
            runtime.observer.owner = owner

    # ------------------------------------------------------------------ configuration

    def policies_changed(self) -> None:
        """The key policy file changed: set every session driven here up again under it.

        Rights take effect at once: a session whose setup changes (tools
        withdrawn, instructions, a provider no longer allowed) uses the new one
        from its next model step, and its clients see ``configured``. Sessions
        driven elsewhere are their drivers' (every node watches its own file);
        sessions driven nowhere get it when they are loaded. The listening voice
        sessions' provider connections are replaced ``POLICY_REOPENS_PER_SECOND``
        at a time, not all at once (an edit that changed the tools of every
        session here opened a connection for each in the same moment).
        """
        listening = 0
        start = asyncio.get_running_loop().time()  # one instant: the spacing is exact
        for runtime in list(self.runtimes.values()):
            if runtime.closed:
                continue
            owner, before = runtime.owner, runtime.setup
            setup = self.setups.setup(
                owner, within(self.policies.get(owner), before.config), before.key_tools
            )
            if isinstance(setup, str):
                log.warning(
                    "session %s: the new key policy cannot be applied (%s); it keeps its setup",
                    runtime.sid,
                    setup,
                    extra={"sid": runtime.sid},
                )
            elif (
                setup.config,
                setup.system_prompt,
                setup.server_tools,
                setup.upstream_factory,
                setup.guardrails,
            ) != (
                before.config,
                before.system_prompt,
                before.server_tools,
                before.upstream_factory,
                before.guardrails,
            ):
                log.info(
                    "session %s: key policy of %s changed: set up again",
                    runtime.sid,
                    owner,
                    extra={"sid": runtime.sid},
                )
                runtime.rights_changed(
                    setup, reopen_at=start + listening / POLICY_REOPENS_PER_SECOND
                )
                listening += runtime.listening

    def runtime_configured(self, runtime: SessionRuntime) -> None:
        """Store the session's new configuration (a no-op until it is stored itself)."""
        self.spawn(self._save_config(runtime), f"configure:{runtime.sid}")

    async def _save_config(self, runtime: SessionRuntime) -> None:
        """Write the runtime's configuration until the store has its newest.

        Its clients were sent ``configured`` (held and logged when the store came
        back): a write given up after one try left the meta, which a node loading the
        session reads, with the configuration before it. Each try writes the newest,
        so writes that land out of order end with it too."""
        delay = self.store_retry_delay
        while not runtime.closed:
            setup = runtime.setup
            fields = {
                "config": encode_config(setup.config).decode(),
                "provider": setup.upstream_factory.provider,
            }
            try:
                await self.store.set_meta(runtime.sid, fields)
            except StoreError as exc:
                log.warning(
                    "session %s: configuration not stored (%s); trying again in %.1f s",
                    runtime.sid,
                    exc,
                    delay,
                    extra={"sid": runtime.sid},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _CONFIG_RETRY_MOST)
                continue
            if runtime.setup is setup:  # none newer came meanwhile
                return

    async def drive(self, sid: str, *, owner: str = "") -> SessionRuntime | None:
        """The runtime of ``sid`` on this node, loading it if its lease is free.

        None when another live node holds the lease (the caller follows the log).
        A session whose previous driver died mid-turn gets an ``interrupt`` and
        the turn is rerun from history.
        """
        runtime = self.runtimes.get(sid)
        if runtime is not None and not runtime.closed:
            return runtime
        lock = self._locks.setdefault(sid, asyncio.Lock())
        async with lock:
            runtime = self.runtimes.get(sid)
            if runtime is not None and not runtime.closed:
                return runtime
            if not await self.store.acquire_lease(sid, self.node_id, self.config.lease_ttl):
                return None
            try:
                runtime = await self._load(sid, owner)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.store.release_lease(sid, self.node_id)
                raise
            self.runtimes[sid] = runtime
            self.metrics.sessions.set(len(self.runtimes))
            await rerun_interrupted(
                runtime.driver,
                "the node running this turn stopped; the turn is being rerun — "
                "discard its partial output",
                self.store,
            )
        if not lock.locked():
            self._locks.pop(sid, None)
        return runtime

    async def _load(self, sid: str, owner: str = "") -> SessionRuntime:
        """``owner``: of a new session (not stored yet); a stored one says its own."""
        store = self.store
        meta, last_seq, history = await asyncio.gather(
            store.get_meta(sid), store.last_seq(sid), read_history(store, sid)
        )
        if meta is None:
            meta = {}
            key_tools = self.key_tools.get(owner) if owner else None
            if owner:
                setup = self.setups.stored_setup(sid, {"owner": owner}, key_tools)
            else:
                setup = self.setups.default
        else:
            await prepare_tools(meta)
            setup = self.setups.stored_setup(sid, meta)
            if meta.get(UNUSED) == "1":
                await first_use(store, sid, meta, self.config.session_ttl)
        usage = Usage(
            input=int(meta.get("usage_input", "0") or 0),
            output=int(meta.get("usage_output", "0") or 0),
        )
        runtime = SessionRuntime(
            self,
            self.services,
            sid,
            last_seq=last_seq,
            history=history,
            usage=usage,
            cost=meta_float(meta.get("cost_usd", "")),
            setup=setup,
            owner=meta.get("owner", owner),
            resume=decode_resume_point(meta.get(META_KEY, "")),
            recording=meta.get(RECORDING, ""),
        )
        # The last turn's trace: a rerun of it (rerun_interrupted) links there.
        runtime.observer.follows = meta.get("traceparent", "")
        return runtime

    async def follow(self, sid: str) -> LogFollower:
        """The follower of ``sid`` on this node (one per session), made if need be.

        A new follower tails the log from its current end: a client's replay
        up to there comes from its own catch-up read.
        """
        follower = self.followers.get(sid)
        if follower is not None and not follower.done:
            return follower
        head = await self.store.last_seq(sid)
        follower = self.followers.get(sid)  # another client may have made one meanwhile
        if follower is None or follower.done:
            follower = LogFollower(
                self.store,
                sid,
                head,
                node_id=self.node_id,
                drive=self.drive,
                on_stop=self._follower_stopped,
                poll=max(0.2, self.config.lease_ttl / 3),
                retry_delay=self.store_retry_delay,
            )
            self.followers[sid] = follower
        return follower

    def _follower_stopped(self, follower: LogFollower) -> None:
        if self.followers.get(follower.sid) is follower:
            del self.followers[follower.sid]

    @property
    def store_retry_delay(self) -> float:
        """Seconds between attempts while the store is unreachable."""
        return self.services.store_retry_delay

    def runtime_idle(self, runtime: SessionRuntime) -> None:
        """Give the session up once no client is attached and no turn runs."""
        if runtime.closed or runtime.subscribers or runtime.turn is not None:
            return
        self.spawn(self._release_when_flushed(runtime), f"release:{runtime.sid}")

    async def _release_when_flushed(self, runtime: SessionRuntime) -> None:
        def still_idle() -> bool:
            return not (runtime.closed or runtime.subscribers or runtime.turn is not None)

        await runtime.flushed()
        if not still_idle():
            return
        with contextlib.suppress(Exception):
            await self.store.set_meta(
                runtime.sid,
                {
                    "usage_input": str(runtime.usage.input),
                    "usage_output": str(runtime.usage.output),
                    "cost_usd": repr(runtime.observer.cost_total),
                },
            )
        # A client may have attached during that write: look again, with no
        # await between the look and close(), which marks the runtime closed
        # before it awaits anything.
        if still_idle():
            await runtime.close("idle")

    def runtime_closed(self, runtime: SessionRuntime, *, release: bool) -> None:
        """Called by a runtime that closed: drop it and (if still ours) free the lease."""
        if self.runtimes.get(runtime.sid) is runtime:
            del self.runtimes[runtime.sid]
        self.metrics.sessions.set(len(self.runtimes))
        if release:
            self.spawn(self._release_lease(runtime.sid), f"unlease:{runtime.sid}")

    async def _release_lease(self, sid: str) -> None:
        lock = self._locks.setdefault(sid, asyncio.Lock())
        async with lock:
            # A client may have re-attached while the old runtime was closing:
            # the lease then belongs to the new runtime.
            if sid in self.runtimes:
                return
            with contextlib.suppress(Exception):
                await self.store.release_lease(sid, self.node_id)
        if not lock.locked():
            self._locks.pop(sid, None)

    async def _keep_leases(self) -> None:
        """Renew every driven session's lease; a session whose lease is gone is dropped."""
        interval = self.config.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            runtimes = [rt for rt in self.runtimes.values() if not rt.closed]
            if not runtimes:
                continue
            try:
                # acquire, not renew: a lease that expired during a store outage
                # and that nobody else took is simply ours again.
                held = await self.store.keep_leases(
                    [rt.sid for rt in runtimes], self.node_id, self.config.lease_ttl
                )
            except StoreError as exc:
                # Not a loss: the leases may still be ours, and appends are
                # fenced, so a real loss shows up there.
                log.warning("could not renew leases: %s", exc)
                continue
            for rt, ok in zip(runtimes, held, strict=True):
                if not ok:
                    log.warning(
                        "session %s: lease taken by another node", rt.sid, extra={"sid": rt.sid}
                    )
                    rt.lose("lease lost to another node")

    # ------------------------------------------------------------------ control

    async def forward(self, sid: str, frame: bytes, conn: str) -> bool:
        """Send a client's command to the node driving ``sid``; False: run it here.

        Returns once the command's fate is known (see ``gateway.sessions.control``):
        up to the lease's TTL and a few seconds when the driver just died.
        """
        return await self.relay.forward(sid, frame, conn)

    async def ask_to_hand_over(self, sid: str) -> None:
        """A client here sends audio for ``sid``, driven by another node: ask that
        node to hand it over (``control.HANDOFF_QUIET``). Raises ``StoreError``."""
        await self.relay.ask_to_hand_over(sid)

    def _on_control(self, data: bytes) -> None:
        """The broadcast channel: what concerns every node (a deletion)."""
        message = decode_control(data)
        if isinstance(message, Deleted):
            self.spawn(self.session_deleted(message.sid), f"delete:{message.sid}")
        else:
            log.warning("ignoring an unexpected broadcast message (%d bytes)", len(data))

    # ------------------------------------------------------------------ deletion

    def live_state(self, sid: str) -> tuple[Usage, SessionConfig] | None:
        """A session driven here: its usage and configuration as they are now."""
        runtime = self.runtimes.get(sid)
        if runtime is None or runtime.closed:
            return None
        return runtime.usage, runtime.setup.config

    async def finish_turns(self, deadline: float) -> None:
        """Wait for running turns (up to ``deadline`` s), then up to 5 s for their logs
        to flush (a store outage must not hold a node's exit)."""
        turns = [rt.turn for rt in self.runtimes.values() if rt.turn is not None]
        if turns:
            log.info("draining: waiting up to %.0fs for %d running turns", deadline, len(turns))
            await asyncio.wait(turns, timeout=deadline)
        flushes = [asyncio.ensure_future(rt.flushed()) for rt in self.runtimes.values()]
        if flushes:
            await asyncio.wait(flushes, timeout=5.0)

    async def delete_session(self, sid: str) -> bool:
        """Delete ``sid`` everywhere: the store's records, then every node's live state.

        False if the store had no such session. Every node (this one
        included) hears ``Deleted`` on the broadcast channel and closes its
        clients of the session, its runtime or follower, and its workspace.
        """
        existed = await self.store.delete_session(sid)
        await self.store.publish(BROADCAST_CHANNEL, encode_control(Deleted(sid=sid)))
        return existed

    async def session_deleted(self, sid: str) -> None:
        """The session is gone from the store: let go of everything of it on this node."""
        for conn in list(self.connections.values()):
            if conn.sid == sid:
                conn.session_deleted()
        follower = self.followers.pop(sid, None)
        if follower is not None:
            follower.stop()
        runtime = self.runtimes.get(sid)
        if runtime is not None:
            # lost=True: nothing more is written (the lease is gone, appends would fail).
            await runtime.close("session deleted", lost=True)
        await self.workspaces.remove(sid)

    # ------------------------------------------------------------------ tools

    def tool_context(self, sid: str) -> ToolContext:
        workspace = self.workspaces.workspace(sid)
        workspace.mkdir(parents=True, exist_ok=True)
        return ToolContext(workspace=workspace, session_id=sid)
