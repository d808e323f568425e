"""``gateway loadtest --phone``: concurrent calls dialled as a carrier dials them."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import msgspec
import pytest

from gateway.client.loadtest import LoadTestConfig
from gateway.client.phone_loadtest import PhoneLoadTest
from gateway.common.settings import ConfigError
from tests.support.carrier import AUTH_TOKEN, phone_gateway


async def test_calls_are_answered_and_barge_ins_cleared(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        config = LoadTestConfig(
            url=gw.stream_url,
            sessions=3,
            turns=1,
            phone=True,
            phone_webhook=f"{gw.api_url}/v1/phone/twilio/voice",
        )
        report = await PhoneLoadTest(config, auth_token=AUTH_TOKEN, barge_in=True).run()
    assert report.ok, report.errors
    assert report.first_audio.count == 6  # each call's utterance, then its barge-in
    assert report.barge_in_to_silence.count == 3 and report.clears == 3
    assert report.marks_echoed == report.media_received > 0


async def test_unsigned_calls_are_counted_as_refused(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        config = LoadTestConfig(url=gw.stream_url, sessions=2, phone=True)
        report = await PhoneLoadTest(config, auth_token=None).run()
    assert not report.ok
    assert report.calls_failed == 2 and report.errors == {"http_401": 2}


async def test_a_signed_stream_without_its_token_is_counted_with_the_reason(
    tmp_path: Path,
) -> None:
    async with phone_gateway(tmp_path) as gw:
        config = LoadTestConfig(url=gw.stream_url, sessions=2, phone=True, turn_timeout=20)
        report = await PhoneLoadTest(config, auth_token=AUTH_TOKEN).run()
    assert not report.ok
    assert report.errors == {"stream_closed": 2}
    assert "1008" in report.error_examples["stream_closed"]
    assert "one-time token" in report.error_examples["stream_closed"]


async def test_a_refused_webhook_is_counted_with_its_reason(tmp_path: Path) -> None:
    async with phone_gateway(tmp_path) as gw:
        config = LoadTestConfig(
            url=gw.stream_url,
            sessions=2,
            phone=True,
            phone_webhook=f"{gw.api_url}/v1/phone/twilio/voice",
        )
        report = await PhoneLoadTest(config, auth_token="not-the-token").run()
    assert not report.ok
    assert report.calls_failed == 2 and report.errors == {"webhook_403": 2}
    assert "X-Twilio-Signature" in report.error_examples["webhook_403"]


def test_phone_needs_a_media_stream_url() -> None:
    with pytest.raises(ConfigError, match="/v1/phone/twilio"):
        LoadTestConfig(url="ws://127.0.0.1:8765/v1/realtime", phone=True)
    with pytest.raises(ConfigError, match="needs --phone"):
        LoadTestConfig(url="ws://127.0.0.1:8765/v1/realtime", phone_barge_in=True)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_command_runs_20_concurrent_calls_and_prints_percentiles(
    tmp_path: Path,
) -> None:
    async with phone_gateway(tmp_path) as gw:
        json_path = tmp_path / "report.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            "loadtest",
            "--phone",
            gw.stream_url,
            "--phone-webhook",
            f"{gw.api_url}/v1/phone/twilio/voice",
            "--sessions",
            "20",
            "--quiet",
            "--json",
            str(json_path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "TWILIO_AUTH_TOKEN": AUTH_TOKEN},
        )
        out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    assert "calls     connected 20/20" in text
    [row] = [line for line in text.splitlines() if "speech end → first audio" in line]
    assert row.split()[5] == "20"  # the count, then p50, p95, p99, max, mean
    report = msgspec.json.decode(json_path.read_bytes())
    assert report["first_audio"]["count"] == 20 and report["first_audio"]["p95_ms"] > 0
