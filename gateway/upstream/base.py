"""The interface every upstream adapter (OpenAI Realtime, Gemini Live) implements.

The session loop drives one adapter per session and reads its events with
``recv()`` from a single task: no reader task, no queue between the socket and
the parser, so a token costs one decode and one parser feed. Adapters translate
their provider's wire events into the ``UpstreamEvent`` kinds below and
nothing else; provider details (item ids, event ids, setup handshakes) stay
inside the adapter.

The events an adapter returns are, for the most part, the turn machine's own
inputs (``protocol.turn_events``: ``TextDelta``, ``ResponseDone``,
``SpeechBegan``…): the session feeds them to the machine as they are, with no
second vocabulary to translate. Voice is opt-in per session: ``open(...,
voice=VoiceConfig(...))``. Only then do the voice events appear (a text
session sees ``TextDelta``, ``ResponseDone`` and ``UpstreamError``), and only
then may ``send_audio``, ``commit_audio`` and ``send_function_output`` be
called. In a voice session a response may start without ``start_response``
(the provider's VAD heard the user stop): ``ResponseBegan`` announces it. Audio
crosses this seam as PCM16 bytes (mono, little-endian) with its rate; base64
and resampling stay inside the adapters.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, Protocol

import msgspec

from protocol.assembly import Message
from protocol.fallback import ProviderBreaker
from protocol.turn_events import (
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Thought,
    Transcript,
)

__all__ = [
    "CONTROLS",
    "AdapterFactory",
    "AudioDelta",
    "AudioIn",
    "AudioOut",
    "FrameTap",
    "FunctionTool",
    "ModelOptions",
    "NativeCall",
    "ResponseBegan",
    "ResponseDone",
    "Resumable",
    "Resume",
    "SpeechBegan",
    "SpeechEnded",
    "Spoken",
    "TextDelta",
    "Thought",
    "Transcript",
    "Upstream",
    "UpstreamClosed",
    "UpstreamError",
    "UpstreamEvent",
    "UpstreamFactory",
    "VoiceConfig",
    "Woken",
]


class UpstreamError(msgspec.Struct, frozen=True):
    """The provider reported an error that did not end the connection.

    ``retryable``: False when asking again will not help (auth, quota, model
    refused): a session with another provider configured falls back to it
    (the shell decides which, then feeds the machine ``UpstreamFailed``).
    """

    code: str
    message: str
    retryable: bool = True


class AudioDelta(msgspec.Struct, frozen=True):
    """A piece of the model's spoken answer: PCM16 mono at ``rate`` Hz (to the clients, unlogged)."""

    pcm16: bytes
    rate: int


class Resumable(msgspec.Struct, frozen=True):
    """The provider offers ``handle`` to continue this conversation on a new connection
    (Gemini's session resumption): the session keeps the newest one with its log, so any
    node can resume it (``Upstream.open(..., resume=Resume(...))``). ``position``: the
    ``Upstream.position`` the provider's copy was at when it gave the handle."""

    handle: str
    position: int = 0


class Resume(msgspec.Struct, frozen=True):
    """Continue a provider-side conversation: ``handle`` (from ``Resumable``) and the
    messages logged after it was given (``pending``), which the provider does not hold yet."""

    handle: str
    pending: tuple[Message, ...] = ()


class FrameTap(Protocol):
    """Who sees every frame of an upstream connection, as it goes over the wire (a
    session's recorder: ``gateway.sessions.recorder``). Must not block."""

    def sent(self, data: bytes, audio: bool) -> None:
        """A frame written to the provider (``audio``: the audio relay's)."""

    def received(self, data: bytes) -> None:
        """A frame read from the provider."""


class Woken(msgspec.Struct, frozen=True):
    """``recv()`` returns this when the text sink (``Upstream.stream_text_to``)
    took a delta that calls for the session to act: its work is in the session."""


UpstreamEvent = (
    TextDelta
    | ResponseDone
    | SpeechBegan
    | SpeechEnded
    | Transcript
    | ResponseBegan
    | Spoken
    | Thought
    | NativeCall
    | UpstreamError
    | AudioDelta
    | Resumable
    | Woken
)
"""What ``Upstream.recv()`` returns: the turn machine's inputs (fed to it as they
are), plus what only the shell handles: errors, audio and wake-ups."""


