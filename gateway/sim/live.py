"""The simulator's GPT-Live flavour: ``/v1/live/sessions`` beside ``/v1/realtime``.

Served by ``OpenAISim`` on the same port as Realtime (as OpenAI serves both),
with the one model of ``gateway.sim.model``, and refusing what the service
refuses (docs/providers.md, "GPT-Live", has the sources):

- a command before ``session.start`` (``error`` ``session_not_started``: send
  ``session.start`` first and wait for ``session.started``);
- a ``session.start`` whose session has a field the SDK does not know (the
  session object is strict: ``error`` ``unknown_parameter`` naming it), or
  whose model is not a GPT-Live model (``unsupported_model``; a Realtime
  model belongs on ``/v1/realtime``, which in turn refuses ``gpt-live-*``);
  either closes the connection, as no session started;
- ``response.item.create``/``response.create`` without Responses delegation.

What the model does (the same words as the other flavours):

- it hears speech (energy VAD, ``gateway.sim.vad``) and transcribes it as
  ``session.input_transcript.delta`` (``(speech`` when it starts, `` 1.2 s)``
  when it ends), then answers it; speech while it talks stops its talking;
- a ``session.commentary.append`` with the gateway's typed-message prefix is a
  typed message, answered aloud; any other general commentary is said as is;
- it answers in ``session.output_transcript.delta`` pieces, each with
  ``session.output_audio.delta`` (a tone, in the session's format), then
  ``session.usage.updated``;
- ``/tool NAME {args}`` delegates: with ``client`` delegation a
  ``session.delegation.created`` (the model says "One moment.") answered by a
  commentary with its id ("Here is what I found: …"); with ``responses``
  delegation and a function NAME in the backend's tools, a ``response.event``
  stream with the function call, answered by ``response.item.create`` +
  ``response.create`` (``The tool NAME returned OUTPUT.``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Final

import msgspec
from websockets.asyncio.server import ServerConnection

from gateway.common.pcm import mulaw_decode, mulaw_encode, resample
from gateway.sim.model import (
    VOICE_RATE,
    Pacer,
    Sim,
    SimCall,
    SimConnection,
    SimConversation,
    SimItem,
    speech_transcript,
    spoken_reply,
    tool_answer,
    voice_audio,
)
from gateway.sim.vad import FRAME_MS, Vad, VadStart
from gateway.upstream import live_wire as wire
from gateway.upstream.live import is_live_model
from gateway.upstream.live_conversation import TYPED_PREFIX

__all__ = ["LiveConnection"]

log = logging.getLogger("gateway.sim")

SESSION_SECONDS: Final = 3600  # how long a simulated session lives (``expires_at``)
ASK_BARE_PREFIX: Final = "Answer the caller's last message"


def _unknown_field(exc: Exception) -> str | None:
    """The path of an unknown field in msgspec's message (``Object contains unknown field
    `x` - at `$.session.audio```), as the service's ``param`` names it."""
    text = str(exc)
    if "unknown field" not in text:
        return None
    name = text.split("`")[1] if text.count("`") >= 2 else ""
    where = text.rsplit("at `$", 1)[1].rstrip("`") if "at `$" in text else ""
    return f"{where.lstrip('.')}.{name}".lstrip(".")


