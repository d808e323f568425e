"""A telephone carrier's media stream: the WebSocket messages, both ways.

Twilio Media Streams is the shape the others follow (docs/phone.md has the
sources): JSON text frames tagged on ``event``. The carrier sends
``connected``, ``start`` (the stream's and the call's ids, the custom
parameters the TwiML gave, the media format), ``media`` (base64 G.711 μ-law
at 8 kHz), ``dtmf``, ``mark`` (the echo of a mark the app sent, once the
audio queued before it has played) and ``stop``; the app sends ``media``,
``mark`` and ``clear`` (drop the audio queued, echo every pending mark).

Carriers that speak it differ in field names only (Telnyx: ``stream_id``,
``sequence_number``, ``media_format``…; Twilio, SignalWire and Fonoster:
``streamSid``, ``sequenceNumber``, ``mediaFormat``…), so a ``Naming`` says
how each field is spelt and the message Structs are made from it once
(``MediaStreamWire``). Both sides use it: the gateway's phone edge decodes
what a carrier sends and encodes what it answers; the carrier simulator of
the client package does the opposite.

The code speaks ``Inbound`` and ``Outbound`` messages, Structs of their
own: the wire's layout (``start.mediaFormat.sampleRate``) stays in here.
Decoding never raises: a frame that is not a message of the carrier's is a
``str`` saying what was wrong.

The Twilio request signature (``X-Twilio-Signature``) and Fonoster's are
here too, pure functions both sides share.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec

__all__ = [
    "MAX_MEDIA_PAYLOAD",
    "TELNYX",
    "TWILIO",
    "Clear",
    "Connected",
    "Dtmf",
    "Inbound",
    "MarkEcho",
    "MarkOut",
    "Media",
    "MediaStreamWire",
    "Naming",
    "Outbound",
    "Play",
    "Started",
    "Stopped",
    "fonoster_signature",
    "twilio_signature",
    "twilio_signature_valid",
]


# --- the messages as the code sees them ------------------------------------------------


class Connected(msgspec.Struct, frozen=True):
    """The first message: the carrier connected (``protocol``, ``version``)."""

    protocol: str = ""
    version: str = ""


class Started(msgspec.Struct, frozen=True):
    """The stream started: whose call it is, its media format, the app's parameters.

    ``custom``: the ``<Parameter>`` values of the TwiML (``customParameters``).
    ``caller``/``called``: the call's numbers where the carrier's ``start`` has
    them (Telnyx); Twilio's has none (the TwiML passes them as parameters).
    """

    stream: str
    call: str = ""
    account: str = ""
    tracks: tuple[str, ...] = ()
    custom: dict[str, str] = msgspec.field(default_factory=dict)
    encoding: str = "audio/x-mulaw"
    rate: int = 8000
    channels: int = 1
    caller: str = ""
    called: str = ""
    sequence: int = 0


class Media(msgspec.Struct, frozen=True):
    """A piece of the caller's audio (``payload``: the carrier's encoding, μ-law)."""

    payload: bytes
    stream: str = ""
    track: str = ""
    chunk: int = 0
    timestamp: int = 0  # ms from the stream's start
    sequence: int = 0


class Dtmf(msgspec.Struct, frozen=True):
    """The caller pressed a key (``digit``: 0-9, *, #, A-D)."""

    digit: str
    stream: str = ""
    track: str = ""
    sequence: int = 0


class MarkEcho(msgspec.Struct, frozen=True):
    """A mark the app sent came back: the audio before it has played (or was cleared)."""

    name: str
    stream: str = ""
    sequence: int = 0


class Stopped(msgspec.Struct, frozen=True):
    """The stream ended (the call hung up, or left the ``<Connect>``)."""

    stream: str = ""
    call: str = ""
    account: str = ""
    sequence: int = 0


Inbound = Connected | Started | Media | Dtmf | MarkEcho | Stopped
"""What a carrier sends."""


class Play(msgspec.Struct, frozen=True):
    """Audio for the caller, queued by the carrier behind what it holds."""

    stream: str
    payload: bytes


class MarkOut(msgspec.Struct, frozen=True):
    """A mark after the audio sent so far: echoed once that has played."""

    stream: str
    name: str


class Clear(msgspec.Struct, frozen=True):
    """Drop the audio the carrier holds for the caller (it echoes the pending marks)."""

    stream: str


Outbound = Play | MarkOut | Clear
"""What the app sends."""


# --- how a carrier spells the fields ----------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class Naming:
    """How one carrier's wire spells the messages' fields.

    The Python names below are Twilio's in snake_case; ``style`` spells each
    (``camel``: ``stream_sid`` → ``streamSid``; ``snake``: as is) unless
    ``names`` spells it otherwise. ``stream_in_outbound``: the app's
    messages carry the stream's id (Telnyx's do not).
    """

    name: str
    style: str = "camel"
    names: Mapping[str, str] = field(default_factory=dict)
    stream_in_outbound: bool = True

    def spell(self, python_name: str) -> str:
        spelt = self.names.get(python_name)
        if spelt is not None:
            return spelt
        return _camel(python_name) if self.style == "camel" else python_name


TWILIO: Final = Naming("twilio", "camel", {"from_": "from"})
"""Twilio Media Streams (also SignalWire's and Fonoster's Twilio-compatible streams)."""

TELNYX: Final = Naming(
    "telnyx",
    "snake",
    {"stream_sid": "stream_id", "call_sid": "call_control_id", "from_": "from"},
    stream_in_outbound=False,
)
"""Telnyx media streaming over WebSockets (snake_case; no stream id on what the app sends)."""


Text = str | int  # a number a carrier may send as a string ("1") or not

MAX_MEDIA_PAYLOAD: Final = 16_000
"""Bytes of audio in one carrier ``media`` frame: 2 s of Twilio's 8 kHz μ-law, which it
sends in 20 ms frames (160 bytes); 1 s at 8 kHz of 16-bit audio. A larger frame is
refused as a bad frame (20 frames of 700 KB, 87 s each, were once taken in)."""


class MediaStreamWire:
    """One carrier's message Structs, made from its ``Naming``, with their codecs."""

    def __init__(self, naming: Naming) -> None:
        self.naming = naming
        rename: Callable[[str], str] = naming.spell

        # defstruct, not class statements: the field types are these local classes
        # (annotations are strings here, which msgspec resolves at module level only).
        def struct(name: str, fields: list[Any], omit: bool = True, **config: Any) -> Any:
            return msgspec.defstruct(name, fields, rename=rename, omit_defaults=omit, **config)

        def message(tag: str, fields: list[Any], seq: bool = True) -> Any:
            tail: list[Any] = [("stream_sid", str, "")]
            if seq:
                tail.append(("sequence_number", Text, 0))
            return struct(tag.title() + "Frame", [*fields, *tail], tag_field="event", tag=tag)

        def default(kind: Any) -> Any:
            return msgspec.field(default_factory=kind)

        media_format = struct(
            "MediaFormat",
            [
                ("encoding", str, "audio/x-mulaw"),
                ("sample_rate", Text, 8000),
                ("channels", Text, 1),
            ],
            omit=False,  # always all three, as numbers (Twilio's start has them so)
        )
        start_body = struct(
            "StartBody",
            [
                ("stream_sid", str, ""),
                ("call_sid", str, ""),
                ("account_sid", str, ""),
                ("tracks", list[str], default(list)),
                ("custom_parameters", dict[str, str], default(dict)),
                ("media_format", media_format, default(media_format)),
                ("from_", str, ""),
                ("to", str, ""),
            ],
        )
        media_body = struct(
            "MediaBody",
            [("payload", bytes), ("track", str, ""), ("chunk", Text, 0), ("timestamp", Text, 0)],
        )
        caller_media_body = struct(  # a carrier's frame: at most MAX_MEDIA_PAYLOAD of audio
            "CallerMediaBody",
            [
                ("payload", Annotated[bytes, msgspec.Meta(max_length=MAX_MEDIA_PAYLOAD)]),
                ("track", str, ""),
                ("chunk", Text, 0),
                ("timestamp", Text, 0),
            ],
        )
        dtmf_body = struct("DtmfBody", [("digit", str), ("track", str, "")])
        mark_body = struct("MarkBody", [("name", str)])
        stop_body = struct("StopBody", [("call_sid", str, ""), ("account_sid", str, "")])

        connected_in = struct(
            "ConnectedFrame",
            [("protocol", str, ""), ("version", str, "")],
            tag_field="event",
            tag="connected",
        )
        start_in = message("start", [("start", start_body)])
        media_in = message("media", [("media", caller_media_body)])
        dtmf_in = message("dtmf", [("dtmf", dtmf_body)])
        mark_in = message("mark", [("mark", mark_body)])
        stop_in = message("stop", [("stop", stop_body, default(stop_body))])
        play_out = message("media", [("media", media_body)], seq=False)
        mark_out = message("mark", [("mark", mark_body)], seq=False)
        clear_out = message("clear", [], seq=False)

        self._kinds = (media_format, start_body, media_body, dtmf_body, mark_body, stop_body)
        self._inbound = (connected_in, start_in, media_in, dtmf_in, mark_in, stop_in)
        self._outbound = (play_out, mark_out, clear_out)
        self._in_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            connected_in | start_in | media_in | dtmf_in | mark_in | stop_in
        )
        self._out_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            play_out | mark_out | clear_out
        )
        self._probe = msgspec.json.Decoder(dict[str, Any])
        self._encoder = msgspec.json.Encoder()

    # ------------------------------------------------------------------ the app's side

    def decode_inbound(self, data: bytes | str) -> Inbound | str:
        """A carrier's frame as a message, or what was wrong with it (never raises)."""
        try:
            wire = self._in_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if str(exc).endswith("`$.media.payload`") and "length <=" in str(exc):
                return (
                    f"a media frame carries at most {MAX_MEDIA_PAYLOAD} bytes of audio (a "
                    "carrier sends 20 ms, 160 bytes of μ-law): this one was refused unheard"
                )
            return self._explain(data, exc, "connected, start, media, dtmf, mark, stop")
        except RecursionError:
            return "the frame nests too deeply to be a media-stream message"
        connected, start, media, dtmf, mark, _stop = self._inbound
        kind = type(wire)
        if kind is media:
            body = wire.media
            return Media(
                payload=body.payload,
                stream=wire.stream_sid,
                track=body.track,
                chunk=_int(body.chunk),
                timestamp=_int(body.timestamp),
                sequence=_int(wire.sequence_number),
            )
        if kind is start:
            body = wire.start
            fmt = body.media_format
            return Started(
                stream=wire.stream_sid or body.stream_sid,
                call=body.call_sid,
                account=body.account_sid,
                tracks=tuple(body.tracks),
                custom=dict(body.custom_parameters),
                encoding=fmt.encoding,
                rate=_int(fmt.sample_rate),
                channels=_int(fmt.channels),
                caller=body.from_,
                called=body.to,
                sequence=_int(wire.sequence_number),
            )
        if kind is dtmf:
            return Dtmf(
                digit=wire.dtmf.digit,
                stream=wire.stream_sid,
                track=wire.dtmf.track,
                sequence=_int(wire.sequence_number),
            )
        if kind is mark:
            return MarkEcho(
                name=wire.mark.name, stream=wire.stream_sid, sequence=_int(wire.sequence_number)
            )
        if kind is connected:
            return Connected(protocol=wire.protocol, version=wire.version)
        return Stopped(
            stream=wire.stream_sid,
            call=wire.stop.call_sid,
            account=wire.stop.account_sid,
            sequence=_int(wire.sequence_number),
        )

    def encode_outbound(self, message: Outbound) -> bytes:
        """The app's message as the carrier's JSON frame."""
        play, mark, clear = self._outbound
        _, _, media_body, _, mark_body, _ = self._kinds
        stream = message.stream if self.naming.stream_in_outbound else ""
        wire: Any
        if type(message) is Play:
            wire = play(media=media_body(payload=message.payload), stream_sid=stream)
        elif type(message) is MarkOut:
            wire = mark(mark=mark_body(name=message.name), stream_sid=stream)
        else:
            wire = clear(stream_sid=stream)
        return self._encoder.encode(wire)

    # ------------------------------------------------------------------ the carrier's side

    def encode_inbound(self, message: Inbound) -> bytes:
        """A carrier's message as its JSON frame (the carrier simulator sends these)."""
        connected, start, media, dtmf, mark, stop = self._inbound
        fmt_kind, start_body, media_body, dtmf_body, mark_body, stop_body = self._kinds
        seq = str(getattr(message, "sequence", 0))
        wire: Any
        if type(message) is Media:
            wire = media(
                media=media_body(
                    payload=message.payload,
                    track=message.track,
                    chunk=str(message.chunk),
                    timestamp=str(message.timestamp),
                ),
                stream_sid=message.stream,
                sequence_number=seq,
            )
        elif type(message) is Started:
            wire = start(
                start=start_body(
                    stream_sid=message.stream,
                    call_sid=message.call,
                    account_sid=message.account,
                    tracks=list(message.tracks),
                    custom_parameters=dict(message.custom),
                    media_format=fmt_kind(
                        encoding=message.encoding,
                        sample_rate=message.rate,
                        channels=message.channels,
                    ),
                    from_=message.caller,
                    to=message.called,
                ),
                stream_sid=message.stream,
                sequence_number=seq,
            )
        elif type(message) is Dtmf:
            wire = dtmf(
                dtmf=dtmf_body(digit=message.digit, track=message.track),
                stream_sid=message.stream,
                sequence_number=seq,
            )
        elif type(message) is MarkEcho:
            wire = mark(
                mark=mark_body(name=message.name), stream_sid=message.stream, sequence_number=seq
            )
        elif type(message) is Stopped:
            wire = stop(
                stream_sid=message.stream,
                sequence_number=seq,
                stop=stop_body(call_sid=message.call, account_sid=message.account),
            )
        else:
            assert type(message) is Connected
            wire = connected(protocol=message.protocol, version=message.version)
        return self._encoder.encode(wire)

    def decode_outbound(self, data: bytes | str) -> Outbound | str:
        """The app's frame as a message, or what was wrong with it (never raises)."""
        try:
            wire = self._out_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._explain(data, exc, "media, mark, clear")
        except RecursionError:
            return "the frame nests too deeply to be a media-stream message"
        play, mark, _clear = self._outbound
        if type(wire) is play:
            return Play(stream=wire.stream_sid, payload=wire.media.payload)
        if type(wire) is mark:
            return MarkOut(stream=wire.stream_sid, name=wire.mark.name)
        return Clear(stream=wire.stream_sid)

    def _explain(self, data: bytes | str, exc: Exception, events: str) -> str:
        what = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        try:
            probe = self._probe.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return f"the frame is not a JSON object ({what})"
        event = probe.get("event")
        if not isinstance(event, str):
            return f'the frame has no string "event" field; expected one of {events}'
        shown = event if len(event) <= 40 else event[:40] + "…"
        return f"invalid {shown!r} message for a {self.naming.name} stream: {what}"


