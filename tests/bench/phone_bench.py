"""Benchmark of phone calls through a gateway: barge-in → clear, speech end → first audio, CPU.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/phone_bench.py [--calls N] [--rounds R]``

A simulator and a gateway (``gateway serve``, Twilio auth token set) run as
subprocesses; this process is the carrier: ``PhoneLoadTest`` dials N
concurrent signed calls, each says a tone utterance, hears the answer, and
speaks over it 0.3 s into it (``--phone-barge-in``). Printed per round:

- caller side (the carrier simulator): speech end → the answer's first
  audio received (it includes the simulator VAD's 500 ms of silence);
  barge-in (the caller's first speech frame over an answer) → the ``clear``
  received (it includes the VAD's 100 ms of speech before ``speech_started``);
- gateway side (its ``/metrics``): ``speech_started`` emitted → ``clear``
  sent (``rtgw_phone_clear_seconds``: the log's round trip, the phone edge's
  work), and speech end → first audio sent (``rtgw_phone_first_audio_seconds``);
- the gateway's CPU per call-second (process CPU / (calls × seconds)).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import urllib.request

from gateway.client.loadtest import LoadTestConfig
from gateway.client.phone_loadtest import PhoneLoadTest
from tests.bench.benchlib import Proc, sim_proc

TOKEN = "bench-token"


def gateway(sim_url: str) -> Proc:
    base = sim_url.removesuffix("/realtime")
    return Proc(
        "gateway",
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--provider",
            "openai",
            "--model",
            "sim",
            "--log-level",
            "WARNING",
            "--phone-no-require-token",  # streams alone: the bench has no webhook port
        ],
        {
            "GATEWAY_OPENAI_BASE_URL": base,
            "OPENAI_API_KEY": "sim",
            "REDIS_URL": "",
            "GATEWAY_PHONE_TWILIO_AUTH_TOKEN": TOKEN,
        },
    )


def histogram(metrics: str, name: str) -> tuple[float, float]:
    """(count, sum) of a Prometheus histogram in ``metrics``."""
    count = re.search(rf"^{name}_count (\S+)$", metrics, re.M)
    total = re.search(rf"^{name}_sum (\S+)$", metrics, re.M)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=2)
    ns = parser.parse_args()
    with sim_proc() as sim, gateway(sim.url) as gw:
        base = gw.url.split("/v1/")[0]
        url = base + "/v1/phone/twilio"
        metrics_url = base.replace("ws://", "http://") + "/metrics"
        print(f"{ns.calls} concurrent calls x {ns.turns} turns, barging in; {ns.rounds} rounds")
        for round_ in range(1, ns.rounds + 1):
            before = await asyncio.to_thread(_get, metrics_url)
            cpu0 = gw.cpu()
            config = LoadTestConfig(url=url, sessions=ns.calls, turns=ns.turns, phone=True)
            report = await PhoneLoadTest(config, auth_token=TOKEN, barge_in=True).run()
            cpu = gw.cpu() - cpu0
            after = await asyncio.to_thread(_get, metrics_url)
            clear = _delta(before, after, "rtgw_phone_clear_seconds")
            first = _delta(before, after, "rtgw_phone_first_audio_seconds")
            fa, bi = report.first_audio, report.barge_in_to_silence
            print(
                f"round {round_}: ok {report.turns_ok}/{report.turns_planned}, "
                f"errors {report.errors or 'none'}\n"
                f"  caller: speech end → first audio p50 {fa.p50_ms:.0f} p95 {fa.p95_ms:.0f} "
                f"max {fa.max_ms:.0f} ms (n={fa.count}); barge-in → silence p50 "
                f"{bi.p50_ms:.0f} p95 {bi.p95_ms:.0f} max {bi.max_ms:.0f} ms (n={bi.count})\n"
                f"  gateway: speech_started → clear sent mean {clear * 1000:.2f} ms; "
                f"speech end → first audio sent mean {first * 1000:.1f} ms\n"
                f"  gateway CPU {cpu:.2f} s over {report.elapsed_s:.1f} s: "
                f"{cpu / (ns.calls * report.elapsed_s) * 100:.2f}% of a core per call"
            )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _delta(before: str, after: str, name: str) -> float:
    count0, sum0 = histogram(before, name)
    count1, sum1 = histogram(after, name)
    return (sum1 - sum0) / (count1 - count0) if count1 > count0 else 0.0


if __name__ == "__main__":
    asyncio.run(main())
