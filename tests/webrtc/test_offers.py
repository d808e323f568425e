"""Offers a peer may post that no browser would: each gets its status and what to do,
before the work they would cost (docs/webrtc.md, "Limits, before the work").

- Offers posted together hold at most ``webrtc_max_calls`` slots: the cap counted
  only calls already answered, so 20 offers at once on a node of 3 calls were all
  answered 201 (each an aiortc peer connection until its connect timeout).
- An offer of many media sections is refused before aiortc is given it: 500 audio
  sections fit in 64 KiB, and answering one held the loop ~150 ms (ten at once: 1.35 s
  of ``/healthz``) for an answer of 525 KB. An offer with no audio section says so
  (aiortc's own words were "None is not in list").
- A body that stalls is 408 within ``body_timeout``, as the HTTP API's are (it was read
  with no deadline: a byte every second kept the request open for good); a compressed
  one is 415 (it was "the body is no SDP offer").
"""

from __future__ import annotations

import asyncio
import gzip
import re
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from tests.api.conftest import Keys, NodesFactory, keys, nodes, store_kind

__all__ = ["keys", "nodes", "store_kind"]

pytestmark = pytest.mark.timeout(60)

SDP = {"Content-Type": "application/sdp"}


async def an_offer(*, audio: bool = True) -> str:
    """An offer as an app makes one: the microphone's track and the ``oai-events`` channel."""
    pc = RTCPeerConnection()
    try:
        if audio:
            pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        return str(pc.localDescription.sdp)
    finally:
        await pc.close()


def many_sections(offer: str, count: int) -> str:
    """``offer``'s session part with ``count`` small audio sections of its own."""
    head = offer.split("\r\nm=", 1)[0].replace("a=group:BUNDLE 0 1\r\n", "")
    lines = offer.split("\r\n")
    ice = [line for line in lines if line.startswith(("a=ice-ufrag", "a=ice-pwd", "a=finger"))]
    section = (
        "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=mid:m{}\r\na=sendrecv\r\n"
        "a=rtpmap:0 PCMU/8000\r\na=setup:actpass\r\na=rtcp-mux\r\n"
    )
    return head + "\r\n" + "\r\n".join(ice) + "\r\n" + "".join(map(section.format, range(count)))


