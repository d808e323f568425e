"""The carriers whose media streams the gateway takes: one row each.

A carrier that speaks Twilio Media Streams with other field names is a row
with another ``Naming`` (``protocol.media_stream``); how it signs the
stream's handshake and whether the gateway can reach its REST API are the
row's other columns. ``/v1/phone/NAME`` is its endpoint. docs/phone.md
lists the rows with their sources, and what is not confirmed.

To add a carrier: its row here (and a ``Naming`` if it spells fields its
own way) and its line in docs/phone.md's table (tests/phone/test_carriers.py
fails until then); a signature scheme other than these is a case in
``gateway.phone.admission``; a REST API for transfers, one in
``gateway.phone.control``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from protocol.media_stream import TELNYX, TWILIO, MediaStreamWire, Naming

__all__ = ["CARRIERS", "PHONE_PREFIX", "Carrier", "by_path"]

PHONE_PREFIX: Final = "/v1/phone/"


@dataclass(frozen=True)
class Carrier:
    """One carrier.

    - ``signature``: how it signs the stream's WebSocket handshake
      (``twilio``: ``X-Twilio-Signature``; ``fonoster``: ``x-fonoster-signature``;
      ``none``: it does not, or it is not known how, so a one-time stream
      token must open the stream);
    - ``control``: its REST API for transfers and hang-ups (``twilio``: the
      Calls resource; ``none``: end_call closes the stream, transfers fail).
    """

    name: str
    label: str
    naming: Naming
    signature: Literal["twilio", "fonoster", "none"]
    control: Literal["twilio", "none"]
    wire: MediaStreamWire = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire", MediaStreamWire(self.naming))

    @property
    def path(self) -> str:
        return PHONE_PREFIX + self.name


CARRIERS: Final = (
    Carrier("twilio", "Twilio Media Streams", TWILIO, signature="twilio", control="twilio"),
    Carrier("signalwire", "SignalWire (cXML <Stream>)", TWILIO, signature="none", control="none"),
    Carrier("fonoster", "Fonoster (Twilio protocol)", TWILIO, signature="fonoster", control="none"),
    Carrier("telnyx", "Telnyx media streaming", TELNYX, signature="none", control="none"),
)

_BY_PATH: Final = {carrier.path: carrier for carrier in CARRIERS}


def by_path(path: str) -> Carrier | None:
    """The carrier whose endpoint ``path`` is (None: no such endpoint)."""
    return _BY_PATH.get(path)
