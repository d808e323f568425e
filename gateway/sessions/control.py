"""Commands between nodes: a client on one node, its session driven on another.

A client may be attached to a node that only follows the session's log (the
lease is held elsewhere, e.g. by the node a second browser tab is on, or by
the node still finishing a turn after this client reconnected). Its ``user``,
``cancel``, ``configure`` and ``tool_result`` messages are forwarded to the
driving node over the store's publish/subscribe channel ``node:<node_id>``.

Pub/sub delivers to whoever listens *now*, so a command sent to a node that
just died would vanish. Hence a forward is not done until the
command's fate is known, and the sending node keeps it until then:

- ``PUBLISH`` counts its receivers. 0 means nobody got it (the driver is
  dead, or its subscription is reconnecting): the sender holds the command
  and looks again shortly.
- The driver answers every command: an error (``turn_active``, ``no_turn``,
  ``unknown_call``), "run it yourself" (it no longer drives the session), or
  "taken" — sent only once the command's ``user``, ``cancelled`` or
  ``configured`` event is in the log, so a taken command survives the driver:
  whoever takes over reruns a logged turn. (A ``tool_result`` is taken once
  the turn machine accepted it: a takeover reruns its step anyway.)
- No answer within ``ACK_WAIT``: the sender resends under the same ``ref``;
  the driver remembers the refs it handled and answers a copy without running
  it again, so a slow driver runs a command once.
- When the lease is free (a dead driver's lease expired), the sender returns
  the command to its connection, which takes the session over and runs it.
  If the old driver may have received it, the sender first reads the log:
  that node can no longer write (appends are fenced by the lease), so the
  log says for good whether it ran the command.
- A command that is neither answered nor runnable here ``GIVE_UP_AFTER``
  seconds past the lease's TTL is answered with an error that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Protocol

import msgspec

from gateway.sessions.commands import COMMANDS, FORWARDED, dispatch
from gateway.sessions.runtime import SessionRuntime
from gateway.sessions.subscriber import EventSource
from gateway.store.base import LogEntry, Store, StoreError
from protocol.client_frames import decode_client
from protocol.events import (
    Error,
    Event,
    User,
    UserMessage,
    answering,
    decode_event,
    encode,
)

__all__ = [
    "ACK_WAIT",
    "BROADCAST_CHANNEL",
    "GIVE_UP_AFTER",
    "HANDOFF_QUIET",
    "RIGHTS_CHANNEL",
    "ClientConnectionLike",
    "CommandRelay",
    "ControlMessage",
    "Deleted",
    "Forward",
    "Handoff",
    "KeysChanged",
    "Reply",
    "decode_control",
    "encode_control",
    "node_channel",
]

log = logging.getLogger("gateway.sessions.control")

ACK_WAIT: Final = 1.0
"""Seconds to wait for the driver's answer before looking at the lease again.

An answer takes one publish each way plus one log append: milliseconds. A
second without one means the driver is stalled, dead with its connection still
open, or the message was lost on the way; the lease tells which, and a resend
is harmless.
"""

GIVE_UP_AFTER: Final = 5.0
"""Seconds past the lease's TTL before an unanswered command is refused.

A dead driver's lease frees within its TTL, and then this node runs the
command; past that, the driver is alive (it renews its lease) but does not
answer: the client is told rather than left waiting.
"""

HANDOFF_QUIET: Final = 1.0
"""Seconds without audio from the driver's clients before it hands a voice session
to a node whose client sends audio.

Voice is driven where the microphone is (audio is not forwarded between
nodes). A client whose network moved reconnects through another node while
the old node may not see its dead connection for tens of seconds (ping
timeouts): its new microphone would be refused all that time. A live
microphone sends a frame every 20-100 ms, so a second of silence on the
driver's side means no microphone there, and its clients (told 1012, "the
session moved") reconnect and follow. Two live microphones on two nodes: the
first keeps the session.
"""

LOOK_AGAIN: Final = 0.25
"""Seconds between looks at the lease while nobody listens on the driver's channel."""

_REMEMBERED: Final = 4096
"""Refs of handled commands a driver keeps to answer resent copies."""


class Forward(msgspec.Struct, tag_field="kind", tag="forward", frozen=True):
    """A client command for the node driving ``sid``."""

    sid: str
    command: bytes  # the client's frame, as it sent it (already validated)
    origin: str  # node id to send a reply to
    conn: str  # connection id on the origin node
    ref: str = ""  # this command's id: copies share it; "" from nodes that expect no answer


