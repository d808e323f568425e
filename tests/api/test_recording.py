"""The flight recorder through the HTTP API: a recorded session exported, paged, deleted.

Real gateways (memory store and Redis), the product's client over real
WebSockets, the simulator upstream; what a user does: configure
``record: true``, run a tool call and a cancelled turn, export the recording
with ``GET /v1/sessions/ID/recording`` (and ``gateway recording get``), delete
the session.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import msgspec
import pytest

from gateway.cli import main
from gateway.client import Client, ConfigureRefused
from gateway.client.recording import RecordingError, fetch_recording
from gateway.edge import api as api_module
from protocol.events import Call, Cancelled, Configured, Metric, Result, User, decode_event
from protocol.recording import (
    ClientCommand,
    Connected,
    Cut,
    Header,
    Logged,
    ToolRun,
    UpstreamFrame,
    encode_record,
)
from tests.api.conftest import Api, Keys, NodesFactory
from tests.support.recorded import TOOL_TURN, record_session, recording_of, records

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_recorded_session_holds_frames_commands_tools_and_events(
    nodes: NodesFactory, keys: Keys
) -> None:
    alice = keys.keys["alice"]
    async with nodes(1, sim_tokens_per_second=400, sim_api_key="sim-upstream-key-0123") as (gw,):
        sid = await record_session(gw.url, alice)
        data = await recording_of(gw, sid, alice)
    found = records(data)
    header = found[0]
    assert isinstance(header, Header) and header.session_id == sid
    assert header.provider == "sim" and header.audio == "user"
    stamps = [r.t for r in found]
    assert stamps == sorted(stamps)  # one node: monotonic

    # The upstream connection and its frames, both ways, as on the wire.
    assert any(isinstance(r, Connected) and r.provider == "sim" for r in found)
    frames = [r for r in found if isinstance(r, UpstreamFrame)]
    sent = [msgspec.json.decode(f.frame)["type"] for f in frames if f.dir == "out"]
    got = [msgspec.json.decode(f.frame)["type"] for f in frames if f.dir == "in"]
    assert "session.update" in sent and "response.create" in sent and "response.cancel" in sent
    assert "response.output_text.delta" in got and "response.done" in got
    # Each frame once, whether the read callback took it (a delta) or ``recv`` did.
    ids = [msgspec.json.decode(f.frame).get("event_id") for f in frames if f.dir == "in"]
    assert len(ids) == len(set(ids))

    # The client's commands, in order, with what they found delivered.
    commands = [msgspec.json.decode(r.message) for r in found if isinstance(r, ClientCommand)]
    assert [c["type"] for c in commands] == ["configure", "user", "user", "cancel", "user"]
    assert commands[1]["content"] == TOOL_TURN

    # The tool call: its arguments, outcome and duration.
    (tool,) = [r for r in found if isinstance(r, ToolRun)]
    assert tool.name == "list" and msgspec.json.decode(tool.args) == {"path": "."}
    assert tool.status == "success" and 0 < tool.duration_ms < 60_000, tool

    # Every event the clients got, the configuration's change among them.
    events = [decode_event(r.event) for r in found if isinstance(r, Logged)]
    assert isinstance(events[0], Configured) and events[0].config.record
    assert [type(e) for e in events if isinstance(e, User | Call | Result | Cancelled)] == [
        User,
        Call,
        Result,
        User,
        Cancelled,
        User,
    ]
    seqs = [e.seq for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # none missing

    # No secret: not the client's API key, not the upstream's.
    assert alice.encode() not in data and b"sim-upstream-key-0123" not in data
    assert b"Authorization" not in data and b"Bearer" not in data


async def test_export_pages_by_bytes_and_the_cli_writes_the_file(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    alice = keys.keys["alice"]
    async with nodes(1) as (gw,):
        sid = await record_session(gw.url, alice)
        whole = await recording_of(gw, sid, alice)
        api = Api(gw, http)
        # Pages end on whole lines, and follow each other to the end.
        base = gw.api_url + f"/v1/sessions/{sid}/recording"
        headers = keys.bearer("alice")
        async with http.get(base, headers=headers) as r:
            assert r.status == 200 and r.content_type == "application/x-ndjson"
            first = await r.read()
            assert r.headers["X-Has-More"] == "false"
            assert int(r.headers["X-Next-Offset"]) == len(whole)
        assert first == whole and first.endswith(b"\n")
        # From where a line starts, the rest; from inside a line, no page but what to do.
        middle = whole.index(b"\n", len(whole) // 2) + 1
        async with http.get(base, params={"offset": str(middle)}, headers=headers) as r:
            assert r.status == 200
            rest = await r.read()
        assert whole[middle:] == rest
        path = f"/v1/sessions/{sid}/recording?offset={middle + 1}"
        status, body = await api.call("GET", path, key=alice)
        assert status == 400 and body["error"]["message"] == (
            f"offset {middle + 1} is inside a line of the recording, not where one starts: "
            "start at 0, then at each page's X-Next-Offset"
        )

        # Another key's session, and a session that does not record, are refused.
        assert (await api.call("GET", f"/v1/sessions/{sid}/recording", key=keys.keys["bob"]))[
            0
        ] == 403
        status, plain = await api.call("POST", "/v1/sessions", key=alice)
        status, body = await api.call(
            "GET", f"/v1/sessions/{plain['session_id']}/recording", key=alice
        )
        assert status == 404 and "record" in body["error"]["message"]

        out = tmp_path / "session.jsonl"
        code = await _cli(
            ["recording", "get", "-o", str(out), "--api", gw.api_url, "--token", alice, "--", sid]
        )
        assert code == 0 and out.read_bytes() == whole


async def test_a_recording_past_one_page_is_read_by_its_links_and_whole_by_the_cli(
    nodes: NodesFactory,
    keys: Keys,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_module, "PAGE_BYTES", 2048)  # pages of 2 KiB, not 1 MiB
    alice = keys.keys["alice"]
    headers = keys.bearer("alice")
    async with nodes(1) as (gw,):
        sid = await record_session(gw.url, alice)
        await recording_of(gw, sid, alice)  # its last lines written
        whole, size = await gw.node.store.read_recording(sid, 0, 1 << 24)
        assert size == len(whole) > 4 * 2048
        pages: list[bytes] = []
        url, offset = f"{gw.api_url}/v1/sessions/{sid}/recording", 0
        while True:
            async with http.get(url, headers=headers) as r:
                assert r.status == 200
                page = await r.read()
                pages.append(page)
                # Whole lines (or one longer line alone), and where the next one starts.
                assert page.endswith(b"\n")
                assert 0 < len(page) <= 2048 or page.count(b"\n") == 1
                offset += len(page)
                assert int(r.headers["X-Next-Offset"]) == offset
                if r.headers["X-Has-More"] == "false":
                    assert "Link" not in r.headers
                    break
                assert r.headers["X-Has-More"] == "true"
                link = re.fullmatch(r'<(/v1/sessions/[^>]+)>; rel="next"', r.headers["Link"])
                assert link is not None, r.headers["Link"]
                url = gw.api_url + link.group(1)
        assert len(pages) >= 4 and b"".join(pages) == whole
        assert offset == size

        out = tmp_path / "session.jsonl"
        code = await _cli(
            ["recording", "get", "-o", str(out), "--api", gw.api_url, "--token", alice, "--", sid]
        )
        assert code == 0 and out.read_bytes() == whole


async def test_a_bad_offset_is_refused_and_the_end_is_an_empty_last_page(
    nodes: NodesFactory, keys: Keys, http: aiohttp.ClientSession
) -> None:
    alice = keys.keys["alice"]
    async with nodes(1) as (gw,):
        sid = await record_session(gw.url, alice)
        api = Api(gw, http)
        path = f"/v1/sessions/{sid}/recording"
        for bad in ("-1", "abc", "1e3", "", " 7", str(2**40 + 1), "9" * 30):
            status, body = await api.call("GET", f"{path}?offset={bad}", key=alice)
            assert status == 400, (bad, status, body)
            assert body["error"]["message"].endswith(
                "is not valid: give a whole number from 0 to 1099511627776"
            ), body
        _, size = await gw.node.store.read_recording(sid, 0, 1 << 24)
        async with http.get(
            gw.api_url + path, params={"offset": str(size)}, headers=keys.bearer("alice")
        ) as r:
            assert r.status == 200 and await r.read() == b""
            assert r.headers["X-Next-Offset"] == str(size)
            assert r.headers["X-Has-More"] == "false" and "Link" not in r.headers
        # Past the end is no offset any page gave: refused, not an empty page.
        status, body = await api.call("GET", f"{path}?offset={size + 10}", key=alice)
        assert status == 400 and body["error"]["message"] == (
            f"offset {size + 10} is past the end of the recording ({size:,} bytes): "
            "start at 0, then at each page's X-Next-Offset"
        )


async def test_a_line_longer_than_a_page_comes_whole_on_its_own_page(
    nodes: NodesFactory,
    keys: Keys,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found from outside: a page of part of a long line, and ``?offset=N`` inside a line,
    started mid-record (and mid-character: ``é`` is two bytes); every page now reads on
    its own, as JSON Lines of whole characters."""
    monkeypatch.setattr(api_module, "PAGE_BYTES", 2048)
    alice = keys.keys["alice"]
    async with nodes(1) as (gw,):
        async with Client(gw.url, token=alice) as client:
            sid = client.session_id
            await client.configure(record=True)
            async for _ in client.send("long " + "é" * 3000):  # a 6 KB line, or more
                pass
        whole = await recording_of(gw, sid, alice)
        url, pages = f"{gw.api_url}/v1/sessions/{sid}/recording", []
        while True:
            async with http.get(url, headers=keys.bearer("alice")) as r:
                assert r.status == 200
                page = await r.read()
            pages.append(page)
            assert page.endswith(b"\n")
            for line in page.decode().splitlines():  # whole characters, whole records
                msgspec.json.decode(line)
            if r.headers["X-Has-More"] == "false":
                break
            url = gw.api_url + r.headers["Link"][1 : r.headers["Link"].index(">")]
        long_pages = [p for p in pages if len(p) > 2048]
        assert long_pages and all(p.count(b"\n") == 1 for p in long_pages)
        assert b"".join(pages) == whole
        # An offset inside the long line, where a page once began, is refused.
        inside = whole.index("é".encode()) + 1
        status, body = await Api(gw, http).call(
            "GET", f"/v1/sessions/{sid}/recording?offset={inside}", key=alice
        )
        assert status == 400 and "inside a line" in body["error"]["message"]
        out = tmp_path / "session.jsonl"
        code = await _cli(
            ["recording", "get", "-o", str(out), "--api", gw.api_url, "--token", alice, "--", sid]
        )
        assert code == 0 and out.read_bytes() == whole