class LiveConnection(SimConnection):
    """One client of the GPT-Live flavour: a session, a timeline, at most one utterance."""

    def __init__(self, sim: Sim, ws: ServerConnection, no: int) -> None:
        self.sim = sim
        self.ws = ws
        self.no = no
        self.session: wire.SessionResource | None = None
        self.config: wire.SessionConfig | None = None
        self.items: list[SimItem] = []
        self.vad: Vad | None = None
        self.format = wire.AudioFormat(type="audio/pcm", rate=VOICE_RATE)
        self.speaking: asyncio.Task[None] | None = None
        self.timeline_ms = 0  # the session's clock: audio heard and said
        self.started_at = time.monotonic()
        self.delegations: dict[str, str] = {}  # id -> target, not answered yet
        self.backend_calls: dict[str, str] = {}  # call_id -> function name
        self.outputs: list[tuple[str, str]] = []  # (name, output) returned, not answered yet
        self.deltas_sent = 0  # for the ``drop_after`` fault
        self._ids = itertools.count(1)

    # --- plumbing -----------------------------------------------------------------

    def forget(self) -> None:
        self.items.clear()

    def _eid(self) -> str:
        return f"event_live{self.no}_{next(self._ids)}"

    async def _send(self, event: wire.ServerEvent) -> None:
        await self.ws.send(wire.encode(event), text=True)

    async def _error(
        self, code: str, message: str, *, param: str | None = None, client: str | None = None
    ) -> None:
        detail = wire.ErrorDetail(
            code=code,
            message=message,
            type="invalid_request_error",
            param=param,
            client_event_id=client,
        )
        await self._send(
            wire.ErrorEvent(event_id=self._eid(), error=detail, client_event_id=client)
        )

    def snapshot(self) -> SimConversation:
        instructions = self.config.instructions or "" if self.config is not None else ""
        return SimConversation(instructions=instructions, items=list(self.items))

    async def stop(self) -> None:
        await self._hush()

    async def _hush(self) -> None:
        task, self.speaking = self.speaking, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])

    # --- commands -----------------------------------------------------------------

    async def _dispatch(self, data: bytes) -> None:
        try:
            event = wire.decode_client_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._bad_frame(data, exc)
            return
        if self.session is None:
            if isinstance(event, wire.SessionStart):
                await self._start(event)
            else:
                await self._error(
                    "session_not_started",
                    f"{event.__struct_config__.tag} before session.started: send session.start "
                    "first and wait for session.started",
                    client=getattr(event, "event_id", None),
                )
            return
        match event:
            case wire.SessionStart():
                await self._error(
                    "session_already_started",
                    "session.start was already accepted on this connection",
                    client=event.event_id,
                )
            case wire.InputAudioAppend():
                await self._hear(event.audio)
            case wire.CommentaryAppend():
                await self._send(self._appended(wire.CommentaryAppended, event.event_id))
                await self._commentary(event)
            case wire.ThinkingAppend():
                await self._send(self._appended(wire.ThinkingAppended, event.event_id))
                if event.delegation_id is not None:
                    self.delegations.pop(event.delegation_id, None)
                    self._say("I could not do that here.")
            case wire.InstructionsAppend():
                await self._send(self._appended(wire.InstructionsAppended, event.event_id))
            case wire.ResponseItemCreate() | wire.ResponseCreate():
                await self._backend(event)
            case wire.InputAudioMute():
                await self._send(wire.InputAudioMuted(event_id=self._eid()))
            case wire.InputAudioUnmute():
                await self._send(wire.InputAudioUnmuted(event_id=self._eid()))
            case wire.SessionUpdate():
                await self._send(wire.SessionUpdated(event_id=self._eid(), session=self.session))
            case wire.SessionClose():
                await self._close("close_requested")

    def _appended(
        self,
        kind: type[wire.CommentaryAppended]
        | type[wire.ThinkingAppended]
        | type[wire.InstructionsAppended],
        client: str | None,
    ) -> wire.ServerEvent:
        at = self.timeline_ms
        return kind(event_id=self._eid(), start_ms=at, end_ms=at, client_event_id=client)

    async def _bad_frame(self, data: bytes, exc: Exception) -> None:
        kind = ""
        try:
            kind = wire.event_type(data)
        except msgspec.DecodeError:
            await self._error("invalid_json", f"The frame is not a JSON object: {exc}")
            return
        unknown = _unknown_field(exc)
        if unknown is not None:
            await self._error(
                "unknown_parameter", f"Unknown parameter: '{unknown}'.", param=unknown
            )
        else:
            await self._error("invalid_request_error", f"Invalid {kind or 'event'}: {exc}")
        if kind == "session.start" and self.session is None:
            await self.ws.close(1008, "the session did not start")

    async def _start(self, event: wire.SessionStart) -> None:
        config = event.session
        model = config.model
        if not is_live_model(model):
            await self._error(
                "unsupported_model",
                f"The model '{model}' is not a GPT-Live model: Realtime models are served "
                "at /v1/realtime.",
                param="session.model",
                client=event.event_id,
            )
            await self.ws.close(1008, "the session did not start")
            return
        audio = config.audio.format if config.audio is not None else None
        if audio is not None:
            problem = _format_problem(audio)
            if problem is not None:
                await self._error(
                    "invalid_value", problem, param="session.audio.format", client=event.event_id
                )
                await self.ws.close(1008, "the session did not start")
                return
            self.format = audio
        self.config = config
        self.vad = Vad(
            self.format.rate,
            threshold=self.sim.config.vad_threshold,
            min_speech_ms=self.sim.config.vad_min_speech_ms,
            silence_ms=self.sim.config.vad_silence_ms,
        )
        for item in config.input or ():
            text = item.content[0].text if item.content else ""
            self.items.append(SimItem(id=f"item_{len(self.items)}", role=item.role, text=text))
        self.session = wire.SessionResource(
            id=f"sess_live{self.no}",
            expires_at=int(time.time()) + SESSION_SECONDS,
            model=model,
            instructions=config.instructions,
            audio=msgspec.to_builtins(config.audio) if config.audio is not None else None,
            delegation=msgspec.to_builtins(config.delegation or wire.Delegation(type="client")),
        )
        self.started_at = time.monotonic()
        await self._send(
            wire.SessionStarted(
                event_id=self._eid(), session=self.session, client_event_id=event.event_id
            )
        )

    async def _close(self, reason: str) -> None:
        await self._hush()
        assert self.session is not None
        await self._send(
            wire.SessionClosed(
                event_id=self._eid(), reason=reason, session=self.session, usage=self._usage()
            )
        )
        await self.ws.close()

    def _usage(self) -> wire.SessionUsage:
        return wire.SessionUsage(seconds=float(int(time.monotonic() - self.started_at)))

    # --- hearing ------------------------------------------------------------------

    async def _hear(self, audio: bytes) -> None:
        vad = self.vad
        assert vad is not None
        pcm = mulaw_decode(audio) if self.format.type == "audio/pcmu" else audio
        for found in vad.feed(pcm):
            at = found.offset_ms
            self.timeline_ms = max(self.timeline_ms, at)
            if isinstance(found, VadStart):
                await self._hush()  # the caller speaks: the model stops talking
                await self._heard("(speech", at, at + FRAME_MS)
            else:
                text = speech_transcript(found.speech_ms)
                await self._heard(text.removeprefix("(speech"), at, at)
                self._user(text)

    async def _heard(self, text: str, start: int, end: int) -> None:
        await self._send(
            wire.InputTranscriptDelta(event_id=self._eid(), delta=text, start_ms=start, end_ms=end)
        )

    def _user(self, message: str) -> None:
        self.items.append(SimItem(id=f"item_{len(self.items)}", role="user", text=message))
        self._answer(message)

    async def _commentary(self, event: wire.CommentaryAppend) -> None:
        content = event.content
        if event.delegation_id is not None:
            target = self.delegations.pop(event.delegation_id, None)
            if target != "client":
                await self._error(
                    "invalid_value",
                    f"No open client delegation {event.delegation_id!r} on this connection.",
                    param="delegation_id",
                    client=event.event_id,
                )
                return
            self._say(f"Here is what I found: {content}")
        elif content.startswith(TYPED_PREFIX):
            self._user(content.removeprefix(TYPED_PREFIX))
        elif content.startswith(ASK_BARE_PREFIX):
            last = next((i.text for i in reversed(self.items) if i.role == "user"), "")
            self._answer(last)
        else:
            self._say(content)

    # --- answering ----------------------------------------------------------------

    def _delegation_target(self) -> str:
        config = self.config
        return config.delegation.type if config and config.delegation else "client"

    def _backend_functions(self) -> frozenset[str]:
        config = self.config
        if config is None or config.delegation is None or config.delegation.responses is None:
            return frozenset()
        tools = config.delegation.responses.get("tools")
        if not isinstance(tools, list):
            return frozenset()
        return frozenset(
            str(t.get("name")) for t in tools if isinstance(t, dict) and t.get("type") == "function"
        )

    def _answer(self, message: str) -> None:
        if message.startswith("/tool") and message[5:6].isspace():
            target = self._delegation_target()
            if target == "client":
                delegation = f"deleg_live{self.no}_{next(self._ids)}"
                self.delegations[delegation] = "client"
                self._say("One moment.", delegation=delegation)
                return
            reply = spoken_reply(message, self._backend_functions())
            if isinstance(reply, SimCall):
                self._say("One moment.", call=reply)
                return
            self._say(reply)
            return
        reply = spoken_reply(message)
        self._say(reply if isinstance(reply, str) else "")

    def _say(
        self, text: str, *, delegation: str | None = None, call: SimCall | None = None
    ) -> None:
        old = self.speaking
        if old is not None and not old.done():
            old.cancel()
        self.speaking = asyncio.create_task(self._speak(text, delegation, call))

    async def _speak(self, text: str, delegation: str | None, call: SimCall | None) -> None:
        config = self.sim.config
        pacer = Pacer(config)
        await pacer.begin()
        if delegation is not None:
            await self._send(
                wire.DelegationCreated(
                    event_id=self._eid(),
                    delegation=wire.DelegationRef(id=delegation, target="client"),
                    offset_ms=self.timeline_ms,
                )
            )
        if call is not None:
            await self._delegate_to_backend(call)
        size = config.chunk_size
        for index, at in enumerate(range(0, len(text), size)):
            await pacer.wait(index)
            chunk = text[at : at + size]
            audio = voice_audio(len(chunk), config)
            start = self.timeline_ms
            end = start + int(len(chunk) * config.audio_ms_per_char)
            self.timeline_ms = end
            await self._send(
                wire.OutputTranscriptDelta(
                    event_id=self._eid(), delta=chunk, start_ms=start, end_ms=end
                )
            )
            await self._send(wire.OutputAudioDelta(delta=self._encode(audio)))
            self.sim.stats.deltas_total += 1
            self.deltas_sent += 1
            if self.sim.drop_due(self.no, self.ws, self.deltas_sent):
                return
        self.items.append(SimItem(id=f"item_{len(self.items)}", role="assistant", text=text))
        self.sim.stats.responses_total += 1
        await self._send(wire.SessionUsageUpdated(event_id=self._eid(), usage=self._usage()))

    def _encode(self, pcm24k: bytes) -> bytes:
        kind, rate = self.format.type, self.format.rate
        if kind == "audio/pcmu":
            return mulaw_encode(resample(pcm24k, VOICE_RATE, 8000))
        return pcm24k if rate == VOICE_RATE else resample(pcm24k, VOICE_RATE, rate)

    # --- Responses delegation -------------------------------------------------------

    async def _delegate_to_backend(self, call: SimCall) -> None:
        delegation = f"deleg_live{self.no}_{next(self._ids)}"
        response = f"resp_live{self.no}_{next(self._ids)}"
        call_id = f"call_live{self.no}_{next(self._ids)}"
        self.delegations[delegation] = "responses"
        self.backend_calls[call_id] = call.name
        await self._send(
            wire.DelegationCreated(
                event_id=self._eid(),
                delegation=wire.DelegationRef(
                    id=delegation, target="responses", response_id=response
                ),
                offset_ms=self.timeline_ms,
            )
        )
        item = {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        for inner in (
            {"type": "response.created", "response": {"id": response, "status": "in_progress"}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": {"id": response, "status": "completed"}},
        ):
            await self._send(
                wire.ResponseEvent(event_id=self._eid(), event=inner, delegation_id=delegation)
            )

    async def _backend(self, event: wire.ResponseItemCreate | wire.ResponseCreate) -> None:
        if self._delegation_target() != "responses":
            await self._error(
                "invalid_request_error",
                f"{event.__struct_config__.tag} requires Responses delegation.",
                client=event.event_id,
            )
            return
        if isinstance(event, wire.ResponseItemCreate):
            item = event.item
            call_id = str(item.get("call_id", ""))
            name = self.backend_calls.pop(call_id, None)
            if item.get("type") != "function_call_output" or name is None:
                await self._error(
                    "invalid_value",
                    f"No function call {call_id!r} waits for its output.",
                    param="item.call_id",
                    client=event.event_id,
                )
                return
            self.outputs.append((name, str(item.get("output", ""))))
            return
        answers, self.outputs = self.outputs, []
        self._say(" ".join(tool_answer(name, output) for name, output in answers))


def _format_problem(audio: wire.AudioFormat) -> str | None:
    if audio.type == "audio/pcm" and audio.rate not in (16000, 24000):
        return "audio/pcm takes a rate of 16000 or 24000 Hz."
    if audio.type == "audio/pcmu" and audio.rate != 8000:
        return "G.711 audio takes a rate of 8000 Hz."
    if audio.type == "audio/pcma":
        return "The simulator does not speak audio/pcma (the service does); use audio/pcmu."
    return None
