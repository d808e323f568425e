"""The TwiML helper: a Twilio number's voice webhook answered with its media stream.

``POST /v1/phone/twilio/voice`` on the HTTP API's port (websockets serves
GET handshakes only). Set it as the number's "A call comes in" webhook and
the number is wired: the request's ``X-Twilio-Signature`` is checked (the
URL as Twilio requested it, query included, with its POST parameters), and
the answer is

    <Response><Connect><Stream url="wss://HOST/v1/phone/twilio">
      <Parameter name="token" value="rtgw_st.…"/>   the call's one-time stream token
      <Parameter name="from" value="+1…"/>          the caller's number
      <Parameter name="to" value="+1…"/>            the number called
    </Stream></Connect></Response>

``<Connect><Stream>`` is Twilio's bidirectional stream; its URL takes no
query string, so everything the stream needs rides as ``<Parameter>``
(docs/phone.md has the sources). ``?profile=NAME`` on the webhook's URL is
passed on as a ``profile`` parameter (``[profiles.NAME]`` of the numbers
file). The stream's URL is ``--phone-public-url``'s, or ``wss://`` and the
request's ``Host``.

The token is what the stream's own signature cannot be (it covers the URL
only): bound to the webhook's signed ``CallSid``, number called and profile,
which decide the call's owner and plan (``gateway.phone.opening``). A call is
answered once: a replayed webhook (the same ``CallSid``) gets 409 and no
token, and one without ``CallSid`` gets 400.
"""

from __future__ import annotations

import asyncio
from typing import Final
from xml.sax.saxutils import quoteattr

from aiohttp import web

from gateway.edge.pending import PendingConnections
from gateway.phone.admission import StreamTokens, signed_urls
from gateway.phone.plans import CallPlans
from gateway.phone_settings import PhoneSettings
from gateway.store.base import StoreError
from protocol.media_stream import twilio_signature_valid

__all__ = ["TWIML_PATH", "VoiceWebhook", "twiml_stream"]

TWIML_PATH: Final = "/v1/phone/twilio/voice"
STREAM_PATH: Final = "/v1/phone/twilio"
MAX_FIELD: Final = 256
MAX_BODY: Final = 64 << 10
"""Bytes of a webhook's form, as sent: Twilio's are ~1-2 KB. Read only once the body is
known to be uncompressed and announced within this (a chunked one stops at the HTTP
API's own ``MAX_BODY``)."""


def twiml_stream(url: str, parameters: dict[str, str]) -> str:
    """The TwiML that connects a call to the media stream at ``url`` with ``parameters``."""
    params = "".join(
        f"<Parameter name={quoteattr(name)} value={quoteattr(value)}/>"
        for name, value in parameters.items()
        if value
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Connect><Stream url={quoteattr(url)}>{params}</Stream></Connect></Response>"
    )


class VoiceWebhook:
    """Answers a Twilio number's voice webhook (see the module docstring)."""

    def __init__(
        self,
        settings: PhoneSettings,
        plans: CallPlans,
        tokens: StreamTokens,
        pending: PendingConnections,
        body_timeout: float,
    ) -> None:
        self.settings = settings
        self.plans = plans
        self.tokens = tokens
        self.pending = pending
        self.body_timeout = body_timeout

    async def voice(self, request: web.Request) -> web.Response:
        settings = self.settings
        if not settings.twilio_auth_token:
            return _text(
                503,
                "the voice webhook checks Twilio's signature: set TWILIO_AUTH_TOKEN on the "
                "gateway (docs/phone.md)",
            )
        if request.content_type != "application/x-www-form-urlencoded":
            return _text(415, "a voice webhook's body is form-encoded (Twilio sends it so)")
        if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
            return _text(415, "a voice webhook's body is not compressed (Twilio sends it so)")
        if (request.content_length or 0) > MAX_BODY:
            return _text(413, f"a voice webhook's body is at most {MAX_BODY} bytes")
        try:
            async with asyncio.timeout(self.body_timeout):
                form = await request.post()
        except TimeoutError:
            return _text(408, "the body did not arrive in time")
        except web.HTTPRequestEntityTooLarge as exc:  # its bytes, or aiohttp's field count
            return _text(
                413, f"a voice webhook's form is too large: {exc.text} (Twilio's has tens)"
            )
        except (UnicodeDecodeError, LookupError):  # aiohttp decodes the form by its charset
            return _text(
                400, "a voice webhook's form is UTF-8, as its charset says (Twilio sends it so)"
            )
        except ConnectionError:  # the caller went away mid-body: nobody to answer
            raise web.HTTPBadRequest() from None
        params = [(k, v) for k, v in form.items() if isinstance(v, str)]
        signature = request.headers.get("X-Twilio-Signature", "")
        host = request.headers.get("Host", "")
        urls = signed_urls(settings, request.path_qs, host, scheme="http")
        token = settings.twilio_auth_token
        if not signature or not any(
            twilio_signature_valid(token, url, params, signature) for url in urls
        ):
            return _text(
                403,
                "X-Twilio-Signature does not sign this request: only Twilio may call this "
                "webhook (check TWILIO_AUTH_TOKEN, and --phone-public-url behind a proxy)",
            )
        if request.transport is not None:
            self.pending.settled(request.transport)
        fields = {k: v[:MAX_FIELD] for k, v in params}
        caller, called, call = (
            fields.get("From", ""),
            fields.get("To", ""),
            fields.get("CallSid", ""),
        )
        if not call:
            return _text(
                400,
                "a voice webhook carries CallSid (Twilio always sends it): the stream token "
                "is bound to the call",
            )
        profile = request.query.get("profile", "")[:MAX_FIELD]
        plan = self.plans.plan(called, profile)
        try:
            stream_token, _ = await self.tokens.mint(
                plan.owner, call=call, to=called, profile=profile
            )
            if not await self.tokens.first_answer(call):  # last: a failure above spends nothing
                return _text(
                    409,
                    f"call {call[:64]!r} was answered already: a replayed webhook mints no "
                    "second stream token",
                )
        except StoreError:
            return _text(503, "the session store is unavailable; Twilio will retry")
        base = settings.public_url.rstrip("/") if settings.public_url else f"wss://{host}"
        twiml = twiml_stream(
            base + STREAM_PATH,
            {"token": stream_token, "from": caller, "to": called, "profile": profile},
        )
        return web.Response(text=twiml, content_type="text/xml")


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n")
