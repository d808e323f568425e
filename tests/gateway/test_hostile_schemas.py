"""No tenant's tool schema or args can freeze the node (issue 29): probes through a real node.

One ``gateway serve`` process (memory store, API port, two keys) takes each
hostile input from tenant ``alice`` while ``StallProbe`` polls ``/healthz`` and
runs tenant ``bob``'s turns on the same node. Before the fix these inputs held
the loop 12-29 s (a backtracking ``pattern``, ``uniqueItems`` over 4,000
objects, 0.7 MB of schemas via POST, ``configure`` or a client token's
connect, a remote ``$ref`` to a URL that never answers), or ended in 500,
1011 or ``internal`` (schemas and native-call args nested 120-3,000 deep).
Each probe asserts the refusal's words and that the node kept answering
(``_MARGIN``: broken code took 10 s and more), and prints the figures.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from protocol.configuration import MAX_ARGS_DEPTH, MAX_SCHEMA_DEPTH, MAX_TOOL_SCHEMA_BYTES
from protocol.events import Call, Configured, End, Error, Event, Result
from tests.edge.conftest import Keys
from tests.support.client import GatewayClient
from tests.support.hostile import cpu_seconds
from tests.support.procs import NodeProcess
from tests.support.stall import StallProbe
from tests.voice.conftest import VoiceClient
from tools.tenant_schema import TenantSchema

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

_MARGIN = 2.5
"""Seconds the slowest /healthz and bob's longest wait may take during a probe: 25x the
slowest seen on an idle machine (94 ms), 4x under what a held loop took (10 s and more)."""


class Node:
    def __init__(self, proc: NodeProcess, keys: Keys) -> None:
        self.proc = proc
        self.keys = keys
        found = re.search(r"HTTP API:\s+(\S+)/v1/sessions", proc.log)
        assert found, proc.log
        self.api = found.group(1)
        self.ws = proc.base + "/v1/realtime"

    def probe(self) -> StallProbe:
        return StallProbe(self.proc.http, self.ws, headers=self.keys.bearer("bob"))

    async def client(self) -> GatewayClient:
        return await GatewayClient.connect(self.ws, headers=self.keys.bearer("alice"))

    async def post(self, body: bytes) -> tuple[int, Any]:
        headers = {**self.keys.bearer("alice"), "Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.api + "/v1/sessions", data=body, headers=headers) as r,
        ):
            return r.status, await r.json(content_type=None)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("hostile")
    keys = Keys(root / "keys")
    keys.add("alice")
    keys.add("bob")
    args = ["serve", "--port", "0", "--api-port", "0", "--api-keys-file", str(keys.path)]
    args += ["--workspace-root", str(root / "ws")]
    with NodeProcess(args, env={"REDIS_URL": ""}) as proc:
        proc.wait_for_lines(r"HTTP API:")
        yield Node(proc, keys)


def report(name: str, probe: StallProbe, took: float) -> None:
    print(f"\n[{name}] refused/answered in {took * 1000:.0f} ms; {probe.summary()}")
    assert probe.health_checks > 0 and probe.turns > 0, probe.summary()
    assert not probe.health_failures and not probe.turn_failures, probe.summary()
    assert probe.health_max < _MARGIN, probe.summary()
    assert probe.turn_max_wait < _MARGIN, probe.summary()


async def configure(client: GatewayClient, *tools: dict[str, Any]) -> Event:
    await client.send({"type": "configure", "tools": list(tools)})
    got = await client.until(lambda e: isinstance(e, Configured | Error), timeout=30)
    return got[-1]


async def warm(probe: StallProbe) -> None:
    """Let bob's first turn finish, so the probe sees the node before the input.

    The count is kept by the probe's own thread, which has no event to await.
    """
    async with asyncio.timeout(20):
        while probe.turns < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def nested(levels: int) -> str:
    """A schema whose JSON nests ``levels`` deep (orjson writes at most 255)."""
    objects = levels // 2
    return '{"type":"object","properties":{"a":' * objects + "{}" + "}}" * objects


def deep_args(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# ---------------------------------------------------------------------- args


async def test_a_backtracking_pattern_is_linear(node: Node) -> None:
    tool = {
        "name": "lookup",
        "parameters": {"properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}},
    }
    client = await node.client()
    assert isinstance(await configure(client, tool), Configured)
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        events = await client.turn("/tool lookup " + orjson.dumps({"q": "a" * 40 + "!"}).decode())
        took = time.monotonic() - started
    report("pattern (a+)+$ on 40 a's and !", probe, took)
    [call] = [e for e in events if isinstance(e, Call)]
    assert call.runs_on == "gateway"  # refused here: the client never sees it
    [result] = orjson.loads([e for e in events if isinstance(e, Result)][-1].content)
    assert result["status"] == "failure" and "does not match" in result["content"]
    await client.close()


def _unique_check_cpu(schema: TenantSchema, n: int) -> float:
    """The best of five checks' CPU time (this thread's: other processes' load does not count)."""
    args = {"xs": [{"id": i, "v": i % 7} for i in range(n)]}
    best = float("inf")
    for _ in range(5):
        started = time.thread_time()
        assert schema.explain(args) is None  # unique, and within the check's budget
        best = min(best, time.thread_time() - started)
    return best


