"""The simulator: the deterministic model of ``gateway.sim.model`` behind a realtime wire.

Two flavours share one model (``sim_reply``), one pacing (``Pacer``) and one
set of knobs (``SimConfig``), so a scripted conversation gives the same text
on either provider:

- ``openai`` (this module): serves ``/v1/realtime`` the way the OpenAI
  Realtime (GA) API does, so the OpenAI adapter is tested end to end over real
  sockets and the official ``openai`` SDK can connect to it
  (``AsyncOpenAI(websocket_base_url=sim.url)``). Frames are the Structs of
  ``gateway.upstream.openai_wire``: one definition of the wire for both sides.
- ``gemini`` (``gateway.sim.gemini``): serves the Gemini Live
  ``BidiGenerateContent`` endpoint.

``serve_sim(SimConfig(flavor=...))`` runs either; ``gateway sim --flavor``
on the command line.

Knobs (``SimConfig``) shape timing and faults for load and failure tests:
tokens per second, chunk size, first-token delay, dropping the TCP connection
after N deltas, an API key to enforce, and (Gemini) a ``goAway``.

Voice (see ``gateway.sim.model`` for what the model hears and says):
``input_audio_buffer.append`` (base64 PCM16 24 kHz), ``.commit``, ``.clear``;
with ``session.audio.input.turn_detection`` ``server_vad`` (the default, as
on the API) the simulated VAD sends ``input_audio_buffer.speech_started`` /
``speech_stopped``, commits the speech as a user item (``committed``, the
item, and ``conversation.item.input_audio_transcription.completed`` when
``audio.input.transcription`` is set), answers it (``create_response``) and
cancels a running response when speech starts (``interrupt_response``;
``response.done`` ``cancelled``, reason ``turn_detected``). With
``turn_detection: null`` the client commits and asks for the response.
Audio output (a ``session.update`` with ``output_modalities: ["audio"]``;
the sim answers in text until a client asks for audio, unlike the API)
streams ``response.output_audio.delta`` and
``response.output_audio_transcript.delta``; a function declared in
``session.tools`` is called natively (a ``function_call`` item,
``response.function_call_arguments.delta``/``done``), and a
``function_call_output`` item plus ``response.create`` gets the answer.

Cost per connection is one handler task (the reader) plus, while a response
runs, one generator task; there is no task or timer per token beyond the one
sleep that paces it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway.sim.model import (
    Pacer,
    Sim,
    SimCall,
    SimConnection,
    SimConversation,
    SimItem,
    sim_reply,
    simulated_usage_tokens,
    speech_transcript,
    spoken_reply,
    tool_answer,
    voice_audio,
)
from gateway.sim.openai_items import Conversation
from gateway.sim.openai_state import (
    DEFAULT_TURN_DETECTION,
    INPUT_RATE,
    Item,
    RealtimeResponse,
    bad_frame,
    from_flat,
    merge_audio,
    session_refusal,
    shape_refusal,
    wire_item,
)
from gateway.sim.openai_voice import VoiceInput
from gateway.upstream import openai_wire as wire

__all__ = ["DEFAULT_MODEL", "RealtimeConnection"]

log = logging.getLogger(__name__)

_PartEvent = TypeVar("_PartEvent", bound=msgspec.Struct)

PATH: Final = "/v1/realtime"
DEFAULT_MODEL: Final = "gpt-realtime-2.1"


class RealtimeConnection(SimConnection):
    """One client connection: its conversation, and at most one running response."""

    __slots__ = (
        "_event_ids",
        "_ids",
        "audio_out",
        "conversation",
        "deltas_sent",
        "flat",
        "no",
        "response",
        "session",
        "sim",
        "voice_in",
        "ws",
    )

    def __init__(
        self, sim: Sim, ws: ServerConnection, no: int, model: str, *, flat: bool = False
    ) -> None:
        """``flat``: sessions come in xAI's flat shape (no ``type``; ``voice`` and
        ``turn_detection`` at the top), not OpenAI's GA shape."""
        self.sim = sim
        self.flat = flat
        self.ws = ws
        self.no = no
        self.conversation = Conversation(self, sim)
        self.session = wire.Session(
            type="realtime",
            id=f"sess_sim{no}",
            object="realtime.session",
            model=model,
            instructions="",
            output_modalities=["audio"],
            max_output_tokens="inf",
            audio=wire.AudioConfig(
                input=wire.AudioInput(
                    format=wire.AudioFormat(rate=INPUT_RATE),
                    transcription=None,
                    turn_detection=DEFAULT_TURN_DETECTION,
                ),
                output=wire.AudioOutput(
                    format=wire.AudioFormat(rate=INPUT_RATE), voice="alloy", speed=1.0
                ),
            ),
            tools=[],
            tool_choice="auto",
        )
        self.response: RealtimeResponse | None = None
        self.deltas_sent = 0
        # Until a client asks for audio output the sim answers in text (see the docstring).
        self.audio_out = False
        self.voice_in = VoiceInput(self, sim.config)
        self._event_ids = itertools.count(1)
        self._ids = itertools.count(1)

    # --- plumbing -----------------------------------------------------------------

    def _eid(self) -> str:
        return f"event_{self.no}_{next(self._event_ids)}"

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_sim{self.no}_{next(self._ids)}"

    def _part_event(
        self, make: Callable[..., _PartEvent], response: RealtimeResponse, **fields: Any
    ) -> _PartEvent:
        """One of the response's per-part events: the ids and indexes every one of them repeats."""
        return make(
            event_id=self._eid(),
            response_id=response.id,
            item_id=response.item.id,
            output_index=0,
            content_index=0,
            **fields,
        )

    async def _send(self, event: wire.ServerEvent) -> None:
        await self.ws.send(wire.encode(event), text=True)

    async def _error(
        self,
        message: str,
        *,
        code: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        detail = wire.ErrorDetail(
            type=kind, message=message, code=code, param=param, event_id=event_id
        )
        await self._send(wire.ErrorEvent(event_id=self._eid(), error=detail))

    def snapshot(self) -> SimConversation:
        items = [
            SimItem(i.id, i.role if i.kind == "message" else i.kind, i.text, i.status)
            for i in self.conversation.items.values()
        ]
        return SimConversation(instructions=self.session.instructions or "", items=items)

    # --- the connection's life ----------------------------------------------------

    def forget(self) -> None:
        self.conversation.items.clear()
        self.voice_in.clear()  # the speech it was hearing, if any

    async def greet(self) -> None:
        await self._send(wire.SessionCreated(event_id=self._eid(), session=self.session))

    async def stop(self) -> None:
        self.voice_in.stop_idle()
        response, self.response = self.response, None
        if response is not None and response.task is not None and not response.task.done():
            response.task.cancel()
            await asyncio.wait([response.task])

    async def _dispatch(self, data: bytes) -> None:
        try:
            event = wire.decode_client_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._send(wire.ErrorEvent(event_id=self._eid(), error=bad_frame(data, exc)))
            return
        if isinstance(event, wire.InputAudioBufferAppend):
            await self.voice_in.append(event)
        elif isinstance(event, wire.ConversationItemCreate):
            await self.conversation.create(event)
        elif isinstance(event, wire.ResponseCreate):
            await self._response_create(event)
        elif isinstance(event, wire.ResponseCancel):
            await self._response_cancel(event)
        elif isinstance(event, wire.ConversationItemDelete):
            await self.conversation.delete(event)
        elif isinstance(event, wire.InputAudioBufferCommit):
            await self.voice_in.commit(event)
        elif isinstance(event, wire.InputAudioBufferClear):
            self.voice_in.clear()
            await self._send(wire.InputAudioBufferCleared(event_id=self._eid()))
        elif isinstance(event, wire.ConversationItemTruncate):
            await self.conversation.truncate(event)
        else:
            await self._session_update(event)

    # --- client events ------------------------------------------------------------

    async def _session_update(self, event: wire.SessionUpdate) -> None:
        update = event.session
        shape = shape_refusal(update, self.flat)
        if shape is not None:
            await self._error(
                shape[0], code="invalid_value", param=shape[1], event_id=event.event_id
            )
            return
        if self.flat:
            update = from_flat(update)
        refused = session_refusal(update)
        if refused is not None:
            await self._error(
                refused[0], code="invalid_value", param=refused[1], event_id=event.event_id
            )
            return
        changes: dict[str, object] = {}
        for name in (
            "model",
            "instructions",
            "output_modalities",
            "max_output_tokens",
            "tools",
            "tool_choice",
            "truncation",
            "reasoning",
        ):
            value = getattr(update, name)
            if value is not None:
                changes[name] = value
        if update.output_modalities is not None:
            self.audio_out = "audio" in update.output_modalities
        if update.audio is not None:
            changes["audio"] = merge_audio(self.session.audio, update.audio)
        self.session = msgspec.structs.replace(self.session, **changes)
        await self._send(wire.SessionUpdated(event_id=self._eid(), session=self.session))

    async def _response_create(self, event: wire.ResponseCreate) -> None:
        if self.response is not None:
            await self._error(
                f"Conversation already has an active response in progress: "
                f"{self.response.id}. Wait until the response is finished before creating "
                "a new one.",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
            return
        await self._start_response()

    def _reply(self) -> str | SimCall:
        """What the model answers: the last user message, or the output of its last call."""
        config = self.sim.config
        for item in reversed(self.conversation.items.values()):
            if item.kind == "function_call_output":
                name = next(
                    (
                        i.name
                        for i in self.conversation.items.values()
                        if i.kind == "function_call" and i.call_id == item.call_id
                    ),
                    "unknown",
                )
                return tool_answer(name, item.text)
            if item.kind == "message" and item.role == "user":
                held = sum(1 for i in self.conversation.items.values() if i.kind == "message")
                if not self.audio_out:
                    return sim_reply(
                        item.text,
                        overrun=config.overrun,
                        instructions=self.session.instructions or "",
                        items=held,
                    )
                functions = frozenset(t.name for t in self.session.tools or () if t.name)
                return spoken_reply(
                    item.text, functions, items=held, instructions=self.session.instructions or ""
                )
        return sim_reply("", overrun=config.overrun) if not self.audio_out else spoken_reply("")

    async def _start_response(self) -> None:
        reply = self._reply()
        context = len(self.session.instructions or "") + sum(
            len(i.text) for i in self.conversation.items.values()
        )
        previous = next(reversed(self.conversation.items), None)
        modalities = ["audio"] if self.audio_out else ["text"]
        if isinstance(reply, SimCall):
            item = Item(
                self._new_id("item"),
                "assistant",
                "",
                "in_progress",
                kind="function_call",
                call_id=self._new_id("call"),
                name=reply.name,
            )
            text = reply.arguments
        else:
            part = "output_audio" if self.audio_out else "output_text"
            item = Item(self._new_id("item"), "assistant", "", "in_progress", part=part)
            text = reply
        self.conversation.items[item.id] = item
        response = RealtimeResponse(
            self._new_id("resp"),
            item,
            text,
            simulated_usage_tokens(context),
            audio=self.audio_out,
            call=isinstance(reply, SimCall),
        )
        self.response = response  # before any await: a second create is refused
        self.sim.stats.responses_total += 1
        created = wire.Response(
            id=response.id,
            status="in_progress",
            conversation_id=f"conv_sim{self.no}",
            output_modalities=modalities,
            max_output_tokens="inf",
        )
        added = wire_item(item)
        if item.kind == "message":
            added.content = []
        await self._send(wire.ResponseCreated(event_id=self._eid(), response=created))
        await self._send(
            wire.ResponseOutputItemAdded(
                event_id=self._eid(), response_id=response.id, output_index=0, item=added
            )
        )
        await self._send(
            wire.ConversationItemAdded(event_id=self._eid(), item=added, previous_item_id=previous)
        )
        if not response.call:
            empty = (
                wire.ContentPart(type="audio", transcript="")
                if response.audio
                else wire.ContentPart(type="text", text="")
            )
            await self._send(self._part_event(wire.ResponseContentPartAdded, response, part=empty))
        if self.response is response:
            response.task = asyncio.create_task(self._generate(response))

    async def _response_cancel(self, event: wire.ResponseCancel) -> None:
        response = self.response
        if (
            response is None
            or response.finishing
            or (event.response_id is not None and event.response_id != response.id)
        ):
            await self._error(
                "Cancellation failed: no active response found.",
                code="response_cancel_not_active",
                event_id=event.event_id,
            )
            return
        await self._cancel(response, "client_cancelled")

    async def _cancel(self, response: RealtimeResponse, reason: str) -> None:
        task = response.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        if self.response is response and not response.finishing:
            response.finishing = True
            await self._finish(response, "cancelled", reason)

    # --- generation ---------------------------------------------------------------

    async def _generate(self, response: RealtimeResponse) -> None:
        config = self.sim.config
        try:
            pacer = Pacer(config)
            await pacer.begin()
            if self._drop_due():
                return
            text, size, total = response.text, config.chunk_size, len(response.text)
            stats = self.sim.stats
            while response.sent < total:
                await pacer.wait(response.deltas)
                chunk = text[response.sent : response.sent + size]
                # Count before the send: the frame is written before ``send`` can suspend.
                response.sent += len(chunk)
                response.deltas += 1
                self.deltas_sent += 1
                stats.deltas_total += 1
                await self._send_delta(response, chunk)
                if self._drop_due():
                    return
            response.finishing = True
            await self._finish(response, "completed")
        except ConnectionClosed:
            pass

    async def _send_delta(self, response: RealtimeResponse, chunk: str) -> None:
        rid, iid = response.id, response.item.id
        if response.call:
            await self._send(
                wire.ResponseFunctionCallArgumentsDelta(
                    event_id=self._eid(),
                    response_id=rid,
                    item_id=iid,
                    output_index=0,
                    call_id=response.item.call_id,
                    delta=chunk,
                )
            )
            return
        if response.audio:
            audio = voice_audio(len(chunk), self.sim.config, self.speed)
            await self._send(self._part_event(wire.ResponseOutputAudioDelta, response, delta=audio))
            await self._send(
                self._part_event(wire.ResponseOutputAudioTranscriptDelta, response, delta=chunk)
            )
            return
        await self._send(self._part_event(wire.ResponseOutputTextDelta, response, delta=chunk))

    def _drop_due(self) -> bool:
        return self.sim.drop_due(self.no, self.ws, self.deltas_sent)

    async def _finish(
        self, response: RealtimeResponse, status: str, reason: str = "client_cancelled"
    ) -> None:
        """The closing events of ``response``, ending with ``response.done``."""
        item = response.item
        text = response.text[: response.sent]
        item.text = text
        item.status = "completed" if status == "completed" else "incomplete"
        rid, iid = response.id, item.id
        done_item = wire_item(item)
        if response.call:
            await self._send(
                wire.ResponseFunctionCallArgumentsDone(
                    event_id=self._eid(),
                    response_id=rid,
                    item_id=iid,
                    output_index=0,
                    call_id=item.call_id,
                    name=item.name,
                    arguments=text,
                )
            )
        elif response.audio:
            await self._send(self._part_event(wire.ResponseOutputAudioDone, response))
            await self._send(
                self._part_event(wire.ResponseOutputAudioTranscriptDone, response, transcript=text)
            )
        else:
            await self._send(self._part_event(wire.ResponseOutputTextDone, response, text=text))
        if not response.call:
            part = (
                wire.ContentPart(type="audio", transcript=text)
                if response.audio
                else wire.ContentPart(type="text", text=text)
            )
            await self._send(self._part_event(wire.ResponseContentPartDone, response, part=part))
        await self._send(
            wire.ResponseOutputItemDone(
                event_id=self._eid(), response_id=rid, output_index=0, item=done_item
            )
        )
        if iid in self.conversation.items:
            await self._send(wire.ConversationItemDone(event_id=self._eid(), item=done_item))
        usage = wire.ResponseUsage(
            total_tokens=response.input_tokens + response.deltas,
            input_tokens=response.input_tokens,
            output_tokens=response.deltas,
            input_token_details=wire.InputTokenDetails(text_tokens=response.input_tokens),
            output_token_details=(
                wire.OutputTokenDetails(audio_tokens=response.deltas)
                if response.audio
                else wire.OutputTokenDetails(text_tokens=response.deltas)
            ),
        )
        details = (
            None if status == "completed" else wire.StatusDetails(type="cancelled", reason=reason)
        )
        done = wire.Response(
            id=rid,
            status=status,
            status_details=details,
            output=[done_item],
            conversation_id=f"conv_sim{self.no}",
            output_modalities=["audio"] if response.audio else ["text"],
            max_output_tokens="inf",
            usage=usage,
        )
        # The response stops being active as response.done is written: a
        # response.create sent by a client that saw it is then accepted.
        if self.response is response:
            self.response = None
        await self._send(wire.ResponseDone(event_id=self._eid(), response=done))
        if status == "completed":
            self.voice_in.start_idle()
        await self._send(
            wire.RateLimitsUpdated(
                event_id=self._eid(),
                rate_limits=[
                    wire.RateLimit("requests", 5000, 4999, 0.012),
                    wire.RateLimit("tokens", 400000, 400000 - usage.total_tokens, 0.5),
                ],
            )
        )

    # --- audio in (gateway.sim.openai_voice) -------------------------------------

    @property
    def speed(self) -> float:
        """How fast the session's voice speaks (``audio.output.speed``; 1.0 normal)."""
        audio = self.session.audio
        out = audio.output if audio is not None else None
        return out.speed if out is not None and out.speed else 1.0

    @property
    def ms_per_char(self) -> float:
        return self.sim.config.audio_ms_per_char / self.speed

    def turn_detection(self) -> wire.TurnDetection | None:
        audio = self.session.audio
        detection = audio.input.turn_detection if audio and audio.input else None
        return None if isinstance(detection, msgspec.UnsetType) else detection

    @property
    def responding(self) -> bool:
        return self.response is not None

    async def cancel_response(self, reason: str) -> None:
        if self.response is not None:
            await self._cancel(self.response, reason)

    async def start_response(self) -> None:
        await self._start_response()

    async def commit_speech(self, item_id: str, speech: int) -> None:
        """The heard speech becomes a user item: committed, the item, its transcript."""
        transcript = speech_transcript(speech)
        previous = next(reversed(self.conversation.items), None)
        await self._send(
            wire.InputAudioBufferCommitted(
                event_id=self._eid(), item_id=item_id, previous_item_id=previous
            )
        )
        await self.conversation.add(
            Item(item_id, "user", transcript, "completed", part="input_audio"), None
        )
        audio = self.session.audio
        if audio is not None and audio.input is not None and audio.input.transcription:
            await self._send(
                wire.InputAudioTranscriptionCompleted(
                    event_id=self._eid(),
                    item_id=item_id,
                    content_index=0,
                    transcript=transcript,
                    usage=wire.TranscriptionUsage(type="duration", seconds=speech / 1000),
                )
            )
