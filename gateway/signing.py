"""Signed tokens: a prefix, URL-safe base64 claims, a dot, and their HMAC-SHA256.

One construction for the gateway's two kinds of token (client tokens,
``gateway.edge.tokens``; phone stream tokens, ``gateway.phone.stream_tokens``),
so a fix to how tokens are checked is made once. A stream token's signature
covers its prefix too (``bind_prefix``): one kind can never pass for the
other. Client tokens sign the claims alone, as they always have, so tokens
minted before stay valid.

Several secrets let an operator rotate: tokens are signed with the first,
and a token signed with any of them opens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = ["new_secret", "seal", "unseal"]


def new_secret() -> bytes:
    """A fresh signing secret (32 random bytes)."""
    return secrets.token_bytes(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _signature(secret: bytes, prefix: str, payload: str, bind_prefix: bool) -> str:
    signed = (prefix + payload if bind_prefix else payload).encode("ascii")
    return _b64(hmac.new(secret, signed, hashlib.sha256).digest())


def seal(secret: bytes, prefix: str, claims: bytes, *, bind_prefix: bool) -> str:
    """``claims`` (encoded) as a token signed with ``secret``."""
    payload = _b64(claims)
    return f"{prefix}{payload}.{_signature(secret, prefix, payload, bind_prefix)}"


def unseal(
    secrets_: tuple[bytes, ...], prefix: str, token: str, *, bind_prefix: bool, max_len: int
) -> bytes | None:
    """The claims of ``token`` if one of ``secrets_`` signed it; None if it is not a
    token of this kind, is longer than ``max_len``, or was altered."""
    if not token.startswith(prefix) or not token.isascii() or len(token) > max_len:
        return None
    payload, dot, signature = token[len(prefix) :].partition(".")
    if not dot or not payload or not signature:
        return None
    if not any(
        hmac.compare_digest(_signature(s, prefix, payload, bind_prefix), signature)
        for s in secrets_
    ):
        return None
    try:
        return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except (binascii.Error, ValueError):
        return None
