"""The baseline the gateway is measured against: a minimal WebSocket relay.

Run: ``.venv/bin/python tests/bench/relay_baseline.py --upstream ws://127.0.0.1:P/v1 --port 0``
(prints ``relay listening on ws://127.0.0.1:PORT/v1/realtime``).

It does the least a relay between a client and the OpenAI Realtime wire can
do, so "gateway ÷ relay" isolates what the gateway's work costs (parsing into
events, numbering, the log, history, the per-client writer):

- per client connection it sends a ``session`` frame, and on the first user
  message opens one upstream connection (as the gateway does, lazily);
- a client ``{"type": "user", "content": …}`` becomes
  ``conversation.item.create`` + ``response.create`` upstream;
- every upstream ``response.output_text.delta`` frame is forwarded *unparsed*:
  a bytes prefix test picks it out and it is re-wrapped as
  ``{"type":"respond","seq":N,"upstream":<the raw frame>}`` (no JSON decode,
  no store, no parser); ``response.done`` becomes ``end`` + ``metric`` (the
  raw frame inside), which ends the turn for the same load-test client;
- every other upstream frame is dropped.

The ``seq`` numbering costs one ``%d`` format per frame and lets the same
client check contiguity against the relay as against the gateway.

``--passthrough``: less than any WebSocket relay can do, for
``voice_cost_bench.py``'s floor: a TCP proxy on uvloop (as the gateway runs)
whose callback writes what one socket read to the other, so the WebSocket
session is the client's with the simulator itself: one read and one write per
frame, no frame parsed, unmasked or masked.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
from typing import Final, cast
from urllib.parse import urlsplit

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

DELTA: Final = b'{"type":"response.output_text.delta"'
DONE: Final = b'{"type":"response.done"'


class _ClientFrame(msgspec.Struct):
    type: str
    content: str = ""


_decode_client: Final = msgspec.json.Decoder(_ClientFrame).decode
_encode: Final = msgspec.json.Encoder().encode
_RESPONSE_CREATE: Final = b'{"type":"response.create"}'


def _item_create(text: str) -> bytes:
    return _encode(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        }
    )


class Relay:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/") + "/realtime?model=sim"
        self._numbers = itertools.count(1)

    async def handler(self, ws: ServerConnection) -> None:
        n = next(self._numbers)
        seq = 0
        up: ClientConnection | None = None
        try:
            await ws.send(
                b'{"type":"session","session_id":"relay-%d","seq":0,"resumed":false}' % n,
                text=True,
            )
            while True:
                message = _decode_client(await ws.recv(decode=False))
                if message.type != "user":
                    continue
                if up is None:
                    up = await connect(
                        self.upstream,
                        compression=None,
                        max_size=64 * 2**20,
                        additional_headers={"Authorization": "Bearer sim"},
                        ping_interval=None,
                    )
                await up.send(_item_create(message.content), text=True)
                await up.send(_RESPONSE_CREATE, text=True)
                recv, send = up.recv, ws.send
                while True:
                    frame = await recv(decode=False)
                    if frame.startswith(DELTA):
                        seq += 1
                        await send(
                            b'{"type":"respond","seq":%d,"upstream":%b}' % (seq, frame), text=True
                        )
                    elif frame.startswith(DONE):
                        await send(b'{"type":"end","seq":%d}' % (seq + 1), text=True)
                        await send(
                            b'{"type":"metric","seq":%d,"upstream":%b}' % (seq + 2, frame),
                            text=True,
                        )
                        seq += 2
                        break
        except ConnectionClosed:
            pass
        finally:
            if up is not None:
                await up.close()


class _Pipe(asyncio.Protocol):
    """One direction of ``--passthrough``: what arrives is written to ``peer`` at once."""

    def __init__(self) -> None:
        self.peer: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None
        self.early = bytearray()  # what the client said before the upstream was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early += data
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


async def passthrough(host: str, port: int, listen_host: str, listen_port: int) -> None:
    """Bytes both ways between each client and the upstream, on uvloop (``--passthrough``)."""
    loop = asyncio.get_running_loop()

    def accepted() -> _Pipe:
        client = _Pipe()

        async def dial() -> None:
            # Not before the connect: uvloop calls ``connection_made`` after this task's
            # first step, so the client's transport is known only once the dial is back.
            try:
                transport, upstream = await loop.create_connection(_Pipe, host, port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()  # no upstream: the client is told by the close
                return
            assert client.transport is not None
            upstream.peer = client.transport
            client.peer = transport
            if client.early:
                transport.write(bytes(client.early))

        task = loop.create_task(dial())
        _DIALS.add(task)
        task.add_done_callback(_DIALS.discard)
        return client

    server = await loop.create_server(accepted, listen_host, listen_port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"relay listening on ws://{listen_host}:{bound}/v1/realtime", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


_DIALS: set[asyncio.Task[None]] = set()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="simulator base URL, ws://HOST:PORT/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--passthrough", action="store_true", help="forward every frame verbatim")
    args = parser.parse_args()
    if args.passthrough:
        where = urlsplit(args.upstream)
        await passthrough(where.hostname or "127.0.0.1", where.port or 80, args.host, args.port)
        return
    relay = Relay(args.upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve(
        relay.handler, args.host, args.port, compression=None, backlog=4096, max_size=2**20
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"relay listening on ws://{args.host}:{port}/v1/realtime", flush=True)
        await stop.wait()


if __name__ == "__main__":
    if "--passthrough" in sys.argv:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
