"""A large ``input_audio_buffer.append`` read without decoding its audio as JSON
(``decode_large_append``) means what ``decode_client`` reads in it, or is left to it,
whatever the encoder's spacing, key order or escapes; and its base64 is read a
slice at a time, refused whole when any of it is not base64 (``append_pcm_slices``)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.openai_audio import APPEND_SLICE, append_pcm_slices
from protocol.openai_events import InputAudioBufferAppend, decode_client, decode_large_append

pytestmark = pytest.mark.timeout(60)

AUDIO = base64.b64encode(bytes(range(256)) * 40).decode()
SPACING = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])
EXTRA = st.dictionaries(
    st.sampled_from(["event_id", "audio", "bogus", "type"]),
    st.one_of(st.text(alphabet='a"\\/: audio', max_size=12), st.integers()),
    max_size=2,
)


@settings(max_examples=300, deadline=None)
@given(extra=EXTRA, spacing=SPACING, audio_first=st.booleans(), escape=st.booleans())
def test_it_reads_what_decode_client_reads_or_leaves_it(
    extra: dict[str, object], spacing: tuple[str, str], audio_first: bool, escape: bool
) -> None:
    fields: dict[str, object] = {"audio": AUDIO} if audio_first else {}
    fields.update({"type": "input_audio_buffer.append", **extra})
    if not audio_first:
        fields.setdefault("audio", AUDIO)
    text = json.dumps(fields, separators=spacing)
    if escape:
        text = text.replace("/", "\\/")  # as PHP's encoder writes base64's slash
    frame = text.encode()
    large = decode_large_append(frame)
    whole = decode_client(frame)
    if large is None:
        return  # decode_client reads it: the same answer as for any other event
    event, audio = large
    assert type(whole) is InputAudioBufferAppend
    assert whole == InputAudioBufferAppend(audio=bytes(audio).decode(), event_id=event.event_id)


def test_the_sdks_frame_is_read_without_decoding_its_audio() -> None:
    frame = json.dumps({"type": "input_audio_buffer.append", "audio": AUDIO, "event_id": "e"})
    large = decode_large_append(frame.encode())
    assert large is not None
    assert large[0] == InputAudioBufferAppend(audio="", event_id="e")
    assert bytes(large[1]).decode() == AUDIO


@pytest.mark.parametrize("as_bytes", [False, True])
def test_slices_are_the_whole_audio_and_a_bad_one_refuses_it(as_bytes: bool) -> None:
    pcm = bytes(range(256)) * (APPEND_SLICE // 100)  # 3.4 slices of base64
    text = base64.b64encode(pcm).decode()

    def read(audio: str) -> list[bytes | None]:
        return list(append_pcm_slices(memoryview(audio.encode()) if as_bytes else audio))

    pieces = read(text)
    assert len(pieces) == 4 and b"".join(p or b"" for p in pieces) == pcm
    for bad in (text + "!", text[:-4] + "A===", "é" + text[1:]):
        assert read(bad)[-1] is None
    # Padding inside: a slice that ends in "=" where more follows.
    inside = text[: APPEND_SLICE - 4] + base64.b64encode(b"x").decode() + text[APPEND_SLICE:]
    assert read(inside)[-1] is None
