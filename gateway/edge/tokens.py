"""Client tokens: a short-lived credential that opens one session and nothing else.

An app's backend holds the API key and makes a session over the HTTP API; the
browser gets a *client token* for that session (the pattern of OpenAI's client
secrets and LiveKit's access tokens). A token is

    rtgw_ct.<payload>.<signature>

with ``payload`` the base64url of a small JSON object (the session id, the
owning key id, the digest of the API key that minted it, the expiry) and
``signature`` the base64url HMAC-SHA256 of the payload under a secret every
node shares. So any node checks the signature with no store round trip, and a
token can neither be forged nor stretched to another session, another key or
a later time.

What a token may do is decided where it is checked, not in it: it opens a
WebSocket to *its* session (``?token=`` or the ``rtgw.bearer.`` subprotocol)
until it expires; it never mints sessions, reads the HTTP API or opens another
session. Deleting a session revokes its tokens, because the session is gone;
revoking the API key that minted a token revokes the token, because the node
that checks it asks whether that key (``kd``, its SHA-256 digest, which is no
secret) is still issued (``gateway.edge.rights``).

Pure: no I/O, no clock that is not passed in.
"""

from __future__ import annotations

from typing import Final

import msgspec

from gateway.signing import new_secret, seal, unseal

__all__ = [
    "TOKEN_PREFIX",
    "ClientToken",
    "TokenRefused",
    "is_client_token",
    "mint_token",
    "new_secret",
    "verify_token",
]

TOKEN_PREFIX: Final = "rtgw_ct."
_VERSION: Final = 1


class ClientToken(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a token says: which session, whose, until when (unix seconds), minted by which key.

    ``kd`` is the SHA-256 digest of the API key that minted it: the token lives
    only as long as that key (a key id may hold several keys, and one of them
    can be revoked alone). "" for a token minted while auth was off, or by a
    gateway from before tokens named their key (checked by key id then).
    """

    sid: str
    key: str
    exp: float
    v: int = _VERSION
    kd: str = ""
    ap: bool = False
    """It may approve calls that wait for a user's decision (minted with ``approve``)."""
    cf: bool = False
    """It may change its session's configuration, within its key's policy (minted with
    ``configure``: an OpenAI door ephemeral key, which OpenAI's clients configure)."""


class TokenRefused(msgspec.Struct, frozen=True):
    """Why a token does not open anything; ``message`` says what the client should do."""

    message: str


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(ClientToken).decode


def is_client_token(credential: str) -> bool:
    """Whether a presented credential is a client token (else it is an API key)."""
    return credential.startswith(TOKEN_PREFIX)


def mint_token(
    secret: bytes,
    sid: str,
    key: str,
    expires_at: float,
    key_digest: str = "",
    *,
    approve: bool = False,
    configure: bool = False,
) -> str:
    """A token that opens ``sid`` (owned by ``key``) until ``expires_at``, while the
    API key of digest ``key_digest`` is issued ("": no key, auth is off);
    ``approve``: its connections may decide on calls that wait for approval;
    ``configure``: they may change the session's configuration."""
    claims = ClientToken(sid=sid, key=key, exp=expires_at, kd=key_digest, ap=approve, cf=configure)
    return seal(secret, TOKEN_PREFIX, _encode(claims), bind_prefix=False)


_MAX_LEN: Final = 4096
"""Longer than any token this gateway mints (a session id, a key id, two digests)."""
_EXPIRED: Final = (
    "this client token has expired; ask the app's backend for a new one "
    "(POST /v1/sessions, or its own endpoint that makes one)"
)
_BAD: Final = (
    "this client token is not valid (truncated, altered, or from another gateway); "
    "use the client_token exactly as the app's backend received it"
)


def verify_token(secrets_: tuple[bytes, ...], token: str, now: float) -> ClientToken | TokenRefused:
    """The token's claims if one of ``secrets_`` signed it and it has not expired.

    Several secrets let an operator rotate: new tokens are signed with the
    first, tokens signed with the others stay valid until they expire.
    """
    sealed = unseal(secrets_, TOKEN_PREFIX, token, bind_prefix=False, max_len=_MAX_LEN)
    if sealed is None:
        return TokenRefused(_BAD)
    try:
        claims = _decode(sealed)
    except (ValueError, msgspec.DecodeError):
        return TokenRefused(_BAD)
    if claims.v != _VERSION:
        return TokenRefused(_BAD)
    if now >= claims.exp:
        return TokenRefused(_EXPIRED)
    return claims
