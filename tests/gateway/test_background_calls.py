"""Background tool calls through a running gateway, against a real HTTP endpoint on loopback.

The endpoint (``HoldingEndpoint``) takes each POST and holds it open without
answering until the gateway lets the connection go: it counts the requests
that reached it and the ones the gateway abandoned. What a user notices: a
batch starts every background call the session's limit allows and the rest
are answered at once as not started; ``cancel`` — in a turn or between
turns — and the user's speech cancel the calls still running, and say so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from protocol.events import Call, Cancelled, End, Error, Event, Execute, Metric, Result
from tests.gateway.conftest import GatewayFactory
from tests.support.client import GatewayClient
from tests.voice.conftest import VoiceClient, utterance, voice_gateway

RATE = 24000

pytestmark = pytest.mark.timeout(90)
MEMORY = pytest.mark.parametrize("store_kind", ["memory"], indirect=True)


class HoldingEndpoint:
    """An HTTP tool endpoint that never answers: each request stays open until dropped."""

    def __init__(self) -> None:
        self.arrived = 0
        self.dropped = 0
        self.changed = asyncio.Condition()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/hold"

    def tools_file(self, path: Path) -> str:
        path.write_text(
            "[builtin]\nenable = []\n\n[http.hold]\n"
            f'url = "{self.url}"\n'
            'description = "Hold on."\n'
            'parameters = { type = "object", properties = { n = { type = "number" } } }\n'
            "timeout = 120\nbackground = true\n"
        )
        return str(path)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # one request per connection: it is never answered
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                json.loads(await reader.readexactly(length))
                await self._count(arrived=1)
                await reader.read()  # until the gateway closes the connection
                await self._count(dropped=1)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _count(self, *, arrived: int = 0, dropped: int = 0) -> None:
        async with self.changed:
            self.arrived += arrived
            self.dropped += dropped
            self.changed.notify_all()

    async def wait(self, *, arrived: int = 0, dropped: int = 0, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: self.arrived >= arrived and self.dropped >= dropped)

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[HoldingEndpoint]:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        async with self._server:
            yield self


def batch(count: int) -> str:
    calls = ", ".join(f'{{"name": "hold", "args": {{"n": {n}}}}}' for n in range(count))
    return f"/raw <execute>[{calls}]</execute>"


def outcome(result: Result) -> dict[str, str]:
    [one] = orjson.loads(result.content)
    return {"status": one["status"], "content": str(one["content"])}


@MEMORY
async def test_a_batch_past_the_limit_starts_what_it_may_and_cancel_between_turns_stops_them(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    async with HoldingEndpoint().serving() as endpoint:
        tools = endpoint.tools_file(tmp_path / "tools.toml")
        async with gateway_factory(tools_file=tools) as gw:
            client = await GatewayClient.connect(gw.url)
            await client.user(batch(200))
            first = await client.until(lambda e: isinstance(e, End), timeout=60)
            await client.next()  # its metric
            calls = [e for e in first if isinstance(e, Call)]
            assert len(calls) == 200 and all(c.background is True for c in calls)
            refused = [e for e in first if isinstance(e, Result)]
            # The session's limit (64) started; the other 136 were answered at once.
            assert len(refused) == 136
            assert {r.id for r in refused} == {c.id for c in calls[64:]}
            assert all(outcome(r)["status"] == "failure" for r in refused)
            assert "at most 64 background calls" in outcome(refused[0])["content"]
            await endpoint.wait(arrived=64)
            assert endpoint.arrived == 64 and endpoint.dropped == 0

            # Between turns, a cancel cancels the 64 still running, and says so.
            await client.send({"type": "cancel"})
            got = await client.until(lambda e: isinstance(e, Metric), timeout=30)
            results = [e for e in got if isinstance(e, Result)]
            assert {r.id for r in results} == {c.id for c in calls[:64]}
            assert all(outcome(r) == {"status": "failure", "content": "cancelled by the user"}
                       for r in results)  # fmt: skip
            [cancelled] = [e for e in got if isinstance(e, Cancelled)]
            assert "64 background calls" in cancelled.content
            assert not any(isinstance(e, Error) for e in got)
            await endpoint.wait(dropped=64)
            # Nothing runs any more: the next cancel is the usual no_turn.
            await client.send({"type": "cancel"})
            [*_, reply] = await client.until(lambda e: isinstance(e, Error), timeout=30)
            assert isinstance(reply, Error) and reply.code == "no_turn"
            await client.close()


@MEMORY
async def test_two_sessions_background_calls_all_reach_the_endpoint(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    # 128 calls at once from one node: past the HTTP client's former pool of 100.
    async with HoldingEndpoint().serving() as endpoint:
        tools = endpoint.tools_file(tmp_path / "tools.toml")
        async with gateway_factory(tools_file=tools) as gw:
            clients = [await GatewayClient.connect(gw.url) for _ in range(2)]
            for client in clients:
                await client.user(batch(64))
                await client.until(lambda e: isinstance(e, End), timeout=60)
            await endpoint.wait(arrived=128, timeout=10)  # at once, none queued
            for client in clients:
                await client.send({"type": "cancel"})
                await client.until(lambda e: isinstance(e, Cancelled), timeout=30)
            await endpoint.wait(dropped=128)
            for client in clients:
                await client.close()


@MEMORY
async def test_cancel_in_a_turn_cancels_its_background_calls(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    async with HoldingEndpoint().serving() as endpoint:
        tools = endpoint.tools_file(tmp_path / "tools.toml")
        async with gateway_factory(tools_file=tools, sim_tokens_per_second=5) as gw:
            client = await GatewayClient.connect(gw.url)
            await client.user(batch(2))
            await client.until(lambda e: isinstance(e, Execute), timeout=30)
            await endpoint.wait(arrived=2)
            await client.send({"type": "cancel"})  # the next step streams slowly: a turn runs
            got = await client.until(lambda e: isinstance(e, Cancelled), timeout=30)
            results = [e for e in got if isinstance(e, Result)]
            assert len(results) == 2 and all(outcome(r)["status"] == "failure" for r in results)
            await endpoint.wait(dropped=2)
            await client.close()


async def test_the_users_speech_cancels_the_background_calls(tmp_path: Path) -> None:
    async with HoldingEndpoint().serving() as endpoint:
        settings = {"tools_file": endpoint.tools_file(tmp_path / "tools.toml")}
        async with voice_gateway(
            "openai", tmp_path, gateway_settings=settings, tokens_per_second=5, chunk_size=2
        ) as gw:
            client = await VoiceClient.connect(gw.url)
            await client.configure(input_audio={"rate": RATE})
            await client.send({"type": "user", "content": batch(2)})
            await client.until("execute")
            await endpoint.wait(arrived=2)
            # The next step streams (slowly): the user speaks over it.
            await client.stream(utterance(0.5, RATE), RATE)
            cut: list[Event] = await client.until("cancelled")
            cancelled = cut[-1]
            assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
            results = [e for e in cut if isinstance(e, Result)]
            assert len(results) == 2 and all(outcome(r)["status"] == "failure" for r in results)
            await endpoint.wait(dropped=2)
            await client.close()
