"""Phone calls through a real gateway, dialled as Twilio dials them.

A simulated carrier (``gateway.client.carrier``) opens the media stream
signed with the auth token, streams espeak-ng speech as μ-law at real time,
plays what the gateway sends at real time (echoing marks as it goes) and
honours ``clear``; the model is the in-process simulator, whose VAD hears
the speech and whose answer is spoken as a tone.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest
from websockets.exceptions import InvalidStatus

from gateway.common.pcm import mulaw_decode, rms
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from protocol.assembly import decode_history_item
from protocol.events import (
    Cancelled,
    Dtmf,
    PhoneCall,
    Respond,
    SpeechStarted,
    User,
    decode_event,
)
from tests.support.carrier import (
    AUTH_TOKEN,
    AppClient,
    PhoneGateway,
    TwilioStandIn,
    espeak,
    phone_gateway,
)

HELLO = "Hello, I would like to book a table for two tonight."


def numbers_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "numbers.toml"
    path.write_text(text)
    return str(path)


def call_sid(gw: PhoneGateway) -> str:
    """The session id of the one call on the node."""
    [sid] = gw.gateway.phone.control.calls
    return sid


async def until_call(gw: PhoneGateway) -> str:
    """The session id of the node's one call, once it is open."""
    await until(lambda: bool(gw.gateway.phone.control.calls))
    return call_sid(gw)


