"""Binary WebSocket frames of a voice session, both ways.

*Client → gateway*: a binary frame is raw user audio, PCM16 little-endian
mono at the session's ``input_audio.rate`` (any length; 20–100 ms is typical).

*Gateway → client*: a binary frame is a piece of the model's spoken answer,
an 8-byte header then PCM16 little-endian mono at ``OUTPUT_RATE`` (24 kHz).
The header is the ``seq`` (unsigned 64-bit, little-endian) of the newest
event the session had emitted when the audio arrived: the ``respond`` event
whose transcript the audio speaks (before an answer's first ``respond``, the
event before it, e.g. the turn's ``user``). Audio is not logged, so it is sent
as soon as it arrives and may overtake the text event it is tagged with; a
client aligns the two by ``seq``. It is never replayed: a resumed client gets
the transcript (``respond`` events) from the log, and no audio of the past.
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["AUDIO_HEADER_BYTES", "OUTPUT_RATE", "audio_frame", "split_audio_frame"]

OUTPUT_RATE: Final = 24000  # Hz of the audio the gateway sends to clients
_HEADER: Final = struct.Struct("<Q")
AUDIO_HEADER_BYTES: Final = _HEADER.size


def audio_frame(seq: int, pcm16: bytes) -> bytes:
    """One gateway → client binary frame: ``seq`` header, then the PCM16."""
    return _HEADER.pack(seq) + pcm16


def split_audio_frame(frame: bytes) -> tuple[int, bytes]:
    """A gateway → client binary frame's ``seq`` and PCM16 (raises ``ValueError`` if too short)."""
    if len(frame) < AUDIO_HEADER_BYTES:
        raise ValueError(
            f"an audio frame has an {AUDIO_HEADER_BYTES}-byte header; got {len(frame)} bytes"
        )
    return _HEADER.unpack_from(frame)[0], frame[AUDIO_HEADER_BYTES:]