async def _cli(argv: list[str]) -> int:
    """``gateway`` in this process, off the loop (it runs its own)."""
    return await asyncio.to_thread(main, argv)


async def test_a_deleted_sessions_recording_is_gone(nodes: NodesFactory, keys: Keys) -> None:
    alice = keys.keys["alice"]
    async with nodes(1) as (gw,):
        sid = await record_session(gw.url, alice)
        assert await recording_of(gw, sid, alice)
        async with aiohttp.ClientSession() as http:
            status, _ = await Api(gw, http).call("DELETE", f"/v1/sessions/{sid}", key=alice)
        assert status == 204
        with pytest.raises(RecordingError, match="404"):
            await fetch_recording(gw.api_url, sid, token=alice)
        assert await gw.node.store.read_recording(sid, 0, 1 << 20) == (b"", 0)


async def test_a_recording_stops_at_its_limit_with_a_cut_record(
    nodes: NodesFactory, keys: Keys
) -> None:
    alice = keys.keys["alice"]
    async with nodes(1, record=True, record_max_bytes=8192) as (gw,):
        async with Client(gw.url, token=alice) as client:  # --record: no configure needed
            sid = client.session_id
            for _ in range(3):
                answer = [e async for e in client.send("/long 3")]
                assert isinstance(answer[-1], Metric)  # the session goes on past the cut
        data = await recording_of(gw, sid, alice)
    found = records(data)
    assert isinstance(found[0], Header)
    assert isinstance(found[-1], Cut) and found[-1].limit == 8192
    assert len(data) <= 8192 + len(encode_record(found[-1]))


async def test_key_policies_record_their_keys_sessions_or_none(
    nodes: NodesFactory, keys: Keys, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[alice]\nrecord = true\n\n[bob]\nrecord = false\n")
    alice, bob = keys.keys["alice"], keys.keys["bob"]
    async with nodes(1, record=True, key_policy_file=str(policy)) as (gw,):
        async with Client(gw.url, token=alice) as client:
            sid = client.session_id
            async for _ in client.send("hello"):
                pass
        assert records(await recording_of(gw, sid, alice))
        async with Client(gw.url, token=bob) as client:
            with pytest.raises(ConfigureRefused, match="record = false"):
                await client.configure(record=True)
            async for _ in client.send("hello"):
                pass
            sid = client.session_id
        with pytest.raises(RecordingError, match="not recorded"):
            await recording_of(gw, sid, bob)
