"""What a session's configuration asks of the upstream connection for voice,
and the user's audio held while that connection opens.

Pure: a ``SessionConfig`` (``input_audio``, ``output``, ``voice``) and the
session's tools become the adapters' ``VoiceConfig``, or ``None`` for a text
session (whose upstream connection is opened per turn, as ever).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gateway.upstream.base import AudioIn, AudioOut, FunctionTool, VoiceConfig
from protocol.configuration import SessionConfig
from protocol.prompt import ToolSpec

__all__ = ["HELD_AUDIO_SECONDS", "HeldAudio", "voice_config"]

HELD_AUDIO_SECONDS = 5.0
"""At most this much of the user's audio is held while the upstream opens
(a provider answers an open in well under a second)."""


def voice_config(
    config: SessionConfig, tools: Sequence[ToolSpec], *, speaks_only: bool = False
) -> VoiceConfig | None:
    """The upstream's voice configuration for ``config``; ``None``: no audio either way.

    In audio output the text protocol's markers would be spoken, so the
    session's tools are declared natively (``FunctionTool``) and the model's
    calls come back as function calls. ``speaks_only``: the model answers in
    audio only (``gateway.upstream.models``), so a text session asks for
    audio too and takes its transcript as the answer (the audio is dropped).
    """
    audio = config.input_audio
    client_hears = config.output == "audio"
    speaks = client_hears or speaks_only
    if audio is None and not speaks:
        return None
    return VoiceConfig(
        audio_in=None
        if audio is None
        else AudioIn(rate=audio.rate, turn_detection=audio.turn_detection),
        audio_out=AudioOut(voice=config.voice, to_client=client_hears) if speaks else None,
        tools=tuple(
            FunctionTool(name=t.name, description=t.description, parameters=t.parameters)
            for t in tools
        )
        if speaks
        else (),
    )


class HeldAudio:
    """The user's audio that came while the session's upstream was being opened.

    A client starts talking as soon as it has sent ``configure``, and the
    provider's connection takes a moment to open (after ``configure``, after
    a reconnect or a takeover): audio dropped meanwhile was the start of the
    user's sentence. It is held here in order, and sent before any newer
    audio once the connection is open. Past ``limit`` bytes the oldest goes:
    the provider's VAD needs the newest audio most.
    """

    __slots__ = ("_chunks", "dropped", "held", "limit")

    def __init__(self, limit: int) -> None:
        self._chunks: deque[bytes] = deque()
        self.limit = limit
        self.held = 0  # bytes held now
        self.dropped = 0  # bytes let go for the limit since the last ``clear``

    @classmethod
    def for_rate(cls, rate: int, seconds: float = HELD_AUDIO_SECONDS) -> HeldAudio:
        """Room for ``seconds`` of PCM16 mono at ``rate``."""
        return cls(int(rate * seconds) * 2)

    def hold(self, pcm16: bytes) -> None:
        self._chunks.append(pcm16)
        self.held += len(pcm16)
        while self.held > self.limit:
            oldest = self._chunks.popleft()
            self.held -= len(oldest)
            self.dropped += len(oldest)

    def take(self) -> bytes | None:
        """The oldest chunk held, or ``None`` when none is left."""
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self.held -= len(chunk)
        return chunk

    def clear(self) -> None:
        self._chunks.clear()
        self.held = 0
        self.dropped = 0
