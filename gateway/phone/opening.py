"""A call's start: who may open it, what session it gets (before the call serves anything).

``open_call`` takes a stream's ``start`` and either refuses it (``Refused``:
the reason for the metrics, the message for the carrier's close frame, no
session touched) or returns the call's session, driven here and configured
for the phone: the one-time stream token checked, the media format checked,
the numbers file's plan applied (``gateway.phone.plans``), and the session
opened for the plan's owner — or the one the token names, whose own
configuration stays (only its audio changes).

Only signed data gives a call its owner and its session: the token (its
key, its session, the number called as the carrier signed it to the voice
webhook). A carrier's signature covers the stream's URL alone, so a
captured one can be replayed: a signed stream without a token is refused
unless the operator allows it (``--phone-no-require-token``), and then its
call belongs to the default key and may not name a session. A stream never
joins a call that is live: a second stream for the same session or the same
``CallSid`` is refused.

The node is reached through ``CallHost``: five named calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec

from gateway.phone.audio import CALL_RATE
from gateway.phone.plans import CallPlan, CallPlans
from gateway.phone.stream_tokens import StreamToken
from gateway.phone_settings import PhoneSettings
from gateway.sessions.runtime import SessionRuntime
from gateway.store.base import StoreError
from protocol.configuration import ConfigChange, InputAudio
from protocol.media_stream import Started

__all__ = [
    "REFUSED",
    "CallHost",
    "CallIdentity",
    "LiveCall",
    "Opened",
    "Opening",
    "Refused",
    "StreamTokenCheck",
    "open_call",
]

REFUSED: Final = 1008  # close code: policy, the stream is not let in
UNSUPPORTED: Final = 1003  # a media format the gateway does not take
UNAVAILABLE: Final = 1011

HANDOVER_WAIT: Final = 3.0
"""Seconds a call that resumes a session driven elsewhere waits for it to come here
(at least: a dead driver's lease must expire first, ``Opening.lease_ttl``)."""


class CallStore(Protocol):
    async def get_meta(self, sid: str) -> dict[str, str] | None: ...

    async def incr_window(self, key: str, amount: int, ttl: float) -> int: ...


class CallHost(Protocol):
    """What a call needs of its node: a few named calls (``Node`` has them)."""

    @property
    def store(self) -> CallStore: ...

    async def create_session(self, owner: str = "") -> SessionRuntime: ...

    async def record_session(self, sid: str, owner: str) -> None: ...

    async def drive(self, sid: str, *, owner: str = "") -> SessionRuntime | None: ...

    async def ask_to_hand_over(self, sid: str) -> None: ...


class StreamTokenCheck(Protocol):
    """Redeems a one-time stream token (``gateway.phone.admission.StreamTokens``)."""

    async def redeem(self, token: str, call: str) -> StreamToken | str:
        """The claims of a valid unused token for ``call``; else why not."""


class LiveCall(Protocol):
    """A call the node serves (``gateway.phone.call.PhoneCallConnection``)."""

    @property
    def call_id(self) -> str: ...


@dataclass(frozen=True)
class Opening:
    """What opening a call needs (one per node)."""

    host: CallHost
    settings: PhoneSettings
    plans: CallPlans
    tokens: StreamTokenCheck
    lease_ttl: float = 10.0  # a session of a dead node is free after this
    live: Mapping[str, LiveCall] = field(default_factory=dict)  # the node's calls by session

    def joins_a_live_call(self, sid: str, call: str) -> str | None:
        """Why a stream for session ``sid`` and ``CallSid`` ``call`` would join a call that
        is live on this node (a replayed or second stream), or None."""
        if sid and sid in self.live:
            return "the session already has a live call: a second stream cannot join it"
        if call and any(live.call_id == call for live in self.live.values()):
            return f"call {call[:64]!r} already has a live stream: a second cannot join it"
        return None


class Refused(Exception):
    """The stream is not let in: ``reason`` for the metrics, ``message`` for the carrier."""

    def __init__(self, reason: str, message: str, code: int = REFUSED) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = code


@dataclass(frozen=True)
class CallIdentity:
    """Whose call: the carrier's ids and the numbers (from ``start`` or its parameters)."""

    stream: str
    call: str
    account: str
    caller: str
    called: str


@dataclass(frozen=True)
class Opened:
    """A call let in: who it is, its plan, its session (driven here, configured)."""

    identity: CallIdentity
    plan: CallPlan
    runtime: SessionRuntime


_PHONE_AUDIO: Final = ConfigChange(
    input_audio=InputAudio(rate=CALL_RATE, turn_detection="server_vad"), output="audio"
)


async def open_call(
    opening: Opening, started: Started, *, signed: bool, url_token: str, settle: Callable[[], None]
) -> Opened:
    """The call of ``started`` (see the module docstring); raises ``Refused``.
    ``settle``: the connection has proved who it is (it no longer counts as pending)."""
    if started.encoding.lower() not in ("audio/x-mulaw", "pcmu") or started.rate != CALL_RATE:
        raise Refused(
            "media_format",
            f"the gateway takes audio/x-mulaw (PCMU) at {CALL_RATE} Hz; this stream is "
            f"{started.encoding} at {started.rate} Hz: set the stream's codec to PCMU",
            UNSUPPORTED,
        )
    custom = started.custom
    live = opening.joins_a_live_call("", started.call)
    if live is not None:
        raise Refused("call_live", live)
    claims = await _proof(opening, started, signed, url_token)
    settle()
    identity = CallIdentity(
        stream=started.stream,
        call=started.call,
        account=started.account,
        caller=custom.get("from", "") or started.caller,
        called=(claims.to if claims is not None else "") or custom.get("to", "") or started.called,
    )
    profile = custom.get("profile", "")
    if claims is not None and claims.to:
        profile = claims.profile  # a token that names the number (the webhook's) names it too
    plan = opening.plans.plan(identity.called, profile)
    # The owner is the token's (signed); without one, the default key's: an unsigned
    # parameter never moves a call to another owner's number.
    plan = dataclasses.replace(
        plan, owner=claims.key if claims is not None else opening.plans.default_key
    )
    # A token's own session, or one of its key's that the stream names (``_session``
    # checks the owner).
    sid = (claims.sid or custom.get("session_id", "")) if claims is not None else ""
    live = opening.joins_a_live_call(sid, started.call)
    if live is not None:
        raise Refused("call_live", live)
    runtime = await _session(opening, plan, sid)
    return Opened(identity, plan, runtime)


async def _proof(
    opening: Opening, started: Started, signed: bool, url_token: str
) -> StreamToken | None:
    """The stream token's claims (None: a signed stream let in without one, which the
    operator allowed), once the stream proved it may open; raises ``Refused``."""
    custom = started.custom
    token = custom.get("token", "") or url_token
    sid = custom.get("session_id", "")
    if not token:
        if not signed or opening.settings.require_token:
            why = (
                "its signature was not checked"
                if not signed
                else "a carrier's signature covers the URL only, so it can be replayed"
            )
            raise Refused(
                "unauthenticated",
                f'a stream needs a one-time token ({why}): put <Parameter name="token" '
                'value="…"/> from POST /v1/phone/tokens in the <Stream>, or use the TwiML '
                "helper (docs/phone.md)",
            )
        if sid:
            raise Refused(
                "unauthenticated",
                "a stream without a token cannot name a session: mint a token for it "
                "(POST /v1/phone/tokens with session_id) and put it in the <Stream>",
            )
        return None
    claims = await opening.tokens.redeem(token, started.call)
    if isinstance(claims, str):
        raise Refused("token", claims)
    if sid and claims.sid and sid != claims.sid:
        raise Refused("token", "the stream token is for another session than session_id")
    return claims


async def _session(opening: Opening, plan: CallPlan, sid: str) -> SessionRuntime:
    """The call's session, driven here and configured for the phone."""
    host = opening.host
    try:
        if sid:
            meta = await host.store.get_meta(sid)
            if meta is None:
                raise Refused("unknown_session", f"session {sid[:64]!r} does not exist or expired")
            if meta.get("owner", "") != plan.owner:
                raise Refused("forbidden", "the session belongs to another API key")
            runtime = await _drive_here(opening, sid)
            change = _PHONE_AUDIO  # the app's session keeps its own configuration
        else:
            runtime = await host.create_session(plan.owner)
            await host.record_session(runtime.sid, plan.owner)
            change = msgspec.structs.replace(
                plan.change, input_audio=_PHONE_AUDIO.input_audio, output="audio"
            )
    except StoreError:
        raise Refused(
            "store", "the session store is unavailable; call again", UNAVAILABLE
        ) from None
    error = await runtime.configure(change)
    if error is not None:
        raise Refused("config", f"the call's session cannot be set up: {error.content}")
    return runtime


async def _drive_here(opening: Opening, sid: str) -> SessionRuntime:
    """Voice is driven where its microphone is: ask the driving node to hand over."""
    host = opening.host
    deadline = time.monotonic() + max(HANDOVER_WAIT, opening.lease_ttl + 1.0)
    while True:
        runtime = await host.drive(sid)
        if runtime is not None:
            return runtime
        if time.monotonic() >= deadline:
            raise Refused(
                "driven_elsewhere",
                "another node drives the session and a live microphone keeps it there",
            )
        await host.ask_to_hand_over(sid)
        await asyncio.sleep(0.25)
