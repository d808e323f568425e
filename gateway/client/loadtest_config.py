"""What one load test is: ``LoadTestConfig``, each of its settings declared once.

Apart from the engine (``gateway.client.loadtest``) because two engines run it
(that one, and ``gateway.client.phone_loadtest`` for ``--phone``) and the
command line (``gateway.client.loadtest_cli``) derives its flags from it
(``gateway.common.settings``): a setting changes here, for all three.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from gateway.client.report import DEFAULT_SAMPLE_CAP
from gateway.common.settings import ConfigError, Setting, check_ranges

__all__ = ["CONNECTION", "LOAD", "MAX_DURATION", "MAX_SESSIONS", "LoadTestConfig", "ProgressMode"]

MAX_SESSIONS: Final = 10_000
MAX_DURATION: Final = 24 * 3600.0

ProgressMode = Literal["off", "bar", "lines"]


Sessions = Annotated[int, msgspec.Meta(ge=1, le=MAX_SESSIONS)]
Count = Annotated[int, msgspec.Meta(ge=0)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_DURATION)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_DURATION)]

LOAD = "load"
CONNECTION = "connection"


class LoadTestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One load test: each field declares its setting once (``gateway.common.settings``).

    Checked on construction: a value out of its range raises ``ConfigError``
    (a ``ValueError``) naming the setting.
    """

    url: Annotated[str, Setting("gateway endpoint, e.g. ws://127.0.0.1:8765/v1/realtime")]
    sessions: Annotated[Sessions, Setting("concurrent client sessions", LOAD)] = 10
    turns: Annotated[Count, Setting("user messages each session sends, one at a time", LOAD)] = 1
    ramp: Annotated[
        Seconds, Setting("seconds over which the sessions start, evenly; 0: all at once", LOAD)
    ] = 0.0
    message: Annotated[str, Setting("the user message each turn sends", LOAD)] = "hello"
    think_time: Annotated[
        Seconds, Setting("seconds between the end of a turn and the next message", LOAD)
    ] = 0.0
    hold: Annotated[
        Seconds, Setting("seconds a session stays connected, idle, after its last turn", LOAD)
    ] = 0.0
    duration: Annotated[
        PositiveSeconds,
        Setting("hard cap on the whole run in seconds; what still runs then is stopped", LOAD),
    ] = 300.0
    turn_timeout: Annotated[
        PositiveSeconds,
        Setting("seconds after which an unfinished turn fails and its session closes", CONNECTION),
    ] = 60.0
    connect_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds bounding the handshake, and separately the session frame after it", CONNECTION
        ),
    ] = 10.0
    close_timeout: Annotated[
        PositiveSeconds, Setting("seconds a close handshake may take", CONNECTION)
    ] = 5.0
    token: Annotated[
        str | None,
        Setting(
            "API key, sent as Authorization: Bearer; never written to the report (default: "
            "$GATEWAY_TOKEN, unseen by other processes)",
            CONNECTION,
        ),
    ] = None
    progress: Annotated[
        ProgressMode, Setting("progress on stderr: none, an updating bar, or periodic lines")
    ] = "off"
    progress_interval: Annotated[
        Seconds, Setting("seconds between progress updates; 0: 0.5 for the bar, 5 for lines")
    ] = 0.0
    sample_cap: Annotated[
        AtLeastOne, Setting("latency samples kept per figure (a uniform reservoir past it)")
    ] = DEFAULT_SAMPLE_CAP
    max_frame: Annotated[int, Setting("largest frame accepted from the gateway, in bytes")] = (
        16 * 2**20
    )
    audio: Annotated[
        bytes,
        Setting("PCM16 mono speech each turn streams at real-time pace instead of the message"),
    ] = b""
    audio_rate: Annotated[int, Setting("sample rate of audio, per second")] = 24000
    phone: Annotated[
        bool,
        Setting(
            "each session is a phone call dialled as a carrier dials (Twilio Media Streams, "
            "signed with TWILIO_AUTH_TOKEN from the environment): the URL is a media-stream "
            "endpoint (ws://HOST:PORT/v1/phone/twilio); reports speech end → first audio",
            LOAD,
        ),
    ] = False
    phone_webhook: Annotated[
        str,
        Setting(
            "with --phone: the number's voice webhook (http://HOST:API_PORT/v1/phone/twilio/"
            "voice) each call asks first, signed, as Twilio does, for its one-time stream "
            "token (a gateway requires one by default); unset: streams alone",
            LOAD,
        ),
    ] = ""
    phone_barge_in: Annotated[
        bool,
        Setting(
            "with --phone: the caller speaks over each answer 0.3 s into it; reports "
            "barge-in → silence",
            LOAD,
        ),
    ] = False

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.url.startswith(("ws://", "wss://")):
            raise ConfigError(f"url {self.url!r} is not a WebSocket URL: use ws://HOST:PORT/PATH")
        if self.phone and "/v1/phone/" not in self.url:
            raise ConfigError(
                f"--phone dials a media-stream endpoint, not {self.url!r}: use "
                "ws://HOST:PORT/v1/phone/twilio"
            )
        if self.phone_barge_in and not self.phone:
            raise ConfigError("--phone-barge-in needs --phone")
