"""A WebRTC call as the socket of a client connection: its data channel and its tracks.

A call is served as the door serves a WebSocket client (``CallConnection``,
a ``DoorConnection``), with ``CallSocket`` in the place of the WebSocket: the
``oai-events`` data channel carries the door's events both ways (one JSON
text message each), the microphone track is read as PCM, and the model's
speech goes out on the answering track (``Speaker``).

The edge reads a few things of a client's socket, and ``CallSocket`` answers
them as a WebSocket would: ``transport`` (the call's address for the origin
check; the channel's unsent bytes for the slow-client reaper; ``abort``),
``state`` and ``protocol.state`` (the rights watch, the reaper), ``paused``
and ``send_in_progress`` (``wsfast.can_write_now``: may the connection write
without awaiting; not while the channel's unsent bytes are past the mark), ``close``,
``close_timeout``, ``wait_closed`` (the edge frees the connection's slots
there), ``recv`` and async iteration (the client's events). A close code
has no place in WebRTC: a close other than a normal one is told on the
channel as an ``error`` event (code ``session_closed_CODE``, the reason as
its message), then the peer connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import msgspec
from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack
from websockets.exceptions import ConnectionClosedOK
from websockets.protocol import State

from gateway.webrtc.media import Speaker, microphone

__all__ = ["CHANNEL", "CallSocket"]

CHANNEL: Final = "oai-events"
# The channel's unsent bytes past which a write waits (and the connection falls back
# to reading its events from the log), as a WebSocket's write buffer does.
HIGH_WATER: Final = 1 << 20
LOW_WATER: Final = 1 << 18


def _error(code: str, message: str) -> str:
    event = {
        "type": "error",
        "event_id": "evt_x0",
        "error": {"type": "invalid_request_error", "code": code, "message": message},
    }
    return msgspec.json.encode(event).decode()


class _Transport:
    """What the edge asks of a connection's transport."""

    def __init__(self, call: CallSocket, sockname: object) -> None:
        self._call = call
        self._sockname = sockname

    def get_extra_info(self, name: str, default: object = None) -> object:
        # The address the offer arrived on: the origin check's "the node's own page".
        return self._sockname if name == "sockname" else default

    def is_closing(self) -> bool:
        return self._call.closed

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return LOW_WATER, HIGH_WATER

    def get_write_buffer_size(self) -> int:
        return self._call.unsent

    def abort(self) -> None:
        self._call.abort()