async def test_unique_items_over_4000_objects_is_linear(node: Node) -> None:
    tool = {
        "name": "tag",
        "parameters": {"properties": {"xs": {"type": "array", "uniqueItems": True}}},
    }
    # Linear: eight times the objects cost about eight times the work (measured 8.8-9.2x);
    # comparing them in pairs would cost 64x.
    schema = TenantSchema(tool["parameters"])
    small, large = _unique_check_cpu(schema, 500), _unique_check_cpu(schema, 4000)
    assert large < 24 * small, f"500 objects: {small * 1e3:.2f} ms, 4,000: {large * 1e3:.2f} ms"
    args = {"xs": [{"id": i, "v": i % 7} for i in range(4000)]}
    text = "/tool tag " + orjson.dumps(args).decode()
    assert len(text) > 40_000
    client = await node.client()
    assert isinstance(await configure(client, tool), Configured)
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        await client.user(text)
        [*_, call] = await client.until(lambda e: isinstance(e, Call))
        took = time.monotonic() - started
        assert isinstance(call, Call) and call.runs_on == "client"  # they are unique
        await client.send({"type": "tool_result", "id": call.id, "status": "success", "content": 1})
        await client.until(lambda e: isinstance(e, End))
    report("uniqueItems over 4,000 objects", probe, took)
    await client.close()


async def test_native_call_args_past_the_depth_limit_are_malformed_execute(node: Node) -> None:
    """Native calls come from voice sessions: audio out makes the simulator call ``list``."""
    client = await VoiceClient.connect(node.ws, token=node.keys.keys["alice"])
    await client.configure(input_audio={"rate": 24000}, output="audio")
    for depth in (MAX_ARGS_DEPTH + 1, 120, 3000):
        with node.probe() as probe:
            await warm(probe)
            started = time.monotonic()
            await client.send({"type": "user", "content": f"/tool list {deep_args(depth)}"})
            events = await client.turn_end()
            took = time.monotonic() - started
        report(f"native call args nested {depth} deep", probe, took)
        [error] = [e for e in events if isinstance(e, Error)]
        assert error.code == "malformed_execute", error
        assert f"deeper than {MAX_ARGS_DEPTH} levels" in error.content
        [result] = orjson.loads([e for e in events if isinstance(e, Result)][-1].content)
        assert result["status"] == "failure" and "flatter" in result["content"]
        assert isinstance(events[-2], End)
    await client.close()


# ---------------------------------------------------------------------- schemas


def heavy_tools(total: int, width: int = 40) -> list[dict[str, Any]]:
    """Tools of patterns and nested objects, ``total`` bytes of schema JSON or more."""
    tools: list[dict[str, Any]] = []
    size = 0
    while size < total:
        props = {
            f"p{i}": {"type": "string", "pattern": f"^[a-z]{{1,{i % 50 + 5}}}(-[0-9]+)?$"}
            for i in range(width)
        }
        params = {"type": "object", "properties": {"o": {"type": "object", "properties": props}}}
        tools.append({"name": f"t{len(tools)}", "parameters": params})
        size += len(orjson.dumps(params))
    return tools


async def test_large_schemas_are_refused_at_the_limit_via_post_and_configure(node: Node) -> None:
    tools = heavy_tools(710_000, width=240)
    assert len(tools) <= 64
    body = orjson.dumps({"tools": tools})
    assert len(body) > 700_000
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        status, answer = await node.post(body)
        took = time.monotonic() - started
    report(f"{len(body) / 1e6:.2f} MB of tool schemas via POST", probe, took)
    assert status == 400, answer
    assert "limit of 131,072 for a session's tools" in answer["error"]["message"]
    client = await node.client()
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        error = await configure(client, *tools)
        took = time.monotonic() - started
    report(f"{len(body) / 1e6:.2f} MB of tool schemas via configure", probe, took)
    assert isinstance(error, Error) and error.code == "bad_frame"
    assert "131,072" in error.content
    one = {"name": "big", "parameters": {"description": "x" * (MAX_TOOL_SCHEMA_BYTES + 1)}}
    error = await configure(client, one)
    assert isinstance(error, Error) and "'big'" in error.content and "32,768" in error.content
    await client.close()


