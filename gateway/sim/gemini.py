"""The Gemini Live flavour of the simulator: ``BidiGenerateContent`` over a WebSocket.

It serves ``/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent``
the way the Gemini API does, with the model, pacing and knobs of
``gateway.sim.model`` (the same text, in the same chunks, as the OpenAI
flavour), so the Gemini adapter is tested end to end over real sockets and
the official ``google-genai`` SDK can connect to it. Frames are the Structs
of ``gateway.upstream.gemini_wire``.

The protocol as served:

- The key comes as ``?key=KEY`` or the ``x-goog-api-key`` header (the SDK's
  way). With ``api_key`` set, a missing or wrong key is refused the way the
  API does it: the WebSocket handshake succeeds and the connection is closed
  (1007 "API key not valid. …") once the setup message arrives.
- The first message must be ``setup``: ``model`` ``models/NAME``,
  ``generationConfig.responseModalities`` ``["TEXT"]`` (the simulator writes
  text only), optional ``systemInstruction``. Answer: ``{"setupComplete": {}}``.
- ``clientContent`` appends its turns (roles ``user``/``model``); with
  ``turnComplete: true`` the model answers the last user turn: ``modelTurn``
  parts of ``chunk_size`` characters paced by ``tokens_per_second``, then
  ``generationComplete``, then ``turnComplete`` together with ``usageMetadata``.
- A ``clientContent`` arriving while the model writes interrupts it: the turn
  keeps the text sent so far, ``{"serverContent": {"interrupted": true}}`` is
  sent (no ``turnComplete`` for that turn), then the new content is processed.
- Invalid frames close the connection with 1007 and a reason in the API's
  words ("Invalid JSON payload received. Unknown name …"), as the real service
  does; field names are accepted in camelCase or snake_case (protobuf JSON).
- Knobs: ``drop_after`` aborts the TCP connection; ``go_away_after`` sends
  ``goAway`` and closes the connection (1000) when the running turn ends.

The setup is checked in ``gateway.sim.gemini_setup`` and the audio heard in
``gateway.sim.gemini_voice``; this module keeps the connection, its turns and
the model's answers.

Voice (what the model hears and says: ``gateway.sim.model``):

- ``realtimeInput.audio`` is PCM16 at the rate its ``mimeType`` names
  (``audio/pcm;rate=16000``). With automatic activity detection (the
  default) the simulated VAD hears speech; its start interrupts a running
  turn (``interrupted``), and with ``explicitVadSignal`` it is announced as
  ``voiceActivity`` ``ACTIVITY_START``/``ACTIVITY_END`` (``audioOffset``).
  Its end makes the speech a user turn (``inputTranscription`` when
  ``inputAudioTranscription`` is set) and the model answers. With
  ``realtimeInputConfig.automaticActivityDetection.disabled`` the client
  brackets speech with ``activityStart`` (which interrupts, too) and
  ``activityEnd`` (the model answers).
- ``responseModalities`` ``["AUDIO"]``: ``modelTurn`` parts are ``inlineData``
  (``audio/pcm;rate=24000``), each with its ``outputTranscription`` when
  ``outputAudioTranscription`` is set; a function declared in ``tools`` is called with
  ``toolCall`` and the turn goes on once ``toolResponse`` brings its output. A function
  declared with ``behavior: NON_BLOCKING`` does not hold the turn: the model ends it
  (``turnComplete``) and the call's ``toolResponse`` may come any time later; its
  ``scheduling`` says what the model does then (the SDK's ``FunctionResponseScheduling``):
  ``WHEN_IDLE`` (the default) speaks about it once no turn runs, ``INTERRUPT`` cuts the
  running turn to speak about it, ``SILENT`` only keeps it in the context. A closed
  connection's turns are dropped (``forget``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import secrets
import time
from typing import Final
from urllib.parse import parse_qs

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.sim.gemini_setup import NOT_SET_UP, Refusal, Resumable, accept_setup
from gateway.sim.gemini_voice import VoiceInput
from gateway.sim.model import (
    Pacer,
    Sim,
    SimCall,
    SimConnection,
    SimConversation,
    SimItem,
    sim_reply,
    simulated_usage_tokens,
    spoken_reply,
    tool_answer,
    voice_audio,
)
from gateway.upstream import gemini_wire as wire

__all__ = ["API_VERSIONS", "PATH", "GeminiSim", "endpoint_path"]

log = logging.getLogger("gateway.sim.openai")

API_VERSIONS: Final = ("v1beta", "v1alpha")
PATH: Final = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"

# What the simulated session announces in ``goAway`` (it then closes at the end of the turn).
_GO_AWAY_TIME_LEFT: Final = "10s"
# What a model that thinks reports as its thought before answering (with includeThoughts).
SIM_THOUGHT: Final = "The user said something."

# The rate of the voice.
_VOICE_MIME: Final = "audio/pcm;rate=24000"

_UNKNOWN_FIELD: Final = re.compile(r"unknown field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")


def endpoint_path(api_version: str = "v1beta") -> str:
    """The ``BidiGenerateContent`` path of an API version."""
    return f"/ws/google.ai.generativelanguage.{api_version}.GenerativeService.BidiGenerateContent"


_PATHS: Final = frozenset(endpoint_path(version) for version in API_VERSIONS)


def _reason(text: str) -> str:
    """``text`` cut to a close frame's 123-byte reason limit (on a character boundary)."""
    data = text.encode()
    if len(data) <= 123:
        return text
    return data[:120].decode("utf-8", "ignore") + "..."


