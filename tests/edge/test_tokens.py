"""Client tokens: pure minting and verification (no sockets, the clock passed in)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.tokens import (
    ClientToken,
    TokenRefused,
    is_client_token,
    mint_token,
    new_secret,
    verify_token,
)

SECRET = new_secret()
OTHER = new_secret()


def test_a_token_opens_its_session_until_it_expires() -> None:
    token = mint_token(SECRET, "sid-1", "tenant-a", expires_at=1000.0)
    assert is_client_token(token) and not is_client_token("sk-live-key")
    claims = verify_token((SECRET,), token, now=999.0)
    assert claims == ClientToken(sid="sid-1", key="tenant-a", exp=1000.0)
    expired = verify_token((SECRET,), token, now=1000.0)
    assert isinstance(expired, TokenRefused) and "expired" in expired.message


def test_rotation_accepts_the_old_secret_until_expiry() -> None:
    token = mint_token(OTHER, "sid-1", "k", expires_at=50.0)
    assert isinstance(verify_token((SECRET, OTHER), token, now=1.0), ClientToken)
    assert isinstance(verify_token((SECRET,), token, now=1.0), TokenRefused)


def test_a_token_cannot_be_stretched_to_another_session_or_time() -> None:
    token = mint_token(SECRET, "sid-1", "k", expires_at=50.0)
    prefix, _payload, signature = token.split(".")
    forged_claims = b'{"sid":"sid-2","key":"k","exp":1e12,"v":1}'
    forged_payload = base64.urlsafe_b64encode(forged_claims).rstrip(b"=").decode()
    forged = f"{prefix}.{forged_payload}.{signature}"
    refused = verify_token((SECRET,), forged, now=1.0)
    assert isinstance(refused, TokenRefused) and "not valid" in refused.message


@given(st.text(max_size=300))
def test_any_garbage_is_refused_with_a_message(garbage: str) -> None:
    for candidate in (garbage, "rtgw_ct." + garbage, "rtgw_ct.x." + garbage):
        result = verify_token((SECRET,), candidate, now=0.0)
        assert isinstance(result, TokenRefused) and result.message


def test_a_token_names_the_key_that_minted_it_and_older_tokens_still_verify() -> None:
    digest = "ab" * 32
    token = mint_token(SECRET, "sid-1", "tenant-a", expires_at=50.0, key_digest=digest)
    claims = verify_token((SECRET,), token, now=1.0)
    assert isinstance(claims, ClientToken) and claims.kd == digest
    # A token minted before tokens named their key: no kd (checked by key id).
    payload = base64.urlsafe_b64encode(b'{"sid":"sid-1","key":"k","exp":50.0,"v":1}')
    text = payload.rstrip(b"=").decode()
    mac = hmac.new(SECRET, text.encode(), hashlib.sha256).digest()
    older = f"rtgw_ct.{text}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
    claims = verify_token((SECRET,), older, now=1.0)
    assert isinstance(claims, ClientToken) and (claims.key, claims.kd) == ("k", "")