async def test_schemas_at_the_limit_compile_off_the_loop_and_a_token_connect_is_free(
    node: Node,
) -> None:
    tools = heavy_tools(120_000)
    body = orjson.dumps({"tools": tools})
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        status, answer = await node.post(body)
        took = time.monotonic() - started
        report(f"{len(body) / 1e3:.0f} kB of tool schemas via POST (accepted)", probe, took)
        assert status == 201, answer
        started = time.monotonic()
        client = await GatewayClient.connect(node.ws + "?token=" + answer["client_token"])
        await client.user("hello")
        await client.until(lambda e: isinstance(e, End))
        took = time.monotonic() - started
    report("a client token's connect and turn", probe, took)
    await client.close()


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 120, 3000])
async def test_deep_schemas_are_refused_naming_the_limit(node: Node, depth: int) -> None:
    tool = '{"name": "deep", "parameters": ' + nested(depth) + "}"
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        status, answer = await node.post(b'{"tools": [' + tool.encode() + b"]}")
        took = time.monotonic() - started
    report(f"a schema nested {depth} deep via POST", probe, took)
    assert status == 400, answer
    assert f"at most {MAX_SCHEMA_DEPTH} levels" in answer["error"]["message"] or (
        f"deeper than {MAX_SCHEMA_DEPTH} levels" in answer["error"]["message"]
    )
    client = await node.client()
    with node.probe() as probe:
        await warm(probe)
        started = time.monotonic()
        await client.send('{"type": "configure", "tools": [' + tool + "]}")
        [*_, error] = await client.until(lambda e: isinstance(e, Configured | Error))
        took = time.monotonic() - started
    report(f"a schema nested {depth} deep via configure", probe, took)
    assert isinstance(error, Error) and error.code == "bad_frame", error
    if depth < 1000:  # deeper than msgspec decodes: the frame's own "nested too deeply"
        assert f"deeper than {MAX_SCHEMA_DEPTH} levels" in error.content
    await client.close()


class Listener:
    """A local port that accepts connections, records them and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)  # held open, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


async def test_a_remote_or_file_ref_is_refused_and_nothing_is_fetched(node: Node) -> None:
    listener = Listener()
    try:
        url = f"http://127.0.0.1:{listener.port}/schema.json"
        client = await node.client()
        for ref in (url, url + "#/x", "file:///etc/passwd", "other.json#/a"):
            tool = {"name": "fetchy", "parameters": {"properties": {"a": {"$ref": ref}}}}
            with node.probe() as probe:
                await warm(probe)
                started = time.monotonic()
                error = await configure(client, tool)
                status, answer = await node.post(orjson.dumps({"tools": [tool]}))
                took = time.monotonic() - started
            report(f"$ref {ref}", probe, took)
            assert isinstance(error, Error) and error.code == "bad_frame", error
            assert "points outside this schema" in error.content and "#/$defs/" in error.content
            assert status == 400 and "points outside this schema" in answer["error"]["message"]
        await client.close()
        assert listener.accepted == [], "the gateway connected to the $ref's URL"
    finally:
        listener.close()


async def test_a_client_tool_may_not_take_a_server_tools_name(node: Node) -> None:
    tool = {"name": "write", "parameters": {"type": "object"}}
    client = await node.client()
    error = await configure(client, tool)
    assert isinstance(error, Error) and error.code == "bad_frame", error
    assert "'write' is the name of a server tool" in error.content
    status, answer = await node.post(orjson.dumps({"tools": [tool]}))
    assert status == 400 and "'write'" in answer["error"]["message"], answer
    # A session without that server tool may declare it.
    body = {"tools": [tool], "server_tools": ["read"]}
    status, answer = await node.post(orjson.dumps(body))
    assert status == 201, answer
    await client.close()


async def test_frames_of_huge_arrays_are_refused_before_they_are_read(node: Node) -> None:
    """Found from outside (2026-12-07): a configure of 60,000 tools (780 KB) was decoded
    whole before its 64-tool limit refused it (190 ms a frame), and 70,000 server_tools
    names were taken and echoed as a 1 MB event. Their arrays are counted first now."""
    assert node.proc.proc is not None
    pid = node.proc.proc.pid
    client = await node.client()
    many_tools = {"type": "configure", "tools": [{"name": "a"}] * 60_000}
    many_names = {"type": "configure", "server_tools": ["list", "read"] * 35_000}
    used = cpu_seconds(pid)
    for frame, where in [(many_tools, "tools"), (many_names, "server_tools")] * 3:
        await client.send(frame)
        got = await client.until(lambda e: isinstance(e, Configured | Error), timeout=30)
        error = got[-1]
        assert isinstance(error, Error) and error.code == "bad_frame", error
        assert f"{where} holds {len(frame[where]):,} values" in error.content  # type: ignore[arg-type]
    used = cpu_seconds(pid) - used
    print(f"\n[huge arrays] six ~0.8 MB configure frames refused: node CPU {used:.2f} s")
    assert used < 0.75, used  # ~1.5 s before: each decoded whole
    status, answer = await node.post(orjson.dumps({"tools": many_tools["tools"]}))
    assert status == 400 and "tools holds 60,000 values" in answer["error"]["message"], answer
    await client.close()


def test_the_probes_ran_on_a_node_that_logged_no_traceback(node: Node, tmp_path: Path) -> None:
    assert "Traceback" not in node.proc.log, node.proc.log[-3000:]