async def until(predicate: Any, timeout: float = 20.0) -> None:
    """Wait for the gateway's side of a call (its calls by session: no event to await)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the node's calls have no event for tests
            await asyncio.sleep(0.02)


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else msgspec.json.encode(body)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return msgspec.json.decode(response.read())


async def export(gw: PhoneGateway, sid: str) -> list[Any]:
    """The session's events through the HTTP API, once its call's end is logged."""
    url = f"{gw.api_url}/v1/sessions/{sid}/events?limit=1000"
    async with asyncio.timeout(10):
        while True:
            page = await asyncio.to_thread(http, "GET", url)
            events = [decode_event(msgspec.json.encode(e)) for e in page["events"]]
            if any(isinstance(e, PhoneCall) and e.status == "ended" for e in events):
                return events


async def test_a_signed_call_is_answered_in_mulaw_with_marks_and_exported(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        call = gw.call(parameters={"from": "+15550001111", "to": "+15550002222"})
        await call.dial()
        await call.say(espeak(HELLO))
        await call.answered()
        await call.heard_all()
        sid = call_sid(gw)
        await call.hang_up()
        await until(lambda: not gw.gateway.phone.control.calls)
        events = await export(gw, sid)
    # Spoken answers came back as μ-law media, each chunk followed by a mark the carrier echoed.
    assert call.media_received > 0
    assert call.marks_echoed == call.media_received
    assert rms(mulaw_decode(bytes(call.audio_received))) > 1000  # the simulator speaks a tone
    assert call.played_ms == len(call.audio_received) // 8
    # The session's log holds the call: who called, what was said, its end and metrics.
    started, *_, ended = [e for e in events if isinstance(e, PhoneCall)]
    assert (started.status, started.caller, started.called) == (
        "started",
        "+15550001111",
        "+15550002222",
    )
    assert ended.status == "ended" and ended.reason == "hangup"
    assert not isinstance(ended.metrics, msgspec.UnsetType)
    # The talk time the gateway counted from the marks: what the carrier played (each
    # chunk's ms rounded down).
    assert call.played_ms - call.media_received <= ended.metrics.talk_ms <= call.played_ms
    assert len(ended.metrics.first_audio_ms) == 1
    assert ended.metrics.usage.output > 0
    assert ended.metrics.barge_ins == 0
    [user] = [e for e in events if isinstance(e, User)]
    assert user.source == "audio"
    assert "".join(e.content for e in events if isinstance(e, Respond)).startswith("Echo: (speech")


async def test_speech_over_an_answer_clears_it_and_cuts_it_where_the_caller_stopped(
    tmp_path: Path,
) -> None:
    """A long greeting, streamed slower than real time would need (so the turn still runs),
    faster than it plays: the caller speaks over it after about a second."""
    greeting = "/raw " + "z" * 200
    async with phone_gateway(
        tmp_path,
        phone_numbers_file=numbers_file(tmp_path, f'[defaults]\ngreeting = "{greeting}"\n'),
        sim_tokens_per_second=20,
        sim_chunk_size=2,
    ) as gw:
        call = gw.call()
        await call.dial()
        await call.wait_for(lambda: call.played_ms >= 1000)
        await call.say(espeak("Wait, stop."))
        await call.wait_for(lambda: call.clears == 1)
        sid = call_sid(gw)
        await call.hang_up()
        await until(lambda: not gw.gateway.phone.control.calls)
        events = await export(gw, sid)
    assert len(call.barge_in_to_silence) == 1  # the caller heard the answer stop
    [cancelled] = [e for e in events if isinstance(e, Cancelled)]
    assert cancelled.reason == "barge_in"
    # The provider keeps what the caller heard: the marks echoed before the clear.
    assert isinstance(cancelled.heard_ms, int)
    assert 900 <= cancelled.heard_ms <= call.played_ms
    [ended] = [e for e in events if isinstance(e, PhoneCall) and e.status == "ended"]
    assert not isinstance(ended.metrics, msgspec.UnsetType) and ended.metrics.barge_ins == 1


async def test_speech_over_a_finished_answer_clears_it_at_once_and_cuts_it_where_heard(
    tmp_path: Path,
) -> None:
    """The model writes its 2.4 s answer at once (real models speak several times faster
    than real time): the turn is over while the caller has heard 0.3 s of it. The caller
    speaks; what decides is what the caller still hears (marks outstanding)."""
    sim_config = SimConfig(flavor="openai", api_key="sim-key", audio_ms_per_char=60)
    greeting = "/raw " + "z" * 40  # 40 characters: 2.4 s of speech
    async with (
        serve_sim(sim_config) as sim,
        phone_gateway(
            tmp_path,
            provider="openai",
            openai_base_url=sim.url,
            openai_api_key="sim-key",
            model="sim",
            phone_numbers_file=numbers_file(tmp_path, f'[defaults]\ngreeting = "{greeting}"\n'),
        ) as gw,
    ):
        call = gw.call()
        await call.dial()
        sid = await until_call(gw)
        runtime = gw.gateway.node.runtimes[sid]
        await call.wait_for(lambda: len(call.audio_received) >= 2300 * 8)  # all of it, at once
        await until(lambda: runtime.machine.idle)  # the answer's turn is over
        await call.wait_for(lambda: call.played_ms >= 300)
        assert call.played_ms < 1000  # generated far faster than it plays
        await call.say(espeak("Wait, stop."))
        await call.wait_for(lambda: call.clears == 1)
        played_at_clear = call.played_ms
        await call.hang_up()
        await until(lambda: not gw.gateway.phone.control.calls)
        events = await export(gw, sid)
        history = [decode_history_item(h) for h in await gw.gateway.node.store.read_history(sid)]
    [to_silence] = call.barge_in_to_silence
    print(f"speech start → clear (the caller hears silence): {to_silence * 1000:.0f} ms")
    assert to_silence < 1.5  # 300 ms with a loaded machine's margin (measured: 110-170 ms)
    assert played_at_clear < 2000  # the caller did not hear the rest
    # Where the caller stopped: the marks echoed before the clear.
    barged = [e for e in events if isinstance(e, SpeechStarted) and e.heard_ms]
    [speech] = barged
    assert isinstance(speech.heard_ms, int) and 100 <= speech.heard_ms <= played_at_clear
    # History keeps the answer cut there, and so does the provider's copy.
    assert isinstance(history[-1], Cancelled) and history[-1].heard_ms == speech.heard_ms
    assert sim.stats.truncations == [speech.heard_ms]
    [ended] = [e for e in events if isinstance(e, PhoneCall) and e.status == "ended"]
    assert not isinstance(ended.metrics, msgspec.UnsetType) and ended.metrics.barge_ins == 1


async def test_a_key_press_reaches_the_sessions_clients_and_can_reach_the_model(
    tmp_path: Path,
) -> None:
    async with phone_gateway(
        tmp_path,
        phone_numbers_file=numbers_file(tmp_path, '[profiles.menu]\ndtmf = "message"\n'),
    ) as gw:
        plain = gw.call()
        await plain.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        app = await AppClient.connect(gw.client_url, call_sid(gw))
        await plain.press("5")
        pressed = await app.until("dtmf")
        await app.close()
        await plain.hang_up()
        assert isinstance(pressed, Dtmf) and pressed.digit == "5"

        menu = gw.call(parameters={"profile": "menu"})
        await menu.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        app = await AppClient.connect(gw.client_url, call_sid(gw))
        await menu.press("7")
        await app.until("end")
        await app.close()
        await menu.hang_up()
    said = "".join(e.content for e in app.events if isinstance(e, Respond))
    assert "(The caller pressed 7 on the phone's keypad.)" in said
    assert [e.digit for e in app.events if isinstance(e, Dtmf)] == ["7"]


async def test_a_stream_nobody_signed_is_refused_before_a_session_exists(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        with pytest.raises(InvalidStatus) as unsigned:
            await gw.call(signed=False).dial()
        bad = gw.call(webhook=False)
        bad.setup.auth_token = "not-the-token"
        with pytest.raises(InvalidStatus) as wrong:
            await bad.dial()
        assert not gw.gateway.node.runtimes
    assert unsigned.value.response.status_code == 401
    assert b"X-Twilio-Signature" in unsigned.value.response.body
    assert wrong.value.response.status_code == 403


async def test_without_the_auth_token_a_one_time_stream_token_opens_a_stream(
    tmp_path: Path,
) -> None:
    async with phone_gateway(tmp_path, phone_twilio_auth_token="") as gw:
        no_token = gw.call(signed=False)
        await no_token.dial()
        code, reason = await no_token.wait_closed()
        assert code == 1008 and "one-time token" in reason
        assert not gw.gateway.node.runtimes

        minted = await asyncio.to_thread(http, "POST", f"{gw.api_url}/v1/phone/tokens", {})
        token = minted["stream_token"]
        call = gw.call(signed=False, parameters={"token": token})
        await call.dial()
        await call.say(espeak("Hello there."))
        await call.answered()
        await call.hang_up()

        again = gw.call(signed=False, parameters={"token": token})
        await again.dial()
        code, reason = await again.wait_closed()
    assert code == 1008 and "used already" in reason


async def test_the_twiml_helper_wires_a_number_with_one_url(tmp_path: Path) -> None:
    from urllib.parse import urlencode

    from protocol.media_stream import twilio_signature

    async with phone_gateway(tmp_path) as gw:
        # The gateway's one port: the webhook, and the stream the TwiML points at.
        webhook = f"{gw.gateway.http_url}/v1/phone/twilio/voice"
        form = {
            "CallSid": "CA42",
            "AccountSid": "AC1",
            "From": "+15550001111",
            "To": "+15550002222",
        }
        signature = twilio_signature(AUTH_TOKEN, webhook, form.items())

        def post(signature: str) -> tuple[int, str]:
            request = urllib.request.Request(
                webhook,
                data=urlencode(form).encode(),
                headers={"X-Twilio-Signature": signature},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        status, twiml = await asyncio.to_thread(post, signature)
        refused, _ = await asyncio.to_thread(post, "bad")
        assert status == 200 and refused == 403
        assert '<Connect><Stream url="wss://' in twiml and "/v1/phone/twilio" in twiml
        import xml.etree.ElementTree as ElementTree

        stream = ElementTree.fromstring(twiml).find("./Connect/Stream")
        assert stream is not None
        assert str(stream.get("url")).startswith(f"wss://127.0.0.1:{gw.gateway.port}/v1/phone/")
        parameters = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
        assert parameters["from"] == "+15550001111" and parameters["to"] == "+15550002222"
        # Twilio dials the stream with those parameters; the token is for this call only.
        call = gw.call(webhook=False, parameters=dict(parameters), call_sid="CA42")  # type: ignore[arg-type]
        await call.dial()
        await call.say(espeak("Hi."))
        await call.answered()
        await call.hang_up()
        other = gw.call(webhook=False, parameters=dict(parameters), call_sid="CA43")  # type: ignore[arg-type]
        await other.dial()
        code, reason = await other.wait_closed()
    assert code == 1008 and "another call" in reason


async def test_a_call_resumes_the_apps_session(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        made = await asyncio.to_thread(
            http, "POST", f"{gw.api_url}/v1/sessions", {"instructions": "Be brief."}
        )
        sid = made["session_id"]
        minted = await asyncio.to_thread(
            http, "POST", f"{gw.api_url}/v1/phone/tokens", {"session_id": sid}
        )
        call = gw.call(parameters={"token": minted["stream_token"]})
        await call.dial()
        await until(lambda: sid in gw.gateway.phone.control.calls)
        await call.hang_up()
        info = await asyncio.to_thread(http, "GET", f"{gw.api_url}/v1/sessions/{sid}")
        events = await export(gw, sid)
    assert info["config"]["instructions"] == "Be brief."  # the app's configuration stays
    assert info["config"]["input_audio"]["rate"] == 8000
    assert [e.status for e in events if isinstance(e, PhoneCall)] == ["started", "ended"]


async def test_a_signed_stream_may_name_a_session_of_its_owner(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        made = await asyncio.to_thread(http, "POST", f"{gw.api_url}/v1/sessions", {})
        sid = made["session_id"]
        call = gw.call(parameters={"session_id": sid})
        await call.dial()
        await call.press("3")
        await call.say(espeak("Hello."))
        await call.answered()
        await call.hang_up()
        events = await export(gw, sid)
    assert [e.digit for e in events if isinstance(e, Dtmf)] == ["3"]
    assert any(isinstance(e, User) and e.source == "audio" for e in events)


async def test_a_media_format_other_than_mulaw_is_refused(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        call = gw.call(encoding="audio/x-alaw")
        await call.dial()
        code, reason = await call.wait_closed()
        assert not gw.gateway.node.runtimes
    assert code == 1003 and "PCMU" in reason


async def test_the_model_transfers_a_call_through_the_carriers_api(tmp_path: Path) -> None:
    async with (
        TwilioStandIn() as twilio,
        phone_gateway(
            tmp_path,
            phone_tools=True,
            phone_transfer_to="+1555*",
            phone_twilio_api_url=twilio.url,
            phone_numbers_file=numbers_file(
                tmp_path,
                """[defaults]\ngreeting = '/tool transfer_call {"to": "+15557654321"}'\n""",
            ),
        ) as gw,
    ):
        call = gw.call(account_sid="AC9")
        await call.dial()
        code, _ = await call.wait_closed(20.0)
    [(path, form, authorization)] = twilio.requests
    assert path == f"/2010-04-01/Accounts/AC9/Calls/{call.setup.call_sid}.json"
    assert form == {"Twiml": "<Response><Dial>+15557654321</Dial></Response>"}
    assert authorization.startswith("Basic ")
    assert code == 1000


async def test_end_call_hangs_up_and_a_transfer_the_operator_did_not_allow_fails(
    tmp_path: Path,
) -> None:
    async with (
        TwilioStandIn() as twilio,
        phone_gateway(
            tmp_path,
            phone_tools=True,
            phone_transfer_to="+1555*",
            phone_twilio_api_url=twilio.url,
            phone_numbers_file=numbers_file(
                tmp_path,
                """[profiles.hangup]\ngreeting = '/tool end_call {}'\n"""
                """[profiles.abroad]\ngreeting = '/tool transfer_call {"to": "+4930123456"}'\n""",
            ),
        ) as gw,
    ):
        abroad = gw.call(parameters={"profile": "abroad"})
        await abroad.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        app = await AppClient.connect(gw.client_url, call_sid(gw))
        await app.until("end")
        await app.close()
        await abroad.hang_up()
        assert not twilio.requests

        hangup = gw.call(parameters={"profile": "hangup"})
        await hangup.dial()
        await hangup.wait_closed(20.0)
    said = "".join(e.content for e in app.events if isinstance(e, Respond))
    assert "not allowed" in said
    [(_, form, _)] = twilio.requests
    assert form == {"Status": "completed"}


async def test_send_dtmf_plays_the_keys_to_the_far_end(tmp_path: Path) -> None:
    async with phone_gateway(
        tmp_path,
        phone_tools=True,
        phone_numbers_file=numbers_file(
            tmp_path, """[defaults]\ngreeting = '/tool send_dtmf {"digits": "12"}'\n"""
        ),
    ) as gw:
        call = gw.call()
        await call.dial()
        await call.wait_for(lambda: call.played_ms >= 400)
        await call.hang_up()
    keys = mulaw_decode(bytes(call.audio_received[:1600]))  # 0.2 s: the "1" and its gap
    assert rms(keys[:1600]) > 1000 and rms(keys[1600:]) == 0


async def test_a_draining_node_keeps_its_call_until_the_caller_hangs_up(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        call = gw.call()
        await call.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        drain = asyncio.create_task(gw.gateway.drain())
        await until(lambda: gw.gateway.node.draining)
        await call.say(espeak("Are you still there?"))
        await call.answered()  # the call goes on while the node drains
        assert not drain.done()
        await call.hang_up()
        await asyncio.wait_for(drain, 20.0)
        assert call.closed == (1000, "call ended")


async def test_drain_phone_timeout_ends_a_call_that_goes_on(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path, drain_phone_timeout=0.5) as gw:
        call = gw.call()
        await call.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        sid = call_sid(gw)
        await gw.gateway.drain()
        code, reason = await call.wait_closed()
        entries = await gw.gateway.node.store.read_log(sid, 0, 100)
    assert (code, reason) == (1001, "the gateway node is shutting down")
    ended = [decode_event(e.data) for e in entries if b'"phone_call"' in e.data][-1]
    assert isinstance(ended, PhoneCall) and ended.reason == "drain"
