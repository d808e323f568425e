"""The model's speech that came before the logged event it is tagged with.

Speech is not logged: the gateway sends it as it arrives, tagged with the seq of
the newest event the session had emitted (``protocol.audio``), and it overtakes
events still in their log round. The gateway's own clients align the two by seq.
An OpenAI client cannot: the first speech of an answer opens its response, and
sent at once it showed ``response.created`` and the answer's item before the
user's ``input_audio_buffer.committed`` and item, which a client that orders
items by ``previous_item_id`` puts after the answer. So the first speech of a
response waits (``EarlySpeech``) until its tagged event is translated, and what
comes behind it keeps its order. There is no timer: it goes with the event it
waits for (or a later one). At most ``EARLY_SPEECH_MAX`` bytes wait: a log
stalled longer lets the speech go in the order it came, as before.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from protocol.audio import OUTPUT_RATE

__all__ = ["EARLY_SPEECH_MAX", "EarlySpeech"]

EARLY_SPEECH_MAX: Final = 2 * OUTPUT_RATE * 2
"""Bytes of speech held for its event: 2 s of PCM16 (a log round takes milliseconds)."""


class EarlySpeech:
    """Pieces of speech, ``(tag, pcm16)`` in the order they came, until their event.
    ``held`` is tested per token and per audio frame: a deque's own truth, no call."""

    __slots__ = ("held", "held_bytes")

    def __init__(self) -> None:
        self.held: deque[tuple[int, bytes]] = deque()
        self.held_bytes = 0

    def hold(self, tag: int, pcm16: bytes) -> bool:
        """Hold a piece; False once more than ``EARLY_SPEECH_MAX`` is held (let it all go)."""
        self.held.append((tag, pcm16))
        self.held_bytes += len(pcm16)
        return self.held_bytes <= EARLY_SPEECH_MAX

    def due(self, seq: int | None) -> list[tuple[int, bytes]]:
        """The pieces tagged ``seq`` or before (all of them: ``None``), oldest first."""
        held, out = self.held, []
        while held and (seq is None or held[0][0] <= seq):
            piece = held.popleft()
            self.held_bytes -= len(piece[1])
            out.append(piece)
        return out
