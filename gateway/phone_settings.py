"""The phone edge's settings (``gateway serve --phone-*``, ``GATEWAY_PHONE_*``).

Declared once here, lent to ``gateway.config.Config`` under the ``phone``
prefix (as the simulator's are under ``sim``). docs/phone.md says how they
fit together. They stand beside ``gateway/phone/`` rather than inside it: the
node's configuration stands on them, and the phone room stands on the
sessions, which stand on the configuration; inside the room they would be an
arrow back up. Imports nothing of ours but the settings machinery.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from gateway.common.settings import Setting, check_ranges

__all__ = ["PhoneSettings"]

PHONE = "phone calls (docs/phone.md)"


class PhoneSettings(msgspec.Struct, kw_only=True):
    """How carriers' media streams reach sessions, and what calls may do."""

    public_url: Annotated[
        str,
        Setting(
            "the base URL carriers dial media streams at, as they sign it (e.g. "
            "wss://voice.example.com, the TLS terminator in front of the gateway); unset: "
            "wss:// or ws:// and each request's Host header",
            PHONE,
            example="wss://voice.example.com",
        ),
    ] = ""
    numbers_file: Annotated[
        str,
        Setting(
            'TOML file of the calls\' session configuration: [defaults], [numbers."+1555…"] '
            "by the number called, [profiles.NAME] by the stream's profile parameter; "
            "reloaded on change",
            PHONE,
        ),
    ] = ""
    key: Annotated[
        str,
        Setting(
            "the API key id that owns calls whose number, profile or stream token names "
            "none (its key policy applies; the app reads their sessions with that key)",
            PHONE,
            shown_default="anonymous without API keys (as every session then), else phone",
        ),
    ] = ""
    require_token: Annotated[
        bool,
        Setting(
            "refuse a media stream without a one-time stream token, even when the carrier "
            "signed it (a signature covers the URL only, so a captured one can be replayed); "
            "--phone-no-require-token lets a signed stream in without one (its calls then "
            "belong to --phone-key, and it may not name a session)",
            PHONE,
            flag="no-require-token",
        ),
    ] = True
    token_ttl: Annotated[
        Annotated[float, Meta(ge=1, le=86400)],
        Setting("seconds a one-time stream token may wait to be used", PHONE),
    ] = 300.0
    tools: Annotated[
        bool,
        Setting("offer the model the call tools end_call, transfer_call and send_dtmf", PHONE),
    ] = False
    transfer_to: Annotated[
        str,
        Setting(
            "comma-separated numbers transfer_call may dial (a trailing * allows a prefix, "
            "e.g. +1555*); unset: no transfers",
            PHONE,
        ),
    ] = ""
    twilio_account_sid: Annotated[
        str,
        Setting(
            "Twilio account SID: transfers and hang-ups through the REST API",
            PHONE,
            env="TWILIO_ACCOUNT_SID",
        ),
    ] = ""
    twilio_auth_token: Annotated[
        str,
        Setting(
            "Twilio auth token: checks X-Twilio-Signature on streams and on the voice "
            "webhook, and signs REST calls",
            PHONE,
            secret=True,
            env="TWILIO_AUTH_TOKEN",
        ),
    ] = ""
    twilio_api_url: Annotated[
        str,
        Setting("base URL of Twilio's REST API (a stand-in's, for tests)", PHONE),
    ] = "https://api.twilio.com"
    fonoster_secret: Annotated[
        str,
        Setting(
            "Fonoster stream signing secret: checks x-fonoster-signature on streams",
            PHONE,
            secret=True,
        ),
    ] = ""

    def __post_init__(self) -> None:
        check_ranges(self)
