"""Streams that break the protocol, and the settings that decide who may call, end to end.

Each bad stream is closed with a reason and leaves no session behind; the
node's metrics count the refusal by its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import gateway.phone.call
from gateway.client.carrier import stream_parameters
from protocol.media_stream import TWILIO, Connected, Media, MediaStreamWire, twilio_signature
from tests.phone.test_calls import call_sid, until, until_call
from tests.support.carrier import AUTH_TOKEN, PhoneGateway, espeak, phone_gateway

WIRE = MediaStreamWire(TWILIO)


async def open_stream(gw: PhoneGateway) -> ClientConnection:
    """A stream's WebSocket, signed as Twilio signs it, with nothing sent yet."""
    url = gw.stream_url
    return await connect(
        url, additional_headers={"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, url)}
    )


async def closed(ws: ClientConnection, timeout: float = 10.0) -> tuple[int, str]:
    """The gateway's close of ``ws`` (whatever it sent before is read and dropped)."""
    async with asyncio.timeout(timeout):
        with pytest.raises(ConnectionClosed):
            while True:
                await ws.recv()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


def refused(gw: PhoneGateway, reason: str) -> float:
    """The node's count of streams refused for ``reason`` (its Prometheus registry)."""
    registry = gw.gateway.node.metrics.registry
    value = registry.get_sample_value("rtgw_phone_streams_refused_total", {"reason": reason})
    return value or 0.0


async def test_a_stream_that_never_sends_start_is_closed_and_opens_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway.phone.call, "START_TIMEOUT", 0.5)
    async with phone_gateway(tmp_path) as gw:
        silent = await open_stream(gw)  # not a word
        chatty = await open_stream(gw)
        await chatty.send(WIRE.encode_inbound(Connected(protocol="Call", version="1.0.0")))
        silent_closed, chatty_closed = await asyncio.gather(closed(silent), closed(chatty))
        assert not gw.gateway.node.runtimes
        assert refused(gw, "no_start") == 2
    for code, reason in (silent_closed, chatty_closed):
        assert code == 1008 and "no start message within 0.5s" in reason


async def test_media_before_start_is_refused_and_opens_nothing(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        early = await open_stream(gw)
        await early.send(WIRE.encode_inbound(Media(payload=b"\xff" * 160, stream="MZ1")))
        code, reason = await closed(early)
        garbage = await open_stream(gw)
        await garbage.send("{not json")
        garbage_code, garbage_reason = await closed(garbage)
        assert not gw.gateway.node.runtimes
        assert refused(gw, "protocol") == 2
    assert code == 1008 and "expected start, got: Media" in reason
    assert garbage_code == 1008 and "expected start" in garbage_reason


def post_signed(url: str, signed_url: str, form: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=urlencode(form).encode(),
        headers={"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, signed_url, form.items())},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_behind_a_proxy_the_public_url_is_what_twilio_signed_and_dials(
    tmp_path: Path,
) -> None:
    """``--phone-public-url``: the webhook and the stream are signed for the public
    address (the TLS terminator's), the TwiML sends the stream there, and a signature
    for the address the gateway itself listens on opens nothing."""
    public = "wss://voice.example.com"
    async with phone_gateway(tmp_path, phone_public_url=public) as gw:
        webhook = f"{gw.api_url}/v1/phone/twilio/voice"
        form = {"CallSid": "CA5", "AccountSid": "AC1", "To": "+15550002222"}
        wrong, _ = await asyncio.to_thread(post_signed, webhook, webhook, form)
        status, twiml = await asyncio.to_thread(
            post_signed, webhook, "https://voice.example.com/v1/phone/twilio/voice", form
        )
        assert (wrong, status) == (403, 200)
        assert '<Stream url="wss://voice.example.com/v1/phone/twilio">' in twiml
        parameters = stream_parameters(twiml)
        local = gw.call(webhook=False, call_sid="CA5", parameters=parameters)
        with pytest.raises(InvalidStatus) as unproxied:  # signed for the local address
            await local.dial()
        call = gw.call(
            webhook=False,
            call_sid="CA5",
            parameters=parameters,
            signed_url=f"{public}/v1/phone/twilio",
        )
        await call.dial()
        await call.say(espeak("Hello."))
        await call.answered()
        await call.hang_up()
    assert unproxied.value.response.status_code == 403


async def test_calls_of_numbers_the_numbers_file_does_not_name_belong_to_the_phone_key(
    tmp_path: Path,
) -> None:
    async with phone_gateway(tmp_path, phone_key="switchboard") as gw:
        call = gw.call(parameters={"to": "+15550009999"})
        await call.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        meta = await gw.gateway.node.store.get_meta(call_sid(gw))
        await call.hang_up()
    assert meta is not None and meta.get("owner") == "switchboard"


async def test_a_carrier_flooding_a_call_with_junk_is_closed_and_logged_three_times(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 2,000 frames that are no carrier message, as fast as they go: the first three are
    # logged with what was wrong, the rest dropped; past the carrier's rate (150 a second,
    # bursts of 500) the stream is closed 4029 and the call ends as a flood.
    caplog.set_level("INFO", logger="gateway.phone")
    async with phone_gateway(tmp_path) as gw:
        call = gw.call()
        await call.dial()
        await until_call(gw)
        assert call.ws is not None
        with contextlib.suppress(ConnectionClosed):
            for n in range(2000):
                await call.ws.send(f"junk {n}")
        code, reason = await call.wait_closed()
        registry = gw.gateway.node.metrics.registry
        await until(
            lambda: registry.get_sample_value("rtgw_phone_calls_ended_total", {"reason": "flood"})
        )
    assert code == 4029 and "150 a second" in reason, (code, reason)
    bad = [r.getMessage() for r in caplog.records if "ignoring a bad frame" in r.getMessage()]
    assert len(bad) == 3 and "not logged" in bad[-1], bad


async def test_a_webhook_form_of_too_many_fields_is_refused_saying_so(tmp_path: Path) -> None:
    # 1,200 fields in 11 KB: under the body's size, over aiohttp's count of form fields.
    async with phone_gateway(tmp_path) as gw:
        webhook = f"{gw.api_url}/v1/phone/twilio/voice"
        form = {"CallSid": "CA9", **{f"x{n}": "1" for n in range(1200)}}
        status, text = await asyncio.to_thread(post_signed, webhook, webhook, form)
    assert status == 413 and "form fields" in text and "1048576" not in text, text