class AudioIn(msgspec.Struct, frozen=True, kw_only=True):
    """Audio from the user.

    - ``rate``: Hz of the PCM16 given to ``send_audio``; the adapter resamples
      to the provider's (OpenAI 24 kHz, Gemini 16 kHz) when it differs.
    - ``turn_detection``: ``server_vad`` (the provider hears when the user
      stops and answers by itself), ``semantic_vad`` (as server VAD, judged by
      the model; ``eagerness`` says how soon) or ``none`` (the session ends the
      user's turn with ``commit_audio``).
    - ``idle_timeout_ms``: server VAD speaks again after this long without speech.
    - ``threshold``, ``prefix_padding_ms``, ``silence_duration_ms``: server VAD's
      tuning (``protocol.configuration.InputAudio``); None: the provider's default.
    - ``noise_reduction``: ``near_field``, ``far_field``, ``off``; None: the provider's default.
    - ``transcription``: send ``Transcript`` events.
    - ``interrupt_response``: speech cancels a running response (barge-in;
      Gemini always does).
    """

    rate: int = 24000
    turn_detection: Literal["server_vad", "semantic_vad", "none"] = "server_vad"
    eagerness: str | None = None
    idle_timeout_ms: int | None = None
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    noise_reduction: str | None = None
    transcription: bool = True
    interrupt_response: bool = True


class AudioOut(msgspec.Struct, frozen=True, kw_only=True):
    """Spoken answers: ``AudioDelta`` + ``OutputTranscriptDelta`` instead of ``TextDelta``.

    ``voice``: the provider's voice name (OpenAI ``alloy``, ``marin``…; Gemini
    ``Puck``, ``Kore``…); ``""`` keeps the provider's default. ``to_client``:
    False when the session asked for text and the model only speaks — its
    transcript is the answer and the audio is dropped.
    """

    voice: str = ""
    speed: float | None = None  # 1.0 the voice's normal pace; None: the provider's
    to_client: bool = True


