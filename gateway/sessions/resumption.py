"""Where a provider's own copy of a session's conversation can be continued from.

A provider with session resumption (Gemini Live) gives a handle after each
turn (``Resumable``). The driving node keeps the newest one with the
session (its meta, ``resume``), with how much of the history it covers, so
whichever node opens the session's next connection — after a reconnect, a
takeover, a ``goAway`` — continues the provider's copy and sends only what
was logged after the handle, instead of the whole history. A ``forgotten``
logged after the handle spoils it: the provider's copy holds what was forgotten. A handle is
only good for the provider and model that gave it, and for
``HANDLE_LIFETIME`` (Google: two hours after the session it names ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from gateway.upstream.base import Resume
from protocol.assembly import HistoryItem, assemble
from protocol.events import Forgotten

__all__ = ["HANDLE_LIFETIME", "META_KEY", "ResumePoint", "decode_resume_point"]

META_KEY: Final = "resume"
HANDLE_LIFETIME: Final = 2 * 3600.0


class ResumePoint(msgspec.Struct, frozen=True):
    """A handle, whose provider and model gave it, when, and the history items it covers."""

    provider: str
    model: str
    handle: str
    items: int
    at: float

    def resume(
        self, provider: str, model: str, history: Sequence[HistoryItem], now: float
    ) -> Resume | None:
        """How to continue on a connection to ``provider``/``model``; None: send the history."""
        if (
            provider != self.provider
            or model != self.model
            or now - self.at > HANDLE_LIFETIME
            or self.items > len(history)
        ):
            return None
        later = history[self.items :]
        if any(isinstance(item, Forgotten) for item in later):
            return None  # the provider's copy holds what was forgotten since
        return Resume(self.handle, tuple(assemble(later)))

    def encode(self) -> str:
        return _encoder.encode(self).decode()


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(ResumePoint)


def decode_resume_point(text: str) -> ResumePoint | None:
    """The stored point, or None (none stored, or unreadable: the history is sent)."""
    if not text:
        return None
    try:
        return _decoder.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
