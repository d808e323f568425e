"""Who may open a media stream: the carrier's signature, or a one-time stream token.

At the handshake, before the WebSocket opens: a carrier whose signing
secret the gateway has (``--phone-twilio-auth-token``,
``--phone-fonoster-secret``) must sign the upgrade request, or it is
refused with 403 (401 when the header is missing). A carrier the gateway
cannot check (no secret configured, or a carrier that does not sign) is
let through the handshake unsigned, and its ``start`` must then carry a
one-time stream token (``gateway.phone.call``); until it does, the
connection counts as unauthenticated (``Edges.pending``) and no session
exists.

The signed URL is the stream's URL as the carrier dialled it: the
``--phone-public-url`` base (the TLS terminator's address) and the path, or,
with none set, the request's ``Host`` under each scheme a carrier may have
signed (``signed_urls``). Twilio signs a stream's URL with no parameters;
like Twilio's own validators, the URL is tried with and without its port.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from websockets.http11 import Request

from gateway.phone.carriers import Carrier
from gateway.phone.stream_tokens import StreamToken, mint_stream_token, verify_stream_token
from gateway.phone_settings import PhoneSettings
from gateway.store.base import StoreError
from protocol.media_stream import fonoster_signature, twilio_signature_valid

__all__ = [
    "ANSWERED_FOR",
    "FONOSTER_SKEW",
    "Signed",
    "StreamTokens",
    "check_signature",
    "signed_urls",
]

FONOSTER_SKEW: Final = 300.0
"""Seconds a Fonoster signature's timestamp may be off (a replay after that is refused)."""
ANSWERED_FOR: Final = 86400.0
"""Seconds the voice webhook remembers a ``CallSid`` it answered (a Twilio signature has
no timestamp: a replay within this mints nothing; a call lasts far less)."""


@dataclass(frozen=True)
class Signed:
    """The handshake's verdict: ``signed`` (the carrier's signature checked and good)
    or an HTTP refusal (``status``, ``message``)."""

    signed: bool
    status: int = 0
    message: str = ""
    reason: str = ""


def signed_urls(settings: PhoneSettings, path: str, host: str, scheme: str = "ws") -> list[str]:
    """The URLs a carrier may have signed for a request of ``path`` (query included)
    with ``Host: host``; ``scheme`` ``ws`` (a stream's upgrade) or ``http`` (a webhook).

    A webhook's URL is signed as requested, query included. For a stream the
    URL as written in the TwiML is tried in its ``wss://`` and ``https://`` forms
    (the signed form is not documented first-hand: docs/phone.md), and without
    a query string, which Twilio strips from stream URLs.
    """
    paths = [path]
    if scheme == "ws" and "?" in path:
        paths.append(path.split("?", 1)[0])
    if settings.public_url:
        base = settings.public_url.rstrip("/")
        secure = base.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
        bases = [secure] if scheme == "http" else [base, secure]
    else:
        schemes = ("wss", "ws", "https", "http") if scheme == "ws" else ("https", "http")
        bases = [f"{s}://{host}" for s in schemes]
    return [base + p for base in bases for p in paths]


