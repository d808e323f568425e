"""A call tool that requires approval, on a phone call: the caller's keypad or the app decides.

The simulator's model calls ``transfer_call`` as the call starts (the
numbers file's greeting); the numbers file makes the tool wait for an
approval; the app's client of the session sees ``approval_required``; the
transfer reaches a local stand-in for Twilio's REST API only once allowed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from protocol.events import Approval, ApprovalRequired, Dtmf, Respond
from tests.support.carrier import AppClient, PhoneGateway, TwilioStandIn, phone_gateway

TRANSFER = '/tool transfer_call {"to": "+15557654321"}'
PLANS = f"""
[defaults]
greeting = '{TRANSFER}'
require_approval = ["transfer_call"]

[profiles.keypad]
keypad_approval = true
"""


async def app_of_the_call(gw: PhoneGateway) -> AppClient:
    """The app's client of the one call's session (its replay shows the call so far)."""
    control = gw.gateway.phone.control
    async with asyncio.timeout(20):
        while not control.calls:  # noqa: ASYNC110 - the node's calls have no event for tests
            await asyncio.sleep(0.02)
    [sid] = control.calls
    return await AppClient.connect(gw.client_url, sid)


def gateway_settings(tmp_path: Path, twilio: TwilioStandIn) -> dict[str, Any]:
    plans = tmp_path / "numbers.toml"
    plans.write_text(PLANS)
    return {
        "phone_tools": True,
        "phone_transfer_to": "+1555*",
        "phone_twilio_api_url": twilio.url,
        "phone_numbers_file": str(plans),
    }


async def test_the_caller_allows_a_transfer_with_1_and_denies_one_with_2(tmp_path: Path) -> None:
    async with (
        TwilioStandIn() as twilio,
        phone_gateway(tmp_path, **gateway_settings(tmp_path, twilio)) as gw,
    ):
        denied = gw.call(parameters={"profile": "keypad"})
        await denied.dial()
        app = await app_of_the_call(gw)
        await app.until("approval_required")
        await denied.press("2")
        decision = await app.until("approval")
        await app.until("end")
        await app.close()
        await denied.hang_up()
        assert isinstance(decision, Approval) and decision.decision == "deny"
        assert not twilio.requests
        said = "".join(e.content for e in app.events if isinstance(e, Respond))
        assert "the user denied this call" in said

        allowed = gw.call(parameters={"profile": "keypad"}, account_sid="AC9")
        await allowed.dial()
        app = await app_of_the_call(gw)
        await app.until("approval_required")
        await allowed.press("1")
        decision = await app.until("approval")
        code, _ = await allowed.wait_closed(20.0)
        await app.close()
    assert code == 1000  # transferred: the stream ends, Twilio dials the number
    [(path, form, _)] = twilio.requests
    assert path == f"/2010-04-01/Accounts/AC9/Calls/{allowed.setup.call_sid}.json"
    assert form == {"Twiml": "<Response><Dial>+15557654321</Dial></Response>"}
    assert isinstance(decision, Approval) and decision.decision == "allow"
    assert [e.digit for e in app.events if isinstance(e, Dtmf)] == ["1"]  # logged too


async def test_without_keypad_approval_a_key_decides_nothing_and_the_app_approves(
    tmp_path: Path,
) -> None:
    async with (
        TwilioStandIn() as twilio,
        phone_gateway(tmp_path, **gateway_settings(tmp_path, twilio)) as gw,
    ):
        call = gw.call(account_sid="AC9")
        await call.dial()
        app = await app_of_the_call(gw)
        asked = await app.until("approval_required")
        await call.press("1")
        await app.until("dtmf")  # logged as a key press, and nothing more
        assert not any(isinstance(e, Approval) for e in app.events)
        assert isinstance(asked, ApprovalRequired)
        await app.send(
            {"type": "approve", "id": asked.id, "digest": asked.digest, "decision": "allow"}
        )
        code, _ = await call.wait_closed(20.0)
        await app.close()
    assert code == 1000
    [(_, form, _)] = twilio.requests
    assert form == {"Twiml": "<Response><Dial>+15557654321</Dial></Response>"}