class Reply(msgspec.Struct, tag_field="kind", tag="reply", frozen=True):
    """An answer to a forwarded command, for one connection.

    ``error`` is an encoded error event for the client; ``retry`` is the
    command to dispatch again instead, when the session stopped being driven
    by the replying node while the command was on its way (its lease is being
    released: the origin node can take the session over now). Neither: the
    command was taken and its event is in the log.
    """

    conn: str
    error: bytes = b""
    retry: bytes = b""
    ref: str = ""


class Handoff(msgspec.Struct, tag_field="kind", tag="handoff", frozen=True):
    """A voice client on node ``origin`` sends audio for ``sid``: the driver hands the
    session over if its own clients' microphones are quiet (see ``HANDOFF_QUIET``)."""

    sid: str
    origin: str


class Deleted(msgspec.Struct, tag_field="kind", tag="deleted", frozen=True):
    """The session ``sid`` was deleted: every node lets go of it (on ``BROADCAST_CHANNEL``)."""

    sid: str


class KeysChanged(msgspec.Struct, tag_field="kind", tag="keys", frozen=True):
    """API keys in the shared store changed (``gateway keys revoke``): every node looks
    again, now, at the keys its connections use (on ``RIGHTS_CHANNEL``).

    It carries no authority: a node asks the store what is issued
    (``gateway.edge.rights``), so a lost or forged message changes nothing that
    the next periodic look would not. ``digests``: the keys that changed
    (their SHA-256 digests); empty: any.
    """

    digests: tuple[str, ...] = ()


ControlMessage = Forward | Reply | Handoff | Deleted | KeysChanged

BROADCAST_CHANNEL: Final = "nodes"
"""The channel every node listens on, for what concerns all of them (a deletion)."""

RIGHTS_CHANNEL: Final = "rights"
"""The channel every node's edge listens on for changes of API keys (``KeysChanged``)."""

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(ControlMessage)


def encode_control(message: ControlMessage) -> bytes:
    return _encoder.encode(message)


def decode_control(data: bytes) -> ControlMessage | None:
    """The message, or None for garbage on the channel (logged by the caller)."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def node_channel(node_id: str) -> str:
    return f"node:{node_id}"


class ClientConnectionLike(Protocol):
    def reply_frame(self, data: bytes) -> None:
        """Send an encoded error event (a reply) to this client."""

    def redispatch(self, frame: bytes) -> None:
        """Handle this client's command again (the session moved while it travelled)."""

    @property
    def sid(self) -> str:
        """The session this client is attached to."""

    def session_deleted(self) -> None:
        """The session was deleted (``DELETE /v1/sessions/ID``): close this client."""


def _landmark(command: object) -> type[Event] | None:
    """The logged event that shows ``command`` took effect (None: none does).

    A ``tool_result`` has none (its ``result`` may wait for other calls): it is
    taken once the driver's turn machine accepts it. Its answer need not
    survive the driver: a takeover reruns the step and the client is asked
    again under a new call id.
    """
    return COMMANDS[type(command)].landmark


def _what(command: object) -> str:
    """The command as the client would name it, for messages."""
    return COMMANDS[type(command)].what


class _Logged:
    """A subscriber that waits for the first event of one kind to be logged.

    The driver answers "taken" only once the command's event is in the log,
    so a command answered for cannot die with the driver.
    """

    def __init__(self, kind: type[Event]) -> None:
        self._kind = kind
        self.seen: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def deliver(self, entries: Sequence[LogEntry]) -> None:
        if self.seen.done():
            return
        for entry in entries:
            if isinstance(decode_event(entry.data), self._kind):
                self.seen.set_result(True)
                return

    def notify(self, event: Error) -> None:
        pass  # a store outage: the event is held and logged later

    def deliver_audio(self, frame: bytes) -> None:
        pass  # speech is not an event: only logged events show a command took effect

    def session_lost(self, reason: str) -> None:
        if not self.seen.done():
            self.seen.set_result(False)

    def switch_source(self, source: EventSource) -> None:
        pass  # only followers switch


