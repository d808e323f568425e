"""The phone edge's Prometheus metrics, registered on the node's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["PhoneMetrics"]

_LATENCY = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_CALL = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


class PhoneMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.streams_refused = Counter(
            "rtgw_phone_streams_refused",
            "Media streams refused before a session existed, by reason",
            ["reason"],
            registry=r,
        )
        self.calls = Counter(
            "rtgw_phone_calls", "Phone calls that reached a session", ["carrier"], registry=r
        )
        self.ended = Counter(
            "rtgw_phone_calls_ended", "Phone calls ended, by reason", ["reason"], registry=r
        )
        self.open = Gauge(
            "rtgw_phone_calls_open",
            "Phone calls on this node now",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.duration = Histogram(
            "rtgw_phone_call_seconds", "How long calls lasted", buckets=_CALL, registry=r
        )
        self.talk = Counter(
            "rtgw_phone_talk_seconds", "The model's speech callers heard", registry=r
        )
        self.barge_ins = Counter(
            "rtgw_phone_barge_ins", "Callers who spoke over an answer (clear sent)", registry=r
        )
        self.first_audio = Histogram(
            "rtgw_phone_first_audio_seconds",
            "The caller's speech end (speech_stopped) to the answer's first audio sent",
            buckets=_LATENCY,
            registry=r,
        )
        self.clear_after = Histogram(
            "rtgw_phone_clear_seconds",
            "speech_started emitted to clear sent to the carrier",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5),
            registry=r,
        )
