"""The carriers' media-stream wire: both namings, both ways, and the signatures."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.media_stream import (
    MAX_MEDIA_PAYLOAD,
    TELNYX,
    TWILIO,
    Clear,
    Connected,
    Dtmf,
    MarkEcho,
    MarkOut,
    Media,
    MediaStreamWire,
    Play,
    Started,
    Stopped,
    fonoster_signature,
    twilio_signature,
    twilio_signature_valid,
)

twilio = MediaStreamWire(TWILIO)
telnyx = MediaStreamWire(TELNYX)


def test_twilios_messages_as_its_documentation_shows_them() -> None:
    """Shapes from Twilio's "Media Streams - WebSocket Messages" page."""
    start = twilio.decode_inbound(
        b'{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1",'
        b'"callSid":"CA1","tracks":["inbound"],"customParameters":{"token":"t","to":"+1"},'
        b'"mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},'
        b'"streamSid":"MZ1"}'
    )
    assert start == Started(
        stream="MZ1",
        call="CA1",
        account="AC1",
        tracks=("inbound",),
        custom={"token": "t", "to": "+1"},
        sequence=1,
    )
    media = twilio.decode_inbound(
        b'{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1",'
        b'"timestamp":"5","payload":"/38="},"streamSid":"MZ1"}'
    )
    assert media == Media(
        payload=b"\xff\x7f", stream="MZ1", track="inbound", chunk=1, timestamp=5, sequence=3
    )
    dtmf = twilio.decode_inbound(
        b'{"event":"dtmf","streamSid":"MZ1","sequenceNumber":"5",'
        b'"dtmf":{"track":"inbound_track","digit":"1"}}'
    )
    assert dtmf == Dtmf(digit="1", stream="MZ1", track="inbound_track", sequence=5)
    assert twilio.decode_inbound(
        b'{"event":"mark","sequenceNumber":"4","streamSid":"MZ1","mark":{"name":"my label"}}'
    ) == MarkEcho(name="my label", stream="MZ1", sequence=4)
    assert twilio.decode_inbound(
        b'{"event":"stop","sequenceNumber":"5","stop":{"accountSid":"AC1","callSid":"CA1"},'
        b'"streamSid":"MZ1"}'
    ) == Stopped(stream="MZ1", call="CA1", account="AC1", sequence=5)
    assert twilio.decode_inbound(
        b'{"event":"connected","protocol":"Call","version":"1.0.0"}'
    ) == Connected(protocol="Call", version="1.0.0")


def test_what_the_app_sends_twilio() -> None:
    decode = msgspec.json.decode
    assert decode(twilio.encode_outbound(Play("MZ1", b"\xff"))) == {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"payload": "/w=="},
    }
    assert decode(twilio.encode_outbound(MarkOut("MZ1", "m1"))) == {
        "event": "mark",
        "streamSid": "MZ1",
        "mark": {"name": "m1"},
    }
    assert decode(twilio.encode_outbound(Clear("MZ1"))) == {"event": "clear", "streamSid": "MZ1"}


def test_telnyx_spells_the_same_messages_its_own_way() -> None:
    decode = msgspec.json.decode
    start = decode(telnyx.encode_inbound(Started(stream="S1", call="C1", caller="+1", called="+2")))
    assert start["stream_id"] == "S1"
    assert start["start"]["call_control_id"] == "C1"
    assert start["start"]["from"] == "+1" and start["start"]["to"] == "+2"
    assert start["start"]["media_format"] == {
        "encoding": "audio/x-mulaw",
        "sample_rate": 8000,
        "channels": 1,
    }
    # The app's frames carry no stream id on Telnyx.
    assert decode(telnyx.encode_outbound(Clear("S1"))) == {"event": "clear"}
    assert decode(telnyx.encode_outbound(Play("S1", b"\x00"))) == {
        "event": "media",
        "media": {"payload": "AA=="},
    }


@pytest.mark.parametrize("wire", [twilio, telnyx], ids=["twilio", "telnyx"])
def test_every_message_survives_both_ways(wire: MediaStreamWire) -> None:
    inbound = [
        Connected(protocol="Call", version="1.0.0"),
        Started(stream="S", call="C", account="A", custom={"k": "v"}, sequence=1),
        Media(payload=b"\x01\x02", stream="S", track="inbound", chunk=2, timestamp=40, sequence=2),
        Dtmf(digit="#", stream="S", track="inbound_track", sequence=3),
        MarkEcho(name="m", stream="S", sequence=4),
        Stopped(stream="S", call="C", account="A", sequence=5),
    ]
    for message in inbound:
        assert wire.decode_inbound(wire.encode_inbound(message)) == message
    for out in [Play("S", b"abc"), MarkOut("S", "m"), Clear("S")]:
        back = wire.decode_outbound(wire.encode_outbound(out))
        expected = out if TWILIO is wire.naming else msgspec.structs.replace(out, stream="")
        assert back == expected


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"[1]", "not a JSON object"),
        (b"{", "not a JSON object"),
        (b'{"event": 5}', 'no string "event"'),
        (b'{"event": "hello"}', "invalid 'hello' message"),
        (b'{"event": "media", "media": {}}', "payload"),
        (b'{"event": "media", "media": {"payload": "not base64!"}}', "invalid 'media'"),
        (b"[" * 5000 + b"]" * 5000, ""),
    ],
)
def test_bad_frames_are_answers_not_exceptions(frame: bytes, says: str) -> None:
    problem = twilio.decode_inbound(frame)
    assert isinstance(problem, str) and says in problem


