"""The call tools' side: hang up, transfer, press keys (``tools.builtin.phone.CallControl``).

A tool runs on the node that drives its session, which is the node the
call's stream is on (voice is driven where its microphone is), so the call
is found here by session id. Hang-ups and transfers wait until the caller
has heard what the model said before them (the carrier's marks), at most
``PLAYED_OUT_WAIT`` seconds.

A carrier's REST API does what a stream cannot: Twilio's Calls resource
(``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``, form
encoded, HTTP Basic auth with the account SID and auth token) takes
``Status=completed`` to hang up and ``Twiml=<Response><Dial>…</Dial></Response>``
to transfer. Without credentials a hang-up closes the stream (the carrier
goes on with the TwiML after ``<Connect>``, which ends the call when there
is none) and a transfer fails saying what to configure. Transfers go only
to numbers ``--phone-transfer-to`` allows: a model cannot dial the world.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Final
from xml.sax.saxutils import escape

import aiohttp

from gateway.phone.call import PhoneCallConnection
from gateway.phone_settings import PhoneSettings
from tools.base import ToolFailure

__all__ = ["PhoneControl", "TwilioCalls", "transfer_allowed"]

log = logging.getLogger("gateway.phone")

REST_TIMEOUT: Final = 10.0


def transfer_allowed(rules: str, number: str) -> bool:
    """Whether ``rules`` (comma-separated numbers; ``+1555*`` is a prefix) allow ``number``."""
    for rule in (r.strip() for r in rules.split(",")):
        if not rule:
            continue
        if rule.endswith("*") and number.startswith(rule[:-1]):
            return True
        if rule == number:
            return True
    return False


class TwilioCalls:
    """Twilio's Calls resource: update a live call (hang up, new TwiML)."""

    def __init__(self, settings: PhoneSettings) -> None:
        self.settings = settings
        self._http: aiohttp.ClientSession | None = None

    @property
    def configured(self) -> bool:
        return bool(self.settings.twilio_auth_token)

    async def update(self, account: str, call: str, fields: dict[str, str]) -> str | None:
        """POST ``fields`` to the call; None when Twilio took it, else what went wrong."""
        settings = self.settings
        account = settings.twilio_account_sid or account
        if not account or not call:
            return "the call's account or call id is unknown (the stream's start had none)"
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REST_TIMEOUT))
        url = (
            f"{settings.twilio_api_url.rstrip('/')}/2010-04-01/Accounts/{account}/Calls/{call}.json"
        )
        credentials = f"{account}:{settings.twilio_auth_token}".encode()
        headers = {"Authorization": "Basic " + base64.b64encode(credentials).decode("ascii")}
        try:
            async with self._http.post(url, data=fields, headers=headers) as response:
                if response.status < 300:
                    return None
                body = (await response.text())[:300]
                return f"Twilio answered {response.status}: {body}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"Twilio's API could not be reached: {type(exc).__name__}: {exc}"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


class PhoneControl:
    """The phone calls of this node by session id, and what the call tools do to them."""

    def __init__(self, settings: PhoneSettings) -> None:
        self.settings = settings
        self.calls: dict[str, PhoneCallConnection] = {}
        self.twilio = TwilioCalls(settings)

    def _call(self, session_id: str, tool: str) -> PhoneCallConnection:
        call = self.calls.get(session_id)
        if call is None:
            raise ToolFailure(
                f"{tool} acts on a phone call, and this session has none now (it is not a "
                "phone call, or the call already ended)"
            )
        return call

    def _rest(self, call: PhoneCallConnection) -> bool:
        return call.carrier.control == "twilio" and self.twilio.configured

    async def end_call(self, session_id: str) -> str:
        call = self._call(session_id, "end_call")
        await call.played_out()
        if self._rest(call):
            problem = await self.twilio.update(call.account, call.call_id, {"Status": "completed"})
            if problem is not None:
                log.warning("end_call: %s; closing the stream instead", problem)
        call.stop("end_call")
        return "The call has ended."

    async def transfer_call(self, session_id: str, to: str) -> str:
        call = self._call(session_id, "transfer_call")
        if not transfer_allowed(self.settings.transfer_to, to):
            allowed = self.settings.transfer_to or "none (the operator allows none)"
            raise ToolFailure(
                f"transfers to {to} are not allowed; the numbers allowed are: {allowed}"
            )
        if not self._rest(call):
            raise ToolFailure(
                "this call cannot be transferred: the gateway has no REST API access to its "
                f"carrier ({call.carrier.name}); the operator sets TWILIO_ACCOUNT_SID and "
                "TWILIO_AUTH_TOKEN for Twilio calls"
            )
        await call.played_out()
        twiml = f"<Response><Dial>{escape(to)}</Dial></Response>"
        problem = await self.twilio.update(call.account, call.call_id, {"Twiml": twiml})
        if problem is not None:
            raise ToolFailure(f"the transfer failed: {problem}")
        call.stop("transfer")
        return f"The call is being transferred to {to}."

    async def send_dtmf(self, session_id: str, digits: str) -> str:
        call = self._call(session_id, "send_dtmf")
        try:
            call.play_keys(digits)
        except ValueError as exc:
            raise ToolFailure(str(exc)) from None
        await asyncio.sleep(0)
        return f"Pressed {digits} on the call."

    async def close(self) -> None:
        await self.twilio.close()
