"""One-time stream tokens: what lets a media stream in when no signature can.

An app that writes its own TwiML asks the HTTP API for a token
(``POST /v1/phone/tokens``) and puts it in the stream's parameters
(``<Parameter name="token" value="…"/>``); the TwiML helper puts one in by
itself. A token is

    rtgw_st.<payload>.<signature>

as client tokens are (``gateway.edge.tokens``; its own prefix, so neither
passes for the other): the payload names the key that owns the call's
session, optionally the session to resume and the call it is for, its
expiry and a random nonce; the signature is an HMAC-SHA256 under the secret
client tokens use, which every node shares. The gateway takes a token once:
its nonce is counted in the store (``Store.incr_window``) and a second use
is refused, so a token seen in a log or a replayed handshake opens nothing.

Pure: no I/O, no clock that is not passed in (the one-time claim is the
edge's, ``gateway.phone.admission``).
"""

from __future__ import annotations

import secrets
from typing import Final

import msgspec

from gateway.signing import seal, unseal

__all__ = ["STREAM_TOKEN_PREFIX", "StreamToken", "mint_stream_token", "verify_stream_token"]

STREAM_TOKEN_PREFIX: Final = "rtgw_st."


class StreamToken(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a stream token says: whose call (``key``), until when (``exp``, unix s),
    which session it resumes (``sid``, "" for a new one), which call it is for
    (``call``: the carrier's call id, "" for any), the number called and the
    profile as the carrier signed them to the voice webhook (``to``, ``profile``:
    the numbers file's plan; no ``to`` lets the stream's parameters say) and its
    nonce ``n``."""

    key: str
    exp: float
    n: str
    sid: str = ""
    call: str = ""
    to: str = ""
    profile: str = ""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(StreamToken).decode


def mint_stream_token(
    secret: bytes,
    key: str,
    expires_at: float,
    *,
    sid: str = "",
    call: str = "",
    to: str = "",
    profile: str = "",
) -> str:
    """A token that opens one media stream for ``key``'s session until ``expires_at``."""
    claims = StreamToken(
        key=key,
        exp=expires_at,
        n=secrets.token_urlsafe(12),
        sid=sid,
        call=call,
        to=to,
        profile=profile,
    )
    return seal(secret, STREAM_TOKEN_PREFIX, _encode(claims), bind_prefix=True)


_BAD: Final = (
    "the stream token is not valid (truncated, altered, or from another gateway): put the "
    "token exactly as POST /v1/phone/tokens (or the TwiML helper) gave it"
)
_EXPIRED: Final = (
    "the stream token has expired: mint a token per call, just before answering it "
    "(POST /v1/phone/tokens), or let the TwiML helper do it"
)


def verify_stream_token(secrets_: tuple[bytes, ...], token: str, now: float) -> StreamToken | str:
    """The token's claims if one of ``secrets_`` signed it and it has not expired;
    else why not (whether it was used already is the store's to say)."""
    sealed = unseal(secrets_, STREAM_TOKEN_PREFIX, token, bind_prefix=True, max_len=2048)
    if sealed is None:
        return _BAD
    try:
        claims = _decode(sealed)
    except (ValueError, msgspec.DecodeError):
        return _BAD
    if now >= claims.exp:
        return _EXPIRED
    return claims
