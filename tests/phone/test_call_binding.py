"""A stream is bound to its call: replayed signatures, webhooks and parameters open nothing.

Twilio signs a stream's URL only, so a captured ``X-Twilio-Signature`` opens
the same URL again. With the default settings a stream needs the one-time
token the TwiML helper minted for its ``CallSid``; ownership comes only from
signed data; a second stream never joins a live call.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from gateway.client.carrier import stream_parameters
from protocol.media_stream import twilio_signature
from tests.phone.test_calls import call_sid, http, numbers_file, until
from tests.support.carrier import AUTH_TOKEN, PhoneGateway, espeak, phone_gateway


def post_webhook(gw: PhoneGateway, form: dict[str, str]) -> tuple[int, str]:
    """The voice webhook asked as Twilio asks it (signed)."""
    url = f"{gw.api_url}/v1/phone/twilio/voice"
    request = urllib.request.Request(
        url,
        data=urlencode(form).encode(),
        headers={"X-Twilio-Signature": twilio_signature(AUTH_TOKEN, url, form.items())},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_a_replayed_signature_alone_opens_no_call(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        replay = gw.call(webhook=False)  # a captured signature: the URL's, valid
        await replay.dial()
        code, reason = await replay.wait_closed()
        assert not gw.gateway.node.runtimes
    assert code == 1008 and "one-time token" in reason


async def test_a_replayed_signature_cannot_join_a_live_call(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        victim = gw.call()
        await victim.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        sid = call_sid(gw)
        # The victim's session named, with a signature alone or with a token of its own.
        bare = gw.call(webhook=False, parameters={"session_id": sid})
        await bare.dial()
        bare_closed = await bare.wait_closed()
        joiner = gw.call(parameters={"session_id": sid})  # a token the webhook minted
        await joiner.dial()
        joiner_closed = await joiner.wait_closed()
        # The victim's call goes on, and only the victim hears its answer.
        await victim.say(espeak("Hello there."))
        await victim.answered()
        await victim.hang_up()
    assert bare_closed[0] == 1008 and "one-time token" in bare_closed[1]
    assert joiner_closed == (
        1008,
        "the session already has a live call: a second stream cannot join it",
    )
    assert joiner.media_received == bare.media_received == 0
    assert victim.media_received > 0


async def test_a_second_stream_for_a_live_call_sid_is_refused(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        first = gw.call()
        await first.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        minted = await asyncio.to_thread(http, "POST", f"{gw.api_url}/v1/phone/tokens", {})
        second = gw.call(
            webhook=False,
            call_sid=first.setup.call_sid,
            parameters={"token": minted["stream_token"]},
        )
        await second.dial()
        code, reason = await second.wait_closed()
        assert len(gw.gateway.phone.control.calls) == 1
        await first.hang_up()
    assert code == 1008 and "already has a live stream" in reason


async def test_a_webhook_replayed_or_without_call_sid_mints_no_token(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        form = {"CallSid": "CA77", "AccountSid": "AC1", "From": "+15550001111", "To": "+1555"}
        first = await asyncio.to_thread(post_webhook, gw, form)
        replays = [await asyncio.to_thread(post_webhook, gw, form) for _ in range(3)]
        no_sid = await asyncio.to_thread(post_webhook, gw, {"AccountSid": "AC1", "To": "+1555"})
        # The one token opens this call only.
        token = stream_parameters(first[1])["token"]
        other = gw.call(webhook=False, call_sid="CA78", parameters={"token": token})
        await other.dial()
        code, reason = await other.wait_closed()
    assert first[0] == 200
    assert [status for status, _ in replays] == [409, 409, 409]
    assert "answered already" in replays[0][1]
    assert no_sid[0] == 400 and "CallSid" in no_sid[1]
    assert code == 1008 and "another call" in reason


async def test_ownership_comes_from_the_signed_webhook_not_the_streams_parameters(
    tmp_path: Path,
) -> None:
    """The number called is the one Twilio signed to the webhook: a ``to`` parameter on
    the stream moves the call to no other tenant's number."""
    numbers = numbers_file(
        tmp_path,
        '[numbers."+15550000001"]\nkey = "alice"\n[numbers."+15550000002"]\nkey = "bob"\n'
        '[profiles.other]\ninstructions = "Another tenant\'s instructions."\n',
    )
    async with phone_gateway(tmp_path, phone_numbers_file=numbers) as gw:
        status, twiml = await asyncio.to_thread(
            post_webhook, gw, {"CallSid": "CA90", "AccountSid": "AC1", "To": "+15550000001"}
        )
        parameters = stream_parameters(twiml) | {"to": "+15550000002", "profile": "other"}
        call = gw.call(webhook=False, call_sid="CA90", parameters=parameters)
        await call.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        sid = call_sid(gw)
        owner = (await gw.gateway.node.store.get_meta(sid) or {}).get("owner")
        called = gw.gateway.phone.control.calls[sid].identity.called
        instructions = gw.gateway.node.runtimes[sid].setup.config.instructions
        await call.hang_up()
    assert status == 200
    assert (owner, called, instructions) == ("alice", "+15550000001", "")


async def test_without_require_token_a_signed_stream_belongs_to_the_phone_key(
    tmp_path: Path,
) -> None:
    """``--phone-no-require-token``: a signed stream opens without a token, but only for
    ``--phone-key`` and never on a named session."""
    numbers = numbers_file(tmp_path, '[numbers."+15550000002"]\nkey = "bob"\n')
    async with phone_gateway(
        tmp_path, phone_require_token=False, phone_key="switchboard", phone_numbers_file=numbers
    ) as gw:
        call = gw.call(webhook=False, parameters={"to": "+15550000002"})
        await call.dial()
        await until(lambda: bool(gw.gateway.phone.control.calls))
        sid = call_sid(gw)
        owner = (await gw.gateway.node.store.get_meta(sid) or {}).get("owner")
        named = gw.call(webhook=False, parameters={"session_id": sid})
        await named.dial()
        code, reason = await named.wait_closed()
        await call.hang_up()
    assert owner == "switchboard"
    assert code == 1008 and "cannot name a session" in reason
