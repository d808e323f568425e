"""The websockets internals ``gateway.upstream.wsnow`` relies on are still there and still work."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve

from gateway.upstream.wsnow import can_write_now, write_text_now


def test_the_internals_exist() -> None:
    assert callable(getattr(Connection, "send_data", None))
    probe = Connection.__init__.__code__.co_names
    assert "paused" in probe and "send_in_progress" in probe


@pytest.mark.timeout(20)
async def test_frames_written_now_arrive_in_order_and_a_closed_socket_is_refused() -> None:
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, str)
            got.append(frame)
            if len(got) == 3:
                done.set()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            for i in range(3):
                assert can_write_now(client)
                write_text_now(client, b'{"n":%d}' % i)
            await done.wait()
        assert not can_write_now(client)  # closed: the caller must await send (and see why)
    assert got == ['{"n":0}', '{"n":1}', '{"n":2}']


@pytest.mark.timeout(20)
async def test_frames_of_every_length_class_arrive_whole_through_a_real_server() -> None:
    """The client frames (masked) written by ``write_text_now`` are valid RFC 6455 frames."""
    sizes = [0, 1, 125, 126, 127, 65_535, 65_536, 70_000]
    texts = ["é" * (n // 2) + "x" * (n % 2) for n in sizes]  # n bytes of UTF-8 each
    got: list[str] = []
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:  # websockets checks the mask bit and the UTF-8
            assert isinstance(frame, str)
            got.append(frame)
            if len(got) == len(texts):
                done.set()

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as client:
            for text in texts:
                assert can_write_now(client)
                write_text_now(client, text.encode())
            await done.wait()
    assert got == texts