def _int(value: Text) -> int:
    """A number a carrier sent as a string or not; a string that is none is 0."""
    if isinstance(value, int):
        return value
    return int(value) if value.isascii() and value.isdecimal() and len(value) <= 18 else 0


# --- request signatures -------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """``X-Twilio-Signature``: base64 HMAC-SHA1, keyed with the auth token, of the URL
    followed by every POST parameter's name and value, sorted by name then value."""
    text = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), text.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def twilio_signature_valid(
    auth_token: str, url: str, params: Iterable[tuple[str, str]], signature: str
) -> bool:
    """Whether ``signature`` signs ``url`` and ``params``: as Twilio's own validators do,
    the URL is tried with and without its port (Twilio's signing is not consistent)."""
    pairs = list(params)
    expected = signature.encode()
    return any(
        hmac.compare_digest(twilio_signature(auth_token, candidate, pairs).encode(), expected)
        for candidate in _with_and_without_port(url)
    )


def _with_and_without_port(url: str) -> list[str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        return [url, urlunsplit(parts._replace(netloc=host))]
    default = 443 if parts.scheme in ("https", "wss") else 80
    return [url, urlunsplit(parts._replace(netloc=f"{host}:{default}"))]


def fonoster_signature(secret: str, timestamp: str, url: str) -> str:
    """``x-fonoster-signature``: lowercase hex HMAC-SHA256, keyed with the stream's
    signing secret, of ``<timestamp>.<url>`` (the URL as configured, query included)."""
    text = f"{timestamp}.{url}"
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
