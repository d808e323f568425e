"""A real ``gateway serve`` keeps answering everyone while its tools are fed hostile answers.

The regression probe for issue 29, end to end: a node with a tools file whose
HTTP tools answer 1 GiB, a gzip bomb and a 1 byte/s drip, and whose MCP server
answers 100 MB. One client makes the model call each (the simulator's
``/tool NAME {args}``) while ``StallProbe`` polls the node's ``/healthz`` and
runs another tenant's turns. Before, each of these held the node's loop for
10+ s (or a core for the whole timeout) and grew its RSS by gigabytes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol.events import Result
from tests.support.client import GatewayClient
from tests.support.procs import NodeProcess
from tests.support.stall import StallProbe

from .helpers import PeakRss
from .servers.hostile_http import hostile_server
from .servers.mcp_http import SERVER

_MAX_STALL = 2.5
"""A loaded machine's margin: healthz answered within 15-265 ms here (the gzip bomb the
slowest, 9x under this); the unbounded readers held the loop 10+ s (4x this)."""
_MAX_RSS_MB = 100.0

# (message to the simulator, what the failure says, seconds the call may take).
# The message proves why each call ended (its size bound, the drip's deadline);
# the seconds are liveness bounds with a loaded machine's margin, far below what
# the unbounded readers took (10-30 s; the drip ran 30 s past its 2 s timeout).
_PROBES: list[tuple[str, str, float]] = [
    ("/tool huge {}", "'huge' answered more than 128,000 bytes", 4.0),
    ("/tool bomb {}", "'bomb' answered a gzip-compressed body that expands past", 4.0),
    # At its 2 s deadline (2.03 s measured; 10 s is a loaded machine's 5x): it ran 30 s past.
    ("/tool drip {}", "'drip' did not answer within 2s", 10.0),
    (
        '/tool calc.big {"megabytes": 100}',
        "'calc.big' answered with more than 1,048,576 bytes",
        15.0,
    ),
]


def _tools_file(path: Path, base: str) -> Path:
    sections = [
        f'[http.{name}]\nurl = "{base}/{name}"\ndescription = "the {name} endpoint"\n'
        f'parameters = {{ type = "object" }}\ntimeout = {timeout}\n'
        for name, timeout in (("huge", 5), ("bomb", 5), ("drip", 2))
    ]
    command = json.dumps([sys.executable, str(SERVER)])
    sections.append(f"[mcp.calc]\ncommand = {command}\ntimeout = 10\n")
    path.write_text("\n".join(sections))
    return path


async def _watching(probe: StallProbe) -> None:
    """Until the probe has a health check and one of its tenant's turns done."""
    async with asyncio.timeout(20):
        while not (probe.turns and probe.health_checks):  # noqa: ASYNC110 (counters, no event)
            await asyncio.sleep(0.01)


async def _one_result(client: GatewayClient, message: str) -> dict[str, Any]:
    events = await client.turn(message, timeout=30)
    [result] = [e for e in events if isinstance(e, Result)]
    [answer] = orjson.loads(result.content)
    assert isinstance(answer, dict)
    return answer


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_node_under_hostile_tool_answers_keeps_answering_everyone(tmp_path: Path) -> None:
    with hostile_server() as endpoint:
        tools = _tools_file(tmp_path / "tools.toml", endpoint.base)
        args = ["serve", "--port", "0", "--workspace-root", str(tmp_path / "ws")]
        with NodeProcess([*args, "--tools", str(tools)], env={"REDIS_URL": ""}) as node:
            assert node.proc is not None
            rows: list[str] = []

            async def probe_all() -> None:
                client = await GatewayClient.connect(node.base + "/v1/realtime")
                try:
                    for message, expected, seconds in _PROBES:
                        rss = PeakRss(node.proc.pid)  # type: ignore[union-attr]
                        with StallProbe(node.http, node.base + "/v1/realtime") as probe:
                            await _watching(probe)
                            started = time.monotonic()
                            answer = await _one_result(client, message)
                            took = time.monotonic() - started
                        growth = rss.growth_mb
                        rows.append(
                            f"{message:36} {took:5.2f} s, node peak RSS +{growth:5.1f} MB; "
                            + probe.summary()
                        )
                        assert answer["status"] == "failure", answer
                        assert expected in answer["content"], answer
                        assert took < seconds, rows[-1]
                        assert growth < _MAX_RSS_MB, rows[-1]
                        assert probe.health_checks > 0 and probe.turns > 0, rows[-1]
                        assert not probe.health_failures and not probe.turn_failures, rows[-1]
                        assert probe.health_max < _MAX_STALL, rows[-1]
                        assert probe.turn_max_wait < _MAX_STALL, rows[-1]
                finally:
                    print("\n" + "\n".join(rows))
                    await client.close()

            asyncio.run(probe_all())
