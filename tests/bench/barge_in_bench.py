"""How soon speech cuts an answer (barge-in), and the voice retry waits: the figures the
tests assert only the order and a loaded machine's bound of.

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/barge_in_bench.py [--runs 5]``

1. **Barge-in**: a voice session through an in-process gateway and simulator (as
   ``tests/voice/test_voice_session.py``): an answer streams, the client sends
   0.3 s of silence then speech; the time from the first frame sent to the
   ``cancelled`` event. The simulator's VAD hears speech after ~0.1 s of it, so
   about 0.4 s is the floor; the tests allow 5 s.
2. **Retry waits**: a voice session whose model API refuses every connection (as
   ``tests/voice/test_voice_unreachable.py``): the gaps between the gateway's
   attempts after it told the client (0.5 s, then 1 s, doubling); the tests assert
   only that they are at least that.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import statistics
import tempfile
import time
from pathlib import Path

from gateway.app import running_gateway
from gateway.config import load_config
from tests.voice.conftest import VoiceClient, utterance, voice_gateway

RATE = 24000


async def barge_in(provider: str, workspace: Path) -> float:
    async with voice_gateway(provider, workspace, tokens_per_second=20, chunk_size=2) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE})
        await client.send({"type": "user", "content": "/raw " + "z" * 400})
        await client.until("respond")
        sender = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))
        began = time.monotonic()
        await client.until("cancelled")
        took = time.monotonic() - began
        await client.turn_end()
        await sender
        await client.close()
    return took


async def retry_gaps(workspace: Path, count: int = 3) -> list[float]:
    attempts: list[float] = []
    attempted = asyncio.Condition()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with attempted:
            attempts.append(time.monotonic())
            attempted.notify_all()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = {
        "provider": "openai",
        "openai_base_url": f"http://127.0.0.1:{port}/v1",
        "openai_api_key": "k",
        "port": 0,
        "workspace_root": str(workspace),
    }
    async with server, running_gateway(load_config(settings, env={})) as gateway:
        client = await VoiceClient.connect(gateway.url)
        await client.configure(input_audio={"rate": RATE})
        await client.until("error")
        start = len(attempts) - 1
        async with attempted:
            await attempted.wait_for(lambda: len(attempts) >= start + 1 + count)
        await client.close()
    times = attempts[start : start + 1 + count]
    return [b - a for a, b in itertools.pairwise(times)]


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for provider in ("openai", "gemini"):
            took = [await barge_in(provider, root / f"{provider}{i}") for i in range(runs)]
            print(
                f"barge-in {provider}: median {statistics.median(took) * 1000:.0f} ms, "
                f"max {max(took) * 1000:.0f} ms over {runs} runs (tests allow 5,000 ms)"
            )
        gaps = await retry_gaps(root / "retry")
        shown = ", ".join(f"{g * 1000:.0f}" for g in gaps)
        print(f"voice retry gaps after the error: {shown} ms (waits 500, 1000, 2000 ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    logging.basicConfig(level=logging.ERROR)  # the refused retries' warnings are expected
    asyncio.run(main(parser.parse_args().runs))
