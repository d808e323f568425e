"""A session's recording (the flight recorder): one JSON object per line, tagged on ``kind``.

What a node records of a session it drives, in the order it happened, each
record stamped ``t`` (seconds; the Unix time the recording started on that
node plus the monotonic clock since, so intervals are monotonic):

- ``header`` (first): the session, the node, its provider and model, its
  configuration when recording began, the audio policy and the size limit;
- ``node``: another node began recording the session (a takeover, a reload
  after the session idled), with the configuration it found;
- ``connect``: an upstream connection opened (its number, provider, model;
  never its URL or headers: they carry keys);
- ``upstream``: a frame on that connection, ``out`` to the provider or ``in``
  from it, as it went over the wire; an audio frame is kept as its size
  (``elided: "audio"``) and, out, a reference (``ref``) to the ``audio``
  record it carried, unless the policy keeps all audio;
- ``client``: a command a client sent (``message``, as the client wire has
  it), the newest event the session had delivered when it was heard
  (``seq``), and the error code if it was refused;
- ``audio``: a chunk of the user's audio (PCM16 mono at ``rate``), numbered;
- ``tool``: a tool call that ran (server tools, and client tools once the
  client answered): arguments, outcome and duration;
- ``event``: an event the session logged, as its clients got it;
- ``cut``: the recording reached its size limit; nothing after it was kept.

The gateway writes it (``gateway.sessions.recorder``); replay, evals and the
console read it. Pure: Structs and their codec, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Final, Literal

import msgspec

from protocol.configuration import SessionConfig

__all__ = [
    "MAX_SEQ",
    "NO_FRAME",
    "RECORDING_VERSION",
    "AudioPolicy",
    "ClientAudio",
    "ClientCommand",
    "Connected",
    "Cut",
    "Header",
    "Logged",
    "NodeJoined",
    "Record",
    "ToolRun",
    "UpstreamFrame",
    "decode_record",
    "encode_record",
    "read_records",
]

RECORDING_VERSION: Final = 1
NO_FRAME: Final = msgspec.Raw(b"null")
"""``UpstreamFrame.frame`` of an elided frame."""
MAX_SEQ: Final = 2**53 - 1
"""The largest seq (or count) a record may name: what a JSON number holds exactly."""

# Numbers a reader can trust: a file that claims a seq of 2**70 is not a recording.
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
Rate = Annotated[int, msgspec.Meta(ge=1, le=384_000)]

AudioPolicy = Literal["none", "user", "all"]
"""What a recording keeps of audio: ``user`` (the user's audio, which a replay sends
again; the model's audio frames by size only), ``all`` (every audio frame whole),
``none`` (audio by size only)."""


class _Record(msgspec.Struct, tag_field="kind", kw_only=True, omit_defaults=True):
    t: float = 0.0


class Header(_Record, tag="header"):
    """The first record: which session, where and how it was recorded."""

    session_id: str
    node: str
    provider: str
    model: str
    version: int = RECORDING_VERSION  # checked by readers: a newer one needs a newer reader
    config: SessionConfig = msgspec.field(default_factory=SessionConfig)
    audio: AudioPolicy = "user"
    limit: Count = 0  # bytes the recording may take


class NodeJoined(_Record, tag="node"):
    """Another node went on recording the session (a takeover, or a reload)."""

    node: str
    provider: str
    model: str
    config: SessionConfig = msgspec.field(default_factory=SessionConfig)


class Connected(_Record, tag="connect"):
    """An upstream connection opened (numbered per node from 1)."""

    connection: Count
    provider: str
    model: str


class UpstreamFrame(_Record, tag="upstream"):
    """One frame on an upstream connection: ``frame`` as on the wire (JSON), or, for an
    audio frame (``elided``), its size and the ``audio`` record it carried (``ref``)."""

    connection: Count
    dir: Literal["out", "in"]
    frame: msgspec.Raw = NO_FRAME
    bytes: Count = 0
    elided: str = ""
    ref: Count = 0


class ClientCommand(_Record, tag="client"):
    """A client's command (``message``: its frame as JSON) and what the session had
    delivered when it was heard (``seq``); ``refused``: the error code it got."""

    seq: Count
    message: msgspec.Raw
    refused: str = ""


class ClientAudio(_Record, tag="audio"):
    """A chunk of the user's audio: PCM16 mono at ``rate`` (base64 in JSON)."""

    id: Count
    seq: Count
    rate: Rate
    pcm: bytes = b""


class ToolRun(_Record, tag="tool"):
    """A tool call that ran: its id (client tools), arguments, outcome and duration."""

    name: str
    args: msgspec.Raw
    status: str
    duration_ms: float
    runs_on: Literal["gateway", "client"] = "gateway"
    id: str = ""


class Logged(_Record, tag="event"):
    """An event the session logged and delivered (``event``: as its clients got it)."""

    event: msgspec.Raw


class Cut(_Record, tag="cut"):
    """The recording reached ``limit`` bytes: what happened after it was not kept."""

    limit: Count


Record = (
    Header
    | NodeJoined
    | Connected
    | UpstreamFrame
    | ClientCommand
    | ClientAudio
    | ToolRun
    | Logged
    | Cut
)

_BLANK: Final = frozenset(b" \t\r")
_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Record)
_BOM: Final = b"\xef\xbb\xbf"


def encode_record(record: Record) -> bytes:
    """One line of a recording (with its newline)."""
    return _encoder.encode(record) + b"\n"


def decode_record(line: bytes | str) -> Record:
    """One line of a recording. Raises ``msgspec.ValidationError``/``DecodeError``."""
    return _decoder.decode(line)


def read_records(data: bytes) -> Iterator[Record | str]:
    """The records of a recording's bytes, in order; a line that is not one is
    yielded as a string saying which line and why (a reader reports, never crashes).

    Lines are decoded from a view of ``data``, one at a time: no copy of the
    whole, however many lines it holds. JSON nested past the interpreter's
    recursion limit is a line that is not a record.
    """
    view = memoryview(data)
    start, number, size = 0, 0, len(data)
    if data.startswith(_BOM):  # an editor's UTF-8 byte-order mark: not part of the JSON
        start = len(_BOM)
    while start < size:
        end = data.find(b"\n", start)
        stop = size if end < 0 else end
        number += 1
        begin, start = start, stop + 1
        if begin == stop or (data[begin] in _BLANK and not data[begin:stop].strip()):
            continue
        try:
            yield _decoder.decode(view[begin:stop])
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            yield f"line {number}: not a recording record ({exc})"
        except RecursionError:
            yield f"line {number}: not a recording record (JSON nested too deeply)"
