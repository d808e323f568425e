"""One-time stream tokens: signed, bounded in time, for one key (and session, call)."""

from __future__ import annotations

from gateway.edge.tokens import mint_token, verify_token
from gateway.phone.stream_tokens import StreamToken, mint_stream_token, verify_stream_token

SECRET = b"s" * 32


def test_a_token_says_whose_call_it_opens() -> None:
    token = mint_stream_token(SECRET, "app", 1000.0, sid="sess1234", call="CA1")
    claims = verify_stream_token((b"old" * 11, SECRET), token, now=999.0)
    assert isinstance(claims, StreamToken)
    assert (claims.key, claims.sid, claims.call) == ("app", "sess1234", "CA1")
    assert claims.n  # a nonce: the store counts its uses


def test_each_token_has_its_own_nonce() -> None:
    one = verify_stream_token((SECRET,), mint_stream_token(SECRET, "app", 10.0), 1.0)
    two = verify_stream_token((SECRET,), mint_stream_token(SECRET, "app", 10.0), 1.0)
    assert isinstance(one, StreamToken) and isinstance(two, StreamToken)
    assert one.n != two.n


def test_expired_altered_foreign_and_client_tokens_are_refused() -> None:
    token = mint_stream_token(SECRET, "app", 1000.0)
    assert "expired" in str(verify_stream_token((SECRET,), token, now=1000.0))
    assert "not valid" in str(verify_stream_token((b"x" * 32,), token, now=1.0))
    head, payload, signature = token.rsplit(".", 2)
    altered = f"{head}.{payload[:-2]}AA.{signature}"
    assert "not valid" in str(verify_stream_token((SECRET,), altered, now=1.0))
    # A client token (the same secret) opens a WebSocket session, never a phone stream.
    client = mint_token(SECRET, "sid", "app", 1000.0)
    assert "not valid" in str(verify_stream_token((SECRET,), client, now=1.0))
    # …and a stream token is no client token.
    assert not isinstance(verify_token((SECRET,), token, 1.0), StreamToken)
    assert "not valid" in str(verify_stream_token((SECRET,), "rtgw_st." + "a" * 5000, now=1.0))