class FunctionTool(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call natively; ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    # The turn does not wait for it: declared non-blocking where the provider has that
    # (Gemini ``behavior: NON_BLOCKING``), its output sent when the call is done.
    background: bool = False
    # Declared by the session's client (an app's function tool), not one of the
    # gateway's: the tool an app means a GPT-Live delegation for (``delegation_tool``).
    client: bool = False


class VoiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A voice session's configuration, given to ``Upstream.open``.

    ``audio_in`` ``None``: the user types; ``audio_out`` ``None``: the model
    writes text (the text protocol, parsed as ever). ``tools`` are declared
    natively (``NativeCall`` events): meant for ``audio_out``, where the
    model cannot speak the text protocol's markers.
    """

    audio_in: AudioIn | None = None
    audio_out: AudioOut | None = None
    tools: tuple[FunctionTool, ...] = ()


CONTROLS: Final[frozenset[str]] = frozenset(
    (
        "semantic_vad",
        "idle_timeout_ms",
        "vad_tuning",  # server VAD's threshold, prefix_padding_ms, silence_duration_ms
        "speed",  # how fast the voice speaks
        "noise_reduction",
        "truncation",
        "reasoning_effort",
        "clear_audio",  # discard input audio sent but not committed (``Upstream.clear_audio``)
        "manual_turns",  # turn_detection "none": the client's commit ends the user's turn
    )
)
"""The session controls a provider may lack (``Provider.controls``): a session asking
for one its provider lacks is refused when it is set up, never silently served without."""


class ModelOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the model works, beyond voice (None: the provider's default).

    - ``truncation``: ``auto``, ``disabled``, or the share of the window kept
      when a long context is cut (OpenAI's retention ratio);
    - ``reasoning_effort``: ``minimal``…``xhigh`` for a model that reasons
      (OpenAI ``reasoning.effort``; Gemini ``thinkingLevel``).
    """

    truncation: str | float | None = None
    reasoning_effort: str | None = None


class UpstreamClosed(Exception):
    """The upstream connection is gone (dropped, closed by the provider, time limit).

    The session reconnects with context rebuilt from history; ``reason`` is for logs.
    ``retryable``: False when reconnecting will not help (the provider refused
    the key, the quota or the model): the session falls back to the next
    provider configured, or its turn fails at once.
    """

    def __init__(self, reason: str, *, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


class Upstream(abc.ABC):
    """One upstream realtime session (one WebSocket to the provider)."""

    provider: str = "upstream"

    @abc.abstractmethod
    async def open(
        self,
        instructions: str,
        history: Sequence[Message],
        *,
        voice: VoiceConfig | None = None,
        resume: Resume | None = None,
        options: ModelOptions | None = None,
    ) -> None:
        """Connect, configure output with ``instructions``, and load ``history``.

        Text in and out unless ``voice`` says otherwise (see ``VoiceConfig``).
        ``resume``: continue the provider's own copy of the conversation
        instead of loading ``history`` (which stays the fallback if the
        provider refuses the handle); ``resumed`` says which happened.
        ``options``: how the model works (``ModelOptions``).
        Raises ``UpstreamClosed`` when the provider cannot be reached or refuses.
        """

    @property
    def position(self) -> int:
        """How many turns of the conversation the provider holds now (the unit of
        ``Resumable.position``); 0 for a provider without resumption."""
        return 0

    @property
    def resumed(self) -> bool:
        """The open continued the provider's copy of the conversation (``resume``)
        rather than loading the history into a new one."""
        return False

    @abc.abstractmethod
    async def add_message(self, message: Message) -> None:
        """Append a message (user text, ``<results>``) to the upstream conversation."""

    async def add_context(self, message: Message) -> bool:
        """Append a ``context`` message (the client's, no response asked for). False: this
        connection cannot take one where it stands; the session replaces it, and the next
        one is given the message from history."""
        await self.add_message(message)
        return True

    async def add_note(self, text: str) -> None:
        """Tell the model a gateway note between turns, asking for nothing (a barge-in on
        an answer this connection got from history). A provider that only takes a user
        message as the start of a turn keeps none: the next connection's history holds it."""
        await self.add_message(Message(role="user", content=text))

    @abc.abstractmethod
    async def start_response(self) -> None:
        """Ask the model for a response; its text arrives as ``TextDelta`` events."""

    @abc.abstractmethod
    async def cancel_response(self) -> None:
        """Ask the provider to stop the running response; a ``ResponseDone`` follows."""

    @abc.abstractmethod
    async def replace_response(self, text: str, *, heard_ms: int | None = None) -> None:
        """After a response ended early, make the conversation hold ``text`` as its output.

        Called after ``</execute>`` stopped a response: the model may have written
        past the marker before the cancel arrived, and that overrun must not stay
        in its context. ``text`` is what the parser accepted, re-assembled. After a
        barge-in, ``heard_ms`` is how much of a spoken answer the user heard: a
        provider that can cut the answer's audio there keeps exactly that.
        """

    @abc.abstractmethod
    async def send_audio(self, pcm16: bytes) -> None:
        """Stream the user's audio: PCM16 mono at ``AudioIn.rate``, chunks of any
        size (20–100 ms is typical). Needs ``VoiceConfig.audio_in``."""

    def stream_text_to(self, sink: Callable[[str], bool] | None) -> bool:
        """While a ``recv()`` waits, hand the running response's text deltas to
        ``sink(text)`` as they arrive, in the connection's read callback, instead
        of returning them; ``None`` stops it. ``sink`` returns True when the
        session must act (a marker asked to stop): ``recv()`` then returns
        ``Woken``. False: the adapter cannot (every event comes from ``recv()``).

        The session's fast path: at 50 streaming sessions resuming the session's
        task for every token was about 12% of the node's CPU (py-spy,
        docs/performance.md). Only a delta that arrives while the reader waits
        on an empty queue goes to the sink, so events keep their order.
        """
        return False

    def tap_frames(self, tap: FrameTap) -> bool:
        """Hand every frame of this connection, both ways, to ``tap`` (a session's
        recorder); call before ``open``. False: this adapter has no socket to tap."""
        return False

    def send_audio_now(self, pcm16: bytes) -> bool:
        """``send_audio`` without awaiting, when the socket can take the frame at
        once (the common case); False: nothing was sent, use ``send_audio``.

        The relay's fast path: a task switch per 20 ms frame of every session
        adds up (``tests/bench/voice_session_bench.py``). A connection that
        broke while writing counts as sent: ``recv`` reports the loss.
        """
        return False

    @abc.abstractmethod
    async def commit_audio(self) -> None:
        """End the user's spoken turn (turn detection ``none``) and ask for the answer.

        The response follows as after ``start_response`` (call one of them, not both).
        """

    async def clear_audio(self) -> None:
        """Discard the user's audio sent since the last commit (the provider's input
        buffer). Called only on a provider whose row lists the ``clear_audio`` control."""
        raise NotImplementedError(f"{self.provider} has no clear_audio control")

    @abc.abstractmethod
    async def send_function_output(self, call_id: str, output: str) -> None:
        """Answer a ``NativeCall``; after the last answer ``start_response()`` goes on."""

    @abc.abstractmethod
    async def recv(self) -> UpstreamEvent:
        """The next event. Raises ``UpstreamClosed`` when the connection is gone."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection (idempotent)."""


class UpstreamFactory(abc.ABC):
    """Makes a fresh, unopened ``Upstream`` for a session (one per connection attempt).

    A factory of one provider is its own choice and ignores failures; a
    ``ProviderChain`` picks among several and learns from failures.
    """

    provider: str = "upstream"
    # The model its upstreams use, as the price table and traces name it.
    model: str = ""
    # The wire its upstreams speak (``openai``, ``gemini``): with ``model``, what the
    # model can do (``gateway.upstream.models``).
    wire: str = "openai"
    # The session controls (``CONTROLS``) its upstreams carry out.
    controls: frozenset[str] = CONTROLS

    @abc.abstractmethod
    def create(self) -> Upstream: ...

    def choose(self) -> UpstreamFactory:
        """The factory (of one provider) the next connection should use."""
        return self

    def failed(self, provider: str, *, fatal: bool) -> str:
        """A connection to ``provider`` failed (``fatal``: retrying will not help).

        Returns the provider the next connection uses: another one is a fallback.
        """
        return provider

    def succeeded(self, provider: str) -> None:  # noqa: B027 (one provider: nothing to learn)
        """A response from ``provider`` completed."""


class ProviderChain(UpstreamFactory):
    """Several providers in order of preference, switched by a shared ``ProviderBreaker``.

    One per node, so a provider failing for one session is avoided by the
    node's other sessions too (the breaker decides; this only reads the clock).
    """

    def __init__(
        self,
        factories: Sequence[UpstreamFactory],
        breaker: ProviderBreaker,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factories = {f.provider: f for f in factories}
        if tuple(self.factories) != breaker.providers:
            raise ValueError(
                f"the chain's providers {list(self.factories)} must be the breaker's "
                f"{list(breaker.providers)}, in order"
            )
        self.breaker = breaker
        self.provider = breaker.providers[0]
        self.model = self.factories[self.provider].model
        self.wire = self.factories[self.provider].wire
        # A session may be served by any of them: it gets what they all carry out.
        self.controls = frozenset.intersection(*(f.controls for f in factories))
        self._clock = clock

    def choose(self) -> UpstreamFactory:
        return self.factories[self.breaker.choose(self._clock())]

    def create(self) -> Upstream:
        return self.choose().create()

    def failed(self, provider: str, *, fatal: bool) -> str:
        if provider not in self.factories:
            return self.breaker.choose(self._clock())
        return self.breaker.failed(provider, self._clock(), fatal=fatal)

    def succeeded(self, provider: str) -> None:
        if provider in self.factories:
            self.breaker.succeeded(provider)


class AdapterFactory(UpstreamFactory):
    """Makes adapters of one class, all with the same settings (keyword arguments)."""

    def __init__(self, adapter: Callable[..., Upstream], provider: str, **settings: Any) -> None:
        self._adapter = adapter
        self.provider = provider
        self.model = str(settings.get("model", ""))
        self._settings = settings

    def create(self) -> Upstream:
        return self._adapter(**self._settings)