class CallSocket:
    """One call's data channel and tracks, as a client connection's socket."""

    close_timeout: Final = 2.0

    def __init__(self, call_id: str, max_frame: int, sockname: object = None) -> None:
        self.call_id = call_id
        self.max_frame = max_frame
        self.transport = _Transport(self, sockname)
        self.protocol = self  # ``ws.protocol.state``, as the rights watch reads it
        self.pc: RTCPeerConnection | None = None
        self.speaker = Speaker()
        self.channel: Any = None
        self.opened = asyncio.Event()
        self.closed = False
        loop = asyncio.get_running_loop()
        # The session the call's connection serves (set as it is made; "" if it never is).
        self.joined: asyncio.Future[str] = loop.create_future()
        self._mic: asyncio.Future[MediaStreamTrack] = loop.create_future()
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._ended = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closing: asyncio.Task[None] | None = None

    def attach(self, pc: RTCPeerConnection) -> None:
        """The peer connection whose channel and tracks this socket is."""
        self.pc = pc
        pc.on("datachannel", self._channel)
        pc.on("track", self._track)
        pc.on("connectionstatechange", self._connection_changed)

    # ------------------------------------------------------------- the peer's side

    def _channel(self, channel: Any) -> None:
        if channel.label != CHANNEL or self.channel is not None:
            channel.close()  # one events channel per call, named as OpenAI names it
            return
        self.channel = channel
        channel.bufferedAmountLowThreshold = LOW_WATER
        channel.on("message", self._message)
        channel.on("close", self._ended_by_peer)
        channel.on("bufferedamountlow", self._drained.set)
        self.opened.set()

    def _message(self, message: str | bytes) -> None:
        if len(message) > self.max_frame:  # before any work is done for it
            self.channel.send(
                _error(
                    "message_too_big",
                    f"a data-channel message takes at most {self.max_frame} bytes; "
                    "send audio on the track, not as appends",
                )
            )
            return
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        self._inbox.put_nowait(message)

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and not self._mic.done():
            self._mic.set_result(track)

    async def _connection_changed(self) -> None:
        if self.pc is not None and self.pc.connectionState in ("failed", "closed"):
            self._ended_by_peer()

    def _ended_by_peer(self) -> None:
        self._inbox.put_nowait(None)
        self._end()

    def _end(self) -> None:
        self.closed = True
        self._drained.set()
        self._ended.set()
        if not self.joined.done():
            self.joined.set_result("")

    # ------------------------------------------------------------- the connection's side

    @property
    def state(self) -> State:
        return State.CLOSED if self.closed else State.OPEN

    @property
    def _state(self) -> State:
        """What ``wsfast.can_write_now`` reads (websockets' ``Protocol._state``, the
        attribute behind ``state``: one Python call fewer per audio frame there)."""
        return self.state

    @property
    def unsent(self) -> int:
        channel = self.channel
        return int(channel.bufferedAmount) if channel is not None else 0

    def push(self, text: str) -> None:
        """A message as if the client sent it (a multipart offer's ``session``)."""
        self._inbox.put_nowait(text)

    @property
    def paused(self) -> bool:
        """Not open yet, or the channel's unsent bytes past the high-water mark."""
        channel = self.channel
        return (
            channel is None or channel.readyState != "open" or channel.bufferedAmount >= HIGH_WATER
        )

    send_in_progress: Final = None  # messages are whole: never one half sent

    def send_now(self, frames: list[bytes]) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        for frame in frames:
            channel.send(frame.decode())

    async def send(self, frames: list[bytes]) -> None:
        """Send once the channel is open; wait while its unsent bytes are past the mark."""
        if self.channel is None:
            opened = asyncio.ensure_future(self.opened.wait())
            ended = asyncio.ensure_future(self._ended.wait())
            try:
                await asyncio.wait((opened, ended), return_when=asyncio.FIRST_COMPLETED)
            finally:
                opened.cancel()
                ended.cancel()
        self.send_now(frames)
        if not self.closed and self.unsent >= HIGH_WATER:
            self._drained.clear()
            await self._drained.wait()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[str]:
        while (message := await self._inbox.get()) is not None:
            yield message
        self._inbox.put_nowait(None)  # the end, for whoever reads next

    async def recv(self, decode: bool | None = None) -> str | bytes:
        """The next message, as websockets' ``recv`` gives it: ``decode=False``, its UTF-8
        bytes (the door decodes its JSON from bytes)."""
        message = await self._inbox.get()
        if message is None:
            self._inbox.put_nowait(None)
            raise ConnectionClosedOK(None, None)
        return message.encode() if decode is False else message

    async def microphone(self) -> AsyncIterator[bytes]:
        """The user's audio at 48 kHz, frame by frame, until the track ends."""
        async for pcm in microphone(await self._mic):
            yield pcm

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        channel = self.channel
        self._inbox.put_nowait(None)
        self._end()
        if code != 1000 and channel is not None and channel.readyState == "open":
            channel.send(_error(f"session_closed_{code}", reason or "the call was closed"))
            # aiortc hands the message to SCTP on a later turn of the loop, and closing
            # the peer connection first would drop it: wait until it left (or a moment).
            if channel.bufferedAmount:
                channel.bufferedAmountLowThreshold = 0
                self._drained.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.close_timeout):
                        await self._drained.wait()
        if self.pc is not None:
            await self.pc.close()

    def abort(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self.close())

    async def wait_closed(self) -> None:
        await self._ended.wait()
        if self._closing is not None:
            with contextlib.suppress(Exception):
                await self._closing