class CommandRelay:
    """Both ends of forwarding on one node: sending commands, running those sent here."""

    def __init__(
        self,
        store: Store,
        node_id: str,
        *,
        lease_ttl: float,
        runtimes: Mapping[str, SessionRuntime],
        connections: Mapping[str, ClientConnectionLike],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        drive: Callable[[str], Awaitable[SessionRuntime | None]],
    ) -> None:
        """``runtimes`` and ``connections`` are the node's live indexes (read
        only); ``drive(sid)`` takes a session over if its lease is free."""
        self.store = store
        self._drive = drive
        self.node_id = node_id
        self.lease_ttl = lease_ttl
        self._runtimes = runtimes
        self._connections = connections
        self._spawn = spawn
        self._answers: dict[str, asyncio.Future[Reply]] = {}  # ref -> awaited answer
        # ref -> the answer given (None: still being handled, that one answers)
        self._handled: OrderedDict[str, Reply | None] = OrderedDict()

    # ------------------------------------------------------------ sending side

    async def forward(self, sid: str, frame: bytes, conn: str) -> bool:
        """Hand a client's command to the node driving ``sid``; False: run it here.

        True once the command's fate is settled: the driver took it, or its
        answer (or our refusal) went to the client. False when no other node
        drives the session and the command did not run: the caller takes the
        session over and runs it. Raises ``StoreUnavailable``.
        """
        store = self.store
        owner = await store.lease_owner(sid)
        if owner is None or owner == self.node_id:
            return False
        command = decode_client(frame)
        if not isinstance(command, FORWARDED):
            return False  # the connection forwards nothing else
        since = await store.last_seq(sid)  # the command's event, if it runs, comes after
        ref = uuid.uuid4().hex
        data = encode_control(
            Forward(sid=sid, command=frame, origin=self.node_id, conn=conn, ref=ref)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_ttl + GIVE_UP_AFTER
        maybe_ran_on: str | None = None  # a node that got the command and did not answer
        try:
            while True:
                if maybe_ran_on is not None and owner != maybe_ran_on:
                    # It lost the lease. Once another node holds it, the silent
                    # one can write no more (appends are fenced): the log is final.
                    if owner is None and await self._drive(sid) is not None:
                        owner = self.node_id
                    if owner is not None:
                        if await self._ran_since(sid, since, command):
                            return True
                        maybe_ran_on = None
                if maybe_ran_on is None and owner in (None, self.node_id):
                    log.info("session %s: no other node drives it now: running a command here", sid)
                    return False
                if loop.time() >= deadline:
                    break
                answer = self._answers[ref] = loop.create_future()
                if owner is None:
                    await asyncio.sleep(LOOK_AGAIN)  # freed and taken again meanwhile: look again
                elif await store.publish(node_channel(owner), data):
                    await asyncio.wait({answer}, timeout=ACK_WAIT)
                    if not answer.done():
                        maybe_ran_on = owner
                    elif not answer.result().retry:
                        self._pass_on(answer.result())
                        return True
                    else:
                        await asyncio.sleep(LOOK_AGAIN)  # its lease is being released
                else:
                    await asyncio.sleep(LOOK_AGAIN)  # nobody listens: wait for the lease
                owner = await store.lease_owner(sid)
        finally:
            self._answers.pop(ref, None)
        log.warning("session %s: node %s holds it but did not answer a command", sid, owner)
        self._pass_on(
            Reply(
                conn=conn,
                error=encode(
                    answering(
                        Error(
                            code="store",
                            content=f"node {owner or '?'} drives this session but did not "
                            f"confirm your {_what(command)} within "
                            f"{self.lease_ttl + GIVE_UP_AFTER:g}s; it may still take effect — "
                            "if no event for it arrives, send it again",
                        ),
                        command,
                    )
                ),
            )
        )
        return True

    async def _ran_since(self, sid: str, since: int, command: object) -> bool:
        """Whether the log after ``since`` shows ``command`` took effect.

        A `user` event with the same text (a `cancelled` event for a cancel):
        text identical to another message sent meanwhile would look the same,
        but then that message's turn ran and this one would have been refused.
        """
        kind = _landmark(command)
        if kind is None:
            return False  # run here: the new driver answers it (unknown_call after a rerun)
        for entry in await self.store.read_log(sid, since):
            event = decode_event(entry.data)
            if isinstance(event, kind) and (
                not isinstance(command, UserMessage)
                or (isinstance(event, User) and event.content == command.content)
            ):
                return True
        return False

    async def ask_to_hand_over(self, sid: str) -> None:
        """A client here sends audio for ``sid``, driven elsewhere: ask its driver
        to hand it over (it does if its own clients are quiet). Raises ``StoreError``."""
        owner = await self.store.lease_owner(sid)
        if owner is None or owner == self.node_id:
            return
        await self.store.publish(
            node_channel(owner), encode_control(Handoff(sid=sid, origin=self.node_id))
        )

    def _pass_on(self, reply: Reply) -> None:
        target = self._connections.get(reply.conn)
        if target is not None and reply.error:
            target.reply_frame(reply.error)

    # ------------------------------------------------------------ both sides

    def on_message(self, data: bytes) -> None:
        """A message on this node's channel (called by the store's listener)."""
        message = decode_control(data)
        if message is None:
            log.warning("ignoring an unreadable control message (%d bytes)", len(data))
        elif isinstance(message, Reply):
            self._on_reply(message)
        elif isinstance(message, Forward):
            self._spawn(self._run_forwarded(message), f"forwarded:{message.sid}")
        elif isinstance(message, Handoff):
            self._spawn(self._hand_over(message), f"handoff:{message.sid}")
        else:  # Deleted and KeysChanged travel on channels of their own, never here
            log.warning("ignoring a %s message on a node channel", type(message).__name__)

    def _on_reply(self, reply: Reply) -> None:
        if reply.ref:
            answer = self._answers.get(reply.ref)
            if answer is not None and not answer.done():
                answer.set_result(reply)
            elif reply.error:
                self._pass_on(reply)  # late, but still news; a late retry is not
            return
        # From a node that sends no refs.
        target = self._connections.get(reply.conn)
        if target is not None and reply.retry:
            target.redispatch(reply.retry)
        elif target is not None:
            target.reply_frame(reply.error)

    # ------------------------------------------------------------ driving side

    async def _run_forwarded(self, message: Forward) -> None:
        ref = message.ref
        if ref and ref in self._handled:
            given = self._handled[ref]
            if given is not None:  # a resent copy: answer again, run nothing
                await self._send(message.origin, given)
            return
        runtime = self._runtimes.get(message.sid)
        if runtime is None or runtime.closed:
            # Not driven here any more: the origin node can take it over.
            await self._send(
                message.origin, Reply(conn=message.conn, ref=ref, retry=message.command)
            )
            return
        command = decode_client(message.command)
        if not isinstance(command, FORWARDED):
            return
        if ref:
            self._handled[ref] = None
            while len(self._handled) > _REMEMBERED:
                self._handled.popitem(last=False)
        reply = await self._run(runtime, command, message)
        if ref and reply is not None:
            if reply.retry:
                self._handled.pop(ref, None)  # nothing was done: a copy is run afresh
            else:
                self._handled[ref] = reply
        # None: the command runs but its event is not logged yet; copies stay
        # unanswered (and unrun) and the sender tells its client in the end.
        if reply is not None and (ref or reply.error or reply.retry):
            await self._send(message.origin, reply)

    async def _run(
        self, runtime: SessionRuntime, command: object, message: Forward
    ) -> Reply | None:
        """Run ``command``; the answer, or None when its event did not show up in time."""
        conn, ref = message.conn, message.ref
        landmark = _landmark(command)
        if landmark is None:
            error = await dispatch(command, runtime)
            if error is not None:
                return Reply(conn=conn, ref=ref, error=encode(error))
            return Reply(conn=conn, ref=ref)  # taken: the machine holds it
        watch = _Logged(landmark)
        runtime.attach(watch)
        try:
            # The origin checked that this client may send it (configure: an API key).
            error = await dispatch(command, runtime)
            if error is not None:
                return Reply(conn=conn, ref=ref, error=encode(error))
            if not ref:
                return Reply(conn=conn)  # the sender expects no answer
            done, _ = await asyncio.wait({watch.seen}, timeout=self.lease_ttl + GIVE_UP_AFTER)
            if not done:
                return None  # the store is slow or down: the sender tells its client
            if watch.seen.result():
                return Reply(conn=conn, ref=ref)
            # The session closed here before the event was logged: not run.
            return Reply(conn=conn, ref=ref, retry=message.command)
        finally:
            runtime.detach(watch)

    async def _hand_over(self, message: Handoff) -> None:
        runtime = self._runtimes.get(message.sid)
        if runtime is None or runtime.closed or not runtime.quiet_for(HANDOFF_QUIET):
            return  # not ours, or a microphone here is live: it keeps the session
        log.info(
            "session %s: handing it to node %s, where its user's audio comes from",
            message.sid,
            message.origin,
            extra={"sid": message.sid},
        )
        await runtime.close(f"voice moved to node {message.origin}")

    async def _send(self, node: str, reply: Reply) -> None:
        with contextlib.suppress(StoreError):
            await self.store.publish(node_channel(node), encode_control(reply))