def check_signature(
    carrier: Carrier, settings: PhoneSettings, request: Request, now: float
) -> Signed:
    """Whether ``request`` (a stream's upgrade) is signed by ``carrier`` (see the module)."""
    headers = request.headers
    urls = signed_urls(settings, request.path, headers.get("Host", ""))
    if carrier.signature == "twilio" and settings.twilio_auth_token:
        signature = headers.get("X-Twilio-Signature", "")
        if not signature:
            return Signed(
                False,
                401,
                "this stream has no X-Twilio-Signature: only Twilio may open it (the gateway "
                "checks the signature with TWILIO_AUTH_TOKEN)",
                "unsigned",
            )
        token = settings.twilio_auth_token
        if any(twilio_signature_valid(token, url, (), signature) for url in urls):
            return Signed(True)
        return Signed(
            False,
            403,
            "X-Twilio-Signature does not sign this stream's URL: check TWILIO_AUTH_TOKEN and "
            "that --phone-public-url is the wss:// address in the TwiML",
            "bad_signature",
        )
    if carrier.signature == "fonoster" and settings.fonoster_secret:
        stamp = headers.get("x-fonoster-timestamp", "")
        signature = headers.get("x-fonoster-signature", "")
        if not stamp or not signature:
            return Signed(
                False, 401, "this stream is not signed (x-fonoster-signature)", "unsigned"
            )
        try:
            fresh = abs(now - float(stamp)) <= FONOSTER_SKEW
        except ValueError:
            fresh = False
        if not fresh:
            return Signed(
                False,
                403,
                f"x-fonoster-timestamp is more than {FONOSTER_SKEW:g}s off: check the clocks",
                "stale_signature",
            )
        secret = settings.fonoster_secret
        for url in urls:
            expected = fonoster_signature(secret, stamp, url)
            if hmac.compare_digest(expected.encode(), signature.lower().encode()):
                return Signed(True)
        return Signed(
            False,
            403,
            "x-fonoster-signature does not sign this stream's URL: check the signing secret "
            "and --phone-public-url",
            "bad_signature",
        )
    return Signed(False)  # not checkable here: a stream token must open it


class TokenStore(Protocol):
    async def incr_window(self, key: str, amount: int, ttl: float) -> int: ...


class StreamTokens:
    """Mints and redeems one-time stream tokens (``gateway.phone.stream_tokens``).

    ``secrets`` gives the secrets client tokens use (``ClientTokens.secrets``):
    every node has the same, so a token minted on one opens a stream on any.
    """

    def __init__(
        self,
        secrets: Callable[[], object],
        store: TokenStore,
        ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secrets = secrets
        self._store = store
        self.ttl = ttl
        self._clock = clock

    async def _keys(self) -> tuple[bytes, ...]:
        keys = await self._secrets()  # type: ignore[misc]
        assert isinstance(keys, tuple)
        return keys

    async def mint(
        self,
        owner: str,
        *,
        sid: str = "",
        call: str = "",
        to: str = "",
        profile: str = "",
        ttl: float | None = None,
    ) -> tuple[str, float]:
        """A token for ``owner``'s call (resuming ``sid``, for ``call``, the number ``to``
        and the ``profile`` if given) and its expiry (unix seconds). Raises
        ``StoreUnavailable`` if the secret is out of reach."""
        expires_at = round(self._clock() + (self.ttl if ttl is None else ttl), 3)
        keys = await self._keys()
        token = mint_stream_token(
            keys[0], owner, expires_at, sid=sid, call=call, to=to, profile=profile
        )
        return token, expires_at

    async def first_answer(self, call: str) -> bool:
        """Whether this is the first time the voice webhook answers ``call`` (a CallSid):
        a replayed webhook mints no second token for the same call. Raises ``StoreError``."""
        uses = await self._store.incr_window(f"phone-call:{call}", 1, ANSWERED_FOR)
        return uses == 1

    async def redeem(self, token: str, call: str) -> StreamToken | str:
        """The claims of a valid, unused token for ``call``; else why not.
        Taking it spends it."""
        try:
            keys = await self._keys()
        except StoreError:
            return "stream tokens cannot be checked now (the session store is unavailable)"
        claims = verify_stream_token(keys, token, self._clock())
        if isinstance(claims, str):
            return claims
        if claims.call and claims.call != call:
            return "the stream token was minted for another call"
        left = max(1.0, claims.exp - self._clock() + 1.0)
        try:
            uses = await self._store.incr_window(f"phone-token:{claims.n}", 1, left)
        except StoreError:
            return "stream tokens cannot be checked now (the session store is unavailable)"
        if uses != 1:
            return "the stream token was used already: a token opens one stream"
        return claims
