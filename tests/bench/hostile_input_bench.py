"""How long a node's other clients wait while one tenant sends hostile schemas and args, and
how the ``uniqueItems`` check scales: the figures tests/gateway/test_hostile_schemas.py
asserts only a loaded machine's bound of (2.5 s; linear within 24x at 8x the objects).

Run: ``PYTHONPATH=. .venv/bin/python tests/bench/hostile_input_bench.py [--repeats 3]``

One ``gateway serve`` process (memory store, API port, two keys); for each input, tenant
``alice`` sends it while ``StallProbe`` polls ``/healthz`` and runs tenant ``bob``'s turns.
Printed per input: how long the node took to answer it, the slowest ``/healthz`` and bob's
longest wait, the worst of ``--repeats`` runs. Then the CPU time of the ``uniqueItems`` check
alone (this thread's, the best of five) at 500 to 4,000 objects.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from protocol.configuration import MAX_SCHEMA_DEPTH
from protocol.events import Call, End
from tests.edge.conftest import Keys
from tests.gateway.test_hostile_schemas import (
    Node,
    _unique_check_cpu,
    configure,
    heavy_tools,
    nested,
    warm,
)
from tests.support.procs import NodeProcess
from tools.tenant_schema import TenantSchema

Probe = Callable[[Node], Awaitable[None]]


async def pattern(node: Node) -> None:
    tool = {
        "name": "lookup",
        "parameters": {"properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}},
    }
    client = await node.client()
    await configure(client, tool)
    await client.turn("/tool lookup " + orjson.dumps({"q": "a" * 40 + "!"}).decode())
    await client.close()


async def unique_items(node: Node) -> None:
    """A client tool: checked on the node, then the call goes to this client, which answers."""
    items = {"type": "array", "uniqueItems": True}
    tool = {"name": "tag", "parameters": {"properties": {"xs": items}}}
    args = {"xs": [{"id": i, "v": i % 7} for i in range(4000)]}
    client = await node.client()
    await configure(client, tool)
    await client.user("/tool tag " + orjson.dumps(args).decode())
    [*_, call] = await client.until(lambda e: isinstance(e, Call))
    assert isinstance(call, Call)
    await client.send({"type": "tool_result", "id": call.id, "status": "success", "content": 1})
    await client.until(lambda e: isinstance(e, End))
    await client.close()


async def large_post(node: Node) -> None:
    await node.post(orjson.dumps({"tools": heavy_tools(710_000, width=240)}))


async def deep_post(node: Node) -> None:
    tool = '{"name": "deep", "parameters": ' + nested(3000) + "}"
    await node.post(b'{"tools": [' + tool.encode() + b"]}")


PROBES: list[tuple[str, Probe]] = [
    ("pattern (a+)+$ on 40 a's and !", pattern),
    ("uniqueItems over 4,000 objects", unique_items),
    ("0.72 MB of tool schemas via POST", large_post),
    (f"a schema nested 3,000 deep via POST (limit {MAX_SCHEMA_DEPTH})", deep_post),
]


async def measure(node: Node, repeats: int) -> None:
    print(f"{'input':58} {'took':>8} {'healthz':>8} {'bob':>8}  (worst of {repeats}, ms)")
    for name, probe in PROBES:
        took = health = wait = 0.0
        for _ in range(repeats):
            with node.probe() as watch:
                await warm(watch)
                started = time.monotonic()
                await probe(node)
                took = max(took, time.monotonic() - started)
            health, wait = max(health, watch.health_max), max(wait, watch.turn_max_wait)
        print(f"{name:58} {took * 1e3:8.0f} {health * 1e3:8.0f} {wait * 1e3:8.0f}")


def scaling() -> None:
    schema = TenantSchema({"properties": {"xs": {"type": "array", "uniqueItems": True}}})
    sizes = (500, 1000, 2000, 4000)
    cpu = [_unique_check_cpu(schema, n) for n in sizes]
    for n, spent in zip(sizes, cpu, strict=True):
        ratio = spent / cpu[0]
        print(f"uniqueItems check, {n:5,} objects: {spent * 1e3:6.2f} ms CPU ({ratio:4.1f}x)")


def main(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        keys = Keys(root / "keys")
        keys.add("alice")
        keys.add("bob")
        args = ["serve", "--port", "0", "--api-port", "0", "--api-keys-file", str(keys.path)]
        args += ["--workspace-root", str(root / "ws")]
        with NodeProcess(args, env={"REDIS_URL": ""}) as proc:
            proc.wait_for_lines(r"HTTP API:")
            asyncio.run(measure(Node(proc, keys), repeats))
    scaling()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args().repeats)