def _invalid_payload(exc: msgspec.ValidationError) -> str:
    """A msgspec validation error in the API's words."""
    match = _UNKNOWN_FIELD.search(str(exc))
    if match is not None:
        name, path = match.group(1), match.group(2)
        where = f" at '{path}'" if path else ""
        return f'Invalid JSON payload received. Unknown name "{name}"{where}: Cannot find field.'
    return f"Invalid JSON payload received. {exc}"


class _Turn:
    __slots__ = ("role", "status", "text")

    def __init__(self, role: str, text: str, status: str = "completed") -> None:
        self.role = role
        self.text = text
        self.status = status


class _Generation:
    """The model turn being written: its text (or ``call``), progress and task."""

    __slots__ = (
        "audio",
        "call",
        "chunks",
        "finishing",
        "prompt_tokens",
        "sent",
        "task",
        "text",
        "turn",
    )

    def __init__(
        self,
        turn: _Turn,
        text: str,
        prompt_tokens: int,
        *,
        audio: bool = False,
        call: SimCall | None = None,
    ) -> None:
        self.turn = turn
        self.text = text
        self.prompt_tokens = prompt_tokens
        self.audio = audio
        self.call = call
        self.sent = 0  # characters of ``text`` sent
        self.chunks = 0
        self.finishing = False
        self.task: asyncio.Task[None] | None = None