_EXPLAINED = (
    "the frame is not a JSON object (",
    'the frame has no string "event" field; expected one of ',
    "invalid '",
    "the frame nests too deeply",
)


def _explained(answer: object, messages: tuple[type, ...]) -> None:
    """A message of the direction's kinds, or one of the explanations (never an exception)."""
    if isinstance(answer, str):
        assert answer.startswith(_EXPLAINED), answer
    else:
        assert isinstance(answer, messages), answer


@pytest.mark.parametrize("wire", [twilio, telnyx])
def test_a_media_frame_holds_at_most_a_carriers_audio(wire: MediaStreamWire) -> None:
    """20 frames of 700 KB (87 s of μ-law each) were taken in; Twilio sends 20 ms."""
    import base64

    def media(size: int) -> bytes:
        payload = base64.b64encode(b"\xff" * size).decode()
        return msgspec.json.encode({"event": "media", "media": {"payload": payload}})

    assert isinstance(wire.decode_inbound(media(160)), Media)
    assert isinstance(wire.decode_inbound(media(MAX_MEDIA_PAYLOAD)), Media)
    problem = wire.decode_inbound(media(700_000))
    assert isinstance(problem, str) and f"at most {MAX_MEDIA_PAYLOAD} bytes" in problem
    problem = wire.decode_inbound(media(MAX_MEDIA_PAYLOAD + 1))
    assert isinstance(problem, str) and "refused unheard" in problem


@given(st.binary(max_size=200))
def test_no_bytes_make_decoding_raise(data: bytes) -> None:
    _explained(twilio.decode_inbound(data), (Connected, Started, Media, Dtmf, MarkEcho, Stopped))
    _explained(telnyx.decode_outbound(data), (Play, MarkOut, Clear))
    if not data.lstrip().startswith(b"{"):  # not even the start of an object
        assert isinstance(twilio.decode_inbound(data), str)


# twilio/twilio-python tests/unit/test_request_validator.py: its vectors.
URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
PARAMS = {
    "CallSid": "CA1234567890ABCDE",
    "Digits": "1234",
    "From": "+14158675309",
    "To": "+18005551212",
    "Caller": "+14158675309",
}


def test_twilio_signature_matches_twilios_own_test_vectors() -> None:
    assert twilio_signature("12345", URL, PARAMS.items()) == "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    repeated = [("Sid", "CA123"), ("SidAccount", "AC123"), ("Digits", "5678"), ("Digits", "1234")]
    assert twilio_signature("12345", URL, repeated) == "IK+Dwps556ElfBT0I3Rgjkr1wJU="


def test_twilio_signature_is_checked_with_and_without_the_port() -> None:
    assert twilio_signature_valid("12345", URL, PARAMS.items(), "RSOYDt4T1cUTdK1PDd93/VVr8B8=")
    with_port = URL.replace(".com", ".com:1234")
    assert twilio_signature_valid(
        "12345", with_port, PARAMS.items(), "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    )
    # Signed with :443 added (twilio-python's test_validation_adds_port_on_https).
    assert twilio_signature_valid("12345", URL, PARAMS.items(), "kvajT1Ptam85bY51eRf/AJRuM3w=")
    assert not twilio_signature_valid("12345", URL, PARAMS.items(), "RSOYDt4T1cUTdK1PDd93/VVr8B8")
    assert not twilio_signature_valid("54321", URL, PARAMS.items(), "RSOYDt4T1cUTdK1PDd93/VVr8B8=")


def test_a_streams_signature_covers_its_url_alone() -> None:
    url = "wss://voice.example.com/v1/phone/twilio"
    signature = twilio_signature("tok", url)
    assert twilio_signature_valid("tok", url, (), signature)
    assert twilio_signature_valid(
        "tok", "wss://voice.example.com:443/v1/phone/twilio", (), signature
    )
    assert not twilio_signature_valid("tok", url + "x", (), signature)


def test_fonoster_signs_the_timestamp_and_url_in_lowercase_hex() -> None:
    signature = fonoster_signature("secret", "1700000000", "wss://a.example/s")
    assert signature == signature.lower() and len(signature) == 64
    assert signature != fonoster_signature("secret", "1700000001", "wss://a.example/s")