async def post(
    http: aiohttp.ClientSession, url: str, body: str | bytes, **headers: str
) -> tuple[int, dict[str, Any]]:
    async with http.post(url, data=body, headers={**SDP, **headers}) as r:
        return r.status, await r.json(content_type=None) if r.status != 201 else {}


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_offers_posted_together_hold_at_most_the_nodes_calls(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    offer = await an_offer()
    async with nodes(1, api_port=None, api_keys_file="", webrtc_max_calls=3) as (gw,):
        url = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            answers = await asyncio.gather(*(post(http, url, offer) for _ in range(20)))
            statuses = sorted(status for status, _ in answers)
            assert statuses == [201] * 3 + [429] * 17, statuses
            busy = next(body for status, body in answers if status == 429)
            assert busy["error"]["code"] == "busy"


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_offers_no_call_needs_are_refused_before_aiortc_saying_why(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    offer = await an_offer()
    async with nodes(1, api_port=None, api_keys_file="") as (gw,):
        url = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls"
        async with aiohttp.ClientSession() as http:
            crowded = many_sections(offer, 500)
            assert len(crowded) < 64 * 1024  # inside webrtc_max_sdp: only its sections refuse it
            status, body = await post(http, url, crowded)
            assert status == 400 and body["error"]["code"] == "invalid_offer", body
            assert "500 media sections" in body["error"]["message"]
            # Four sections pass the count; with no data channel the call could not work
            # (it was accepted, then dropped 10 s later): refused for that, saying so.
            status, body = await post(http, url, many_sections(offer, 4))
            assert status == 400 and "no data channel (m=application)" in body["error"]["message"]
            status, body = await post(http, url, await an_offer(audio=False))
            assert status == 400 and "no audio section (m=audio)" in body["error"]["message"]
            # Candidates the node would send STUN checks to, each an address the offer
            # chose: a browser's few are taken, 900 are refused before aiortc sees them.
            at = offer.index("a=end-of-candidates") if "a=end-of-candidates" in offer else -1
            candidates = "".join(
                f"a=candidate:{n} 1 udp 2130706431 10.{n // 250}.{n % 250}.1 {9000 + n} typ host\r\n"
                for n in range(900)
            )
            flooded = offer[:at] + candidates + offer[at:] if at >= 0 else offer + candidates
            status, body = await post(http, url, flooded)
            own = offer.count("a=candidate:")  # aiortc's own few
            assert own <= 64 and (await post(http, url, offer))[0] == 201
            message = body["error"]["message"]
            assert status == 400 and f"{900 + own} ICE candidates" in message, body
            # Found from outside: aiortc applies every rtcp-fb line to every codec; 1,400
            # of each in 47 KB held the loop 2-3 s and kept 200 MB while the call lived.
            audio_at = offer.index("m=application")
            fb = "".join(
                f"a=rtpmap:{96 + n % 30} x{n}/48000\r\na=rtcp-fb:* nack\r\n" for n in range(1400)
            )
            status, body = await post(http, url, offer[:audio_at] + fb + offer[audio_at:])
            assert status == 400, body
            assert re.match(
                r"the offer has 14\d\d a=(rtpmap|rtcp-fb) lines", body["error"]["message"]
            )
            # Sections split by a bare CR are sections too (aiortc splits any line break).
            bare = many_sections(offer, 200).replace("\r\nm=audio", "\rm=audio")
            status, body = await post(http, url, bare)
            assert status == 400 and "200 media sections" in body["error"]["message"], body
            packed = gzip.compress(offer.encode())
            status, body = await post(http, url, packed, **{"Content-Encoding": "gzip"})
            assert status == 415 and "uncompressed" in body["error"]["message"], body
            assert (await post(http, url, offer))[0] == 201


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_an_offer_whose_body_stalls_is_408_within_the_body_timeout(
    nodes: NodesFactory, keys: Keys, store_kind: str
) -> None:
    async with nodes(1, api_port=None, api_keys_file="", body_timeout=1.0) as (gw,):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /openai/v1/realtime/calls HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/sdp\r\nContent-Length: 1000\r\n\r\nv=0\r\n"
        )
        async with asyncio.timeout(10):
            answer = await reader.read()  # to the close
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer


def multipart(parts: list[tuple[str, str]]) -> tuple[str, str]:
    """``(body, content type)`` of a form of ``parts``, as openai-python posts one."""
    body = "".join(
        f'--B\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in parts
    )
    return body + "--B--\r\n", "multipart/form-data; boundary=B"


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_bodies_that_cost_the_loop_are_refused_unparsed_and_nothing_is_a_500(
    nodes: NodesFactory, keys: Keys, store_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: a session nested 20,000 deep was a 500 with a RecursionError traceback
    # (read before the key), and a form of 1,000 parts held the loop 120 ms.
    offer = await an_offer()
    deep = "[" * 20_000 + "]" * 20_000
    async with nodes(1, api_port=None, api_keys_file="") as (gw,):
        url = f"http://127.0.0.1:{gw.port}/openai/v1/realtime/calls"
        async with aiohttp.ClientSession() as http:
            as_json = '{"sdp": "v=0", "session": ' + deep + "}"
            status, body = await post(http, url, as_json, **{"Content-Type": "application/json"})
            assert status == 400 and "nests too deeply" in body["error"]["message"], body
            form, form_type = multipart([("sdp", offer), ("session", deep)])
            status, body = await post(http, url, form, **{"Content-Type": form_type})
            assert status == 400 and "nests too deeply" in body["error"]["message"], body
            crowd, _ = multipart([*((f"p{i}", "x") for i in range(1000)), ("sdp", offer)])
            status, body = await post(http, url, crowd, **{"Content-Type": form_type})
            assert status == 400 and "at most 4 parts" in body["error"]["message"], body
            # Parts led by a bare CR are parts to the email parser as well (9,000 held it 1.2 s).
            crowd = crowd.replace("\r\n--B", "\r--B")
            status, body = await post(http, url, crowd, **{"Content-Type": form_type})
            assert status == 400 and "at most 4 parts" in body["error"]["message"], body
            form, _ = multipart([("sdp", offer), ("session", '{"instructions": "hi"}')])
            assert (await post(http, url, form, **{"Content-Type": form_type}))[0] == 201
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