class _Connection(SimConnection):
    """One client connection: setup state, its conversation, at most one model turn."""

    __slots__ = (
        "_call_ids",
        "async_calls",
        "chunks_sent",
        "generation",
        "going_away",
        "instructions",
        "key",
        "no",
        "pending_calls",
        "setup",
        "sim",
        "turns",
        "voice",
        "ws",
    )

    def __init__(self, sim: GeminiSim, ws: ServerConnection, no: int, key: str | None) -> None:
        self.sim = sim
        self.ws = ws
        self.no = no
        self.key = key
        self.setup = NOT_SET_UP  # what the setup asked for, once accepted
        self.instructions = ""
        self.turns: list[_Turn] = []
        self.generation: _Generation | None = None
        self.chunks_sent = 0
        self.going_away = False
        self.voice = VoiceInput(self, sim.config)
        self.pending_calls: dict[str, str] = {}  # call id -> function name
        self.async_calls: dict[str, str] = {}  # NON_BLOCKING calls without a response yet
        self._call_ids = itertools.count(1)

    def forget(self) -> None:
        self.turns.clear()

    def snapshot(self) -> SimConversation:
        items = [
            SimItem(f"turn_{self.no}_{n}", t.role, t.text, t.status)
            for n, t in enumerate(self.turns, 1)
        ]
        return SimConversation(instructions=self.instructions, items=items)

    async def _send(self, message: wire.ServerMessage) -> None:
        await self.ws.send(wire.encode(message), text=True)

    async def _refuse(self, code: int, reason: str) -> None:
        log.info("sim connection %d: closing %d: %s", self.no, code, reason)
        await self.ws.close(code, _reason(reason))

    # --- the connection's life ----------------------------------------------------

    async def stop(self) -> None:
        generation, self.generation = self.generation, None
        if generation is not None and generation.task is not None and not generation.task.done():
            generation.task.cancel()
            await asyncio.wait([generation.task])

    async def _dispatch(self, data: bytes) -> None:
        try:
            message = wire.decode_client_message(data)
        except msgspec.ValidationError as exc:  # (a DecodeError subclass: test it first)
            await self._refuse(1007, _invalid_payload(exc))
            return
        except msgspec.DecodeError as exc:
            await self._refuse(1007, f"Invalid JSON payload received. {exc}")
            return
        kinds = [
            name
            for name, value in (
                ("setup", message.setup),
                ("clientContent", message.client_content),
                ("realtimeInput", message.realtime_input),
                ("toolResponse", message.tool_response),
            )
            if value is not None
        ]
        if len(kinds) != 1:
            await self._refuse(
                1007,
                "Invalid JSON payload received: a message sets exactly one of setup, "
                f"clientContent, realtimeInput, toolResponse (got {len(kinds)}).",
            )
        elif not self.setup.model:
            if message.setup is None:
                await self._refuse(1007, f"The first message must be setup, got {kinds[0]}.")
            else:
                await self._setup(message.setup)
        elif message.realtime_input is not None:
            await self.voice.realtime_input(message.realtime_input)
        elif message.client_content is not None:
            await self._client_content(message.client_content)
        elif message.tool_response is not None:
            await self._tool_response(message.tool_response)
        else:
            await self._refuse(1007, "setup is sent once, as the first message.")

    # --- client messages ----------------------------------------------------------

    async def _setup(self, setup: wire.Setup) -> None:
        accepted = accept_setup(
            setup, api_key=self.sim.config.api_key, key=self.key, handles=self.sim.handles
        )
        if isinstance(accepted, Refusal):
            await self._refuse(accepted.code, accepted.reason)
            return
        if accepted.resumed is not None:
            self.turns = [_Turn(role, text) for role, text in accepted.resumed]
            self.sim.stats.resumed_total += 1
        self.instructions = accepted.instructions
        self.setup = accepted
        await self._send(wire.ServerMessage(setup_complete=wire.SetupComplete()))
        await self._offer_handle()

    async def _offer_handle(self) -> None:
        """A ``sessionResumptionUpdate`` with a handle to this session as it is now."""
        if not self.setup.resumption or self.generation is not None:
            return
        handle = secrets.token_urlsafe(12)
        self.sim.handles[handle] = Resumable(
            self.setup.model.removeprefix("models/"),
            self.instructions,
            tuple((t.role, t.text) for t in self.turns),
            time.time(),
        )
        update = wire.SessionResumptionUpdate(new_handle=handle, resumable=True)
        await self._send(wire.ServerMessage(session_resumption_update=update))

    async def _client_content(self, content: wire.ClientContent) -> None:
        turns = content.turns or []
        for turn in turns:
            if turn.role not in ("user", "model"):
                await self._refuse(1007, "Please use a valid role: user, model.")
                return
        if self.generation is not None:
            await self._interrupt(self.generation)
        for turn in turns:
            text = "".join(part.text or "" for part in turn.parts)
            self.turns.append(_Turn(turn.role or "user", text))
        self.sim.stats.turns_received += len(turns)
        if content.turn_complete:
            self._respond()

    async def _interrupt(self, generation: _Generation) -> None:
        """Cut the running turn at what was sent, unless it is already finishing."""
        task = generation.task
        if generation.finishing:
            if task is not None:
                await asyncio.wait([task])
            return
        self.generation = None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        generation.turn.text = generation.text[: generation.sent]
        generation.turn.status = "incomplete"
        await self._send(wire.ServerMessage(server_content=wire.ServerContent(interrupted=True)))

    def _respond(self, answer: str | None = None) -> None:
        """Start the model's turn: ``answer``, or the reply to the last user turn."""
        config = self.sim.config
        reply: str | SimCall
        if answer is not None:
            reply = answer
        else:
            last_user = next((t.text for t in reversed(self.turns) if t.role == "user"), "")
            if self.setup.audio_out:
                reply = spoken_reply(
                    last_user,
                    self.setup.functions,
                    items=len(self.turns),
                    instructions=self.instructions,
                )
            else:
                reply = sim_reply(
                    last_user,
                    overrun=config.overrun,
                    instructions=self.instructions,
                    items=len(self.turns),
                )
        context = len(self.instructions) + sum(len(t.text) for t in self.turns)
        turn = _Turn("model", "", "in_progress")
        self.turns.append(turn)
        if isinstance(reply, SimCall):
            turn.role = "function_call"
            generation = _Generation(turn, "", simulated_usage_tokens(context), call=reply)
        else:
            generation = _Generation(
                turn, reply, simulated_usage_tokens(context), audio=self.setup.audio_out
            )
        self.generation = generation
        self.sim.stats.responses_total += 1
        generation.task = asyncio.create_task(self._generate(generation))

    # --- generation ---------------------------------------------------------------

    async def _generate(self, generation: _Generation) -> None:
        config = self.sim.config
        try:
            pacer = Pacer(config)
            await pacer.begin()
            if self._drop_due():
                return
            await self._maybe_go_away()
            if generation.call is not None:
                generation.finishing = True
                await self._call(generation, generation.call)
                return
            if self.setup.thoughts and generation.audio:
                thought = wire.Part(text=SIM_THOUGHT, thought=True)
                await self._send(
                    wire.ServerMessage(
                        server_content=wire.ServerContent(
                            model_turn=wire.Content(parts=[thought], role="model")
                        )
                    )
                )
            text, size, total = generation.text, config.chunk_size, len(generation.text)
            stats = self.sim.stats
            while generation.sent < total:
                await pacer.wait(generation.chunks)
                chunk = text[generation.sent : generation.sent + size]
                # Count before the send: the frame is written before ``send`` can suspend.
                generation.sent += len(chunk)
                generation.chunks += 1
                self.chunks_sent += 1
                stats.deltas_total += 1
                await self._send(self._chunk(generation, chunk))
                if self._drop_due():
                    return
                await self._maybe_go_away()
            generation.finishing = True
            await self._finish(generation)
        except ConnectionClosed:
            pass

    def _chunk(self, generation: _Generation, chunk: str) -> wire.ServerMessage:
        if not generation.audio:
            return wire.ServerMessage(
                server_content=wire.ServerContent(
                    model_turn=wire.Content(parts=[wire.Part(text=chunk)], role="model")
                )
            )
        audio = voice_audio(len(chunk), self.sim.config)
        part = wire.Part(inline_data=wire.Blob(mime_type=_VOICE_MIME, data=audio))
        transcription = wire.Transcription(text=chunk) if self.setup.output_transcription else None
        return wire.ServerMessage(
            server_content=wire.ServerContent(
                model_turn=wire.Content(parts=[part], role="model"),
                output_transcription=transcription,
            )
        )

    async def _call(self, generation: _Generation, call: SimCall) -> None:
        """Call a function; the turn goes on when its ``toolResponse`` comes."""
        try:
            args = msgspec.json.decode(call.arguments)
        except msgspec.DecodeError:
            args = None
        if not isinstance(args, dict):
            args = {"arguments": call.arguments}
        call_id = f"call_sim{self.no}_{next(self._call_ids)}"
        generation.turn.text = call.arguments
        generation.turn.status = "completed"
        if self.generation is generation:
            self.generation = None
        function_call = wire.FunctionCall(id=call_id, name=call.name, args=args)
        if call.name in self.setup.non_blocking:
            # The model does not wait for it: the turn ends, the response comes later.
            self.async_calls[call_id] = call.name
            await self._send(
                wire.ServerMessage(tool_call=wire.ToolCall(function_calls=[function_call]))
            )
            await self._send(
                wire.ServerMessage(server_content=wire.ServerContent(turn_complete=True))
            )
            return
        self.pending_calls[call_id] = call.name
        await self._send(
            wire.ServerMessage(tool_call=wire.ToolCall(function_calls=[function_call]))
        )

    async def _tool_response(self, response: wire.ToolResponse) -> None:
        answers = []
        for function_response in response.function_responses or ():
            late = self.async_calls.pop(function_response.id or "", None)
            if late is not None:
                await self._late_response(late, function_response)
                continue
            name = self.pending_calls.pop(function_response.id or "", None)
            if name is None:
                await self._refuse(
                    1007,
                    f"toolResponse for unknown function call id {function_response.id!r}.",
                )
                return
            body = function_response.response or {}
            output = body.get("output")
            text = output if isinstance(output, str) else msgspec.json.encode(body).decode()
            self.turns.append(_Turn("function_response", text))
            answers.append(tool_answer(name, text))
        if answers and not self.pending_calls:
            self._respond(" ".join(answers))

    async def _late_response(self, name: str, response: wire.FunctionResponse) -> None:
        """A NON_BLOCKING call's response, handled as its ``scheduling`` asks."""
        body = response.response or {}
        output = body.get("output")
        text = output if isinstance(output, str) else msgspec.json.encode(body).decode()
        self.turns.append(_Turn("function_response", text))
        scheduling = response.scheduling or "WHEN_IDLE"
        if scheduling == "SILENT":
            return
        running = self.generation
        if running is not None:
            if scheduling == "INTERRUPT":
                await self._interrupt(running)
            elif running.task is not None:
                await asyncio.wait([running.task])  # WHEN_IDLE: after the running turn
        if self.generation is None:
            self._respond(tool_answer(name, text))

    # --- what the voice input asks (``VoiceHost``) ------------------------------------

    async def interrupt(self) -> None:
        """Cut the running turn, if any (speech began, or a user turn came)."""
        if self.generation is not None:
            await self._interrupt(self.generation)

    def user_turn(self, text: str) -> None:
        """A user turn (speech heard, or text): the model answers it."""
        self.turns.append(_Turn("user", text))
        self._respond()

    # --- pacing and the turn's end --------------------------------------------------

    def _drop_due(self) -> bool:
        return self.sim.drop_due(self.no, self.ws, self.chunks_sent)

    async def _maybe_go_away(self) -> None:
        after = self.sim.config.go_away_after
        if self.going_away or after is None or self.chunks_sent < after:
            return
        self.going_away = True
        log.info("sim connection %d: goAway after %d chunks", self.no, self.chunks_sent)
        await self._send(wire.ServerMessage(go_away=wire.GoAway(time_left=_GO_AWAY_TIME_LEFT)))

    async def _finish(self, generation: _Generation) -> None:
        """``generationComplete``, then ``turnComplete`` with the turn's usage."""
        generation.turn.text = generation.text
        generation.turn.status = "completed"
        # The turn stops being interruptible here: content sent by a client that
        # saw turnComplete starts a new turn.
        if self.generation is generation:
            self.generation = None
        prompt, response = generation.prompt_tokens, generation.chunks
        usage = wire.UsageMetadata(
            prompt_token_count=prompt,
            response_token_count=response,
            total_token_count=prompt + response,
            prompt_tokens_details=[wire.ModalityTokenCount(modality="TEXT", token_count=prompt)],
            response_tokens_details=[
                wire.ModalityTokenCount(
                    modality="AUDIO" if generation.audio else "TEXT", token_count=response
                )
            ],
        )
        await self._send(
            wire.ServerMessage(server_content=wire.ServerContent(generation_complete=True))
        )
        await self._send(
            wire.ServerMessage(
                server_content=wire.ServerContent(turn_complete=True), usage_metadata=usage
            )
        )
        await self._offer_handle()
        if self.going_away:
            await self.ws.close(1000, "session time limit reached (after goAway)")


class GeminiSim(Sim):
    """The Gemini Live flavour (see the module docstring)."""

    flavor = "gemini"

    @property
    def url(self) -> str:
        """The base URL (``ws://HOST:PORT``) for ``GeminiLive(base_url=...)``."""
        return self.address

    @property
    def http_url(self) -> str:
        """The base URL for the SDK (``genai.Client(http_options={"base_url": ...})``).

        The SDK always connects with ``wss://``: serve with ``ssl`` for it.
        """
        return self.address.replace("ws", "http", 1)

    @property
    def endpoint(self) -> str:
        return f"{self.address}{PATH}"

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.partition("?")[0]
        if path not in _PATHS:
            return connection.respond(
                404, f"Not found: the Live endpoint is {PATH} (or its v1alpha version)\n"
            )
        return None

    def _connection(self, ws: ServerConnection, no: int) -> _Connection:
        key: str | None = None
        if ws.request is not None:
            query = parse_qs(ws.request.path.partition("?")[2])
            keys = query.get("key")
            key = keys[0] if keys else ws.request.headers.get("x-goog-api-key")
        return _Connection(self, ws, no, key)
