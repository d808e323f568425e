"""Who may open a stream: the URLs a signature may cover, refusals at the handshake."""

from __future__ import annotations

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request

from gateway.phone.admission import check_signature, signed_urls
from gateway.phone.carriers import CARRIERS
from gateway.phone_settings import PhoneSettings
from protocol.media_stream import fonoster_signature, twilio_signature

_BY_NAME = {carrier.name: carrier for carrier in CARRIERS}
TWILIO, FONOSTER, TELNYX = _BY_NAME["twilio"], _BY_NAME["fonoster"], _BY_NAME["telnyx"]
TOKEN = "auth-token"


def request(path: str, **headers: str) -> Request:
    return Request(path, Headers({"Host": "voice.example.com", **headers}))


@pytest.mark.parametrize(
    "signed",
    [
        "wss://voice.example.com/v1/phone/twilio",
        "https://voice.example.com/v1/phone/twilio",
        "ws://voice.example.com/v1/phone/twilio",
        "wss://voice.example.com:443/v1/phone/twilio",
    ],
)
def test_a_twilio_stream_signed_for_its_url_is_let_in(signed: str) -> None:
    settings = PhoneSettings(twilio_auth_token=TOKEN)
    header = twilio_signature(TOKEN, signed)
    verdict = check_signature(
        TWILIO, settings, request("/v1/phone/twilio", **{"X-Twilio-Signature": header}), 0
    )
    assert verdict.signed


def test_behind_a_proxy_the_public_url_is_what_was_signed() -> None:
    settings = PhoneSettings(twilio_auth_token=TOKEN, public_url="wss://voice.example.com/")
    good = twilio_signature(TOKEN, "wss://voice.example.com/v1/phone/twilio")
    internal = twilio_signature(TOKEN, "ws://10.0.0.5:8765/v1/phone/twilio")
    inside = Headers({"Host": "10.0.0.5:8765"})
    assert check_signature(
        TWILIO,
        settings,
        Request("/v1/phone/twilio", Headers({**inside, "X-Twilio-Signature": good})),
        0,
    ).signed
    refused = check_signature(
        TWILIO,
        settings,
        Request("/v1/phone/twilio", Headers({**inside, "X-Twilio-Signature": internal})),
        0,
    )
    assert (refused.signed, refused.status) == (False, 403)
    assert signed_urls(settings, "/v1/phone/twilio/voice?p=1", "x", scheme="http") == [
        "https://voice.example.com/v1/phone/twilio/voice?p=1"
    ]


def test_unsigned_and_badly_signed_streams_are_refused_with_what_to_check() -> None:
    settings = PhoneSettings(twilio_auth_token=TOKEN)
    missing = check_signature(TWILIO, settings, request("/v1/phone/twilio"), 0)
    assert (missing.status, missing.reason) == (401, "unsigned")
    bad = check_signature(
        TWILIO, settings, request("/v1/phone/twilio", **{"X-Twilio-Signature": "AAAA"}), 0
    )
    assert bad.status == 403 and "TWILIO_AUTH_TOKEN" in bad.message


def test_without_a_secret_the_stream_passes_unsigned_for_a_token_to_open() -> None:
    verdict = check_signature(TWILIO, PhoneSettings(), request("/v1/phone/twilio"), 0)
    assert (verdict.signed, verdict.status) == (False, 0)
    assert check_signature(TELNYX, PhoneSettings(), request("/v1/phone/telnyx"), 0).status == 0


def test_fonoster_signs_a_timestamp_that_must_be_recent() -> None:
    settings = PhoneSettings(fonoster_secret="s3cret")
    url = "wss://voice.example.com/v1/phone/fonoster"
    signature = fonoster_signature("s3cret", "1000", url)
    headers = {"x-fonoster-timestamp": "1000", "x-fonoster-signature": signature}
    assert check_signature(
        FONOSTER, settings, request("/v1/phone/fonoster", **headers), 1100
    ).signed
    stale = check_signature(FONOSTER, settings, request("/v1/phone/fonoster", **headers), 2000)
    assert (stale.status, stale.reason) == (403, "stale_signature")
