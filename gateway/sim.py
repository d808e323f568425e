"""The simulator: a deterministic "model" behind the OpenAI Realtime (GA) wire protocol.

It serves ``/v1/realtime`` the way the real API does, so the adapter is tested
end to end over real sockets and the official ``openai`` SDK can connect to it
(``AsyncOpenAI(websocket_base_url=sim.url)``). Frames are the Structs of
``gateway.upstream.openai_wire``: one definition of the wire for both sides.

The model (``sim_reply``) speaks the seed's text protocol, driven by the last
user message:

- ``/tool NAME {JSON args}`` → a think, then one call of NAME in an
  ``<execute>`` block, then (knob ``overrun``) text a real model might write
  past ``</execute>``, which the gateway must discard. Args are copied
  verbatim, so tests can make malformed calls.
- a message starting with ``<results>`` → a think, then ``The tool returned
  STATUS.`` quoting the first result's status, then ``<end>``.
- ``/raw TEXT`` → exactly TEXT (scripted output, markers and all).
- anything else → a think, then ``Echo: MESSAGE``, then ``<end>``.

Knobs (``SimConfig``) shape timing and faults for load and failure tests:
tokens per second, chunk size, first-token delay, dropping the TCP connection
after N deltas, and an API key to enforce.

Cost per connection is one handler task (the reader) plus, while a response
runs, one generator task; there is no task or timer per token beyond the one
sleep that paces it, and pacing is computed from the response's start time so
it does not drift under load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

import msgspec
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.upstream import openai_wire as wire

__all__ = [
    "Sim",
    "SimConfig",
    "SimConversation",
    "SimItem",
    "SimStats",
    "add_sim_arguments",
    "run_sim",
    "serve_sim",
    "sim_config_from_args",
    "sim_reply",
]

log = logging.getLogger(__name__)

PATH: Final = "/v1/realtime"
DEFAULT_MODEL: Final = "gpt-realtime"

_MAX_FRAME: Final = 16 * 2**20
_BACKLOG: Final = 4096
# A response that sends without sleeping (unpaced, or behind its schedule)
# yields to the event loop every this many deltas.
_YIELD_EVERY: Final = 4


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The simulator's knobs.

    - ``tokens_per_second``: deltas per second per response; 0 = as fast as
      possible (still yielding to the event loop every few deltas).
    - ``chunk_size``: characters per ``response.output_text.delta``.
    - ``first_token_delay``: seconds between ``response.create`` and the first delta.
    - ``drop_after``: abort the TCP connection (no close frame) once this many
      deltas were sent on it; ``None`` never.
    - ``overrun``: after a tool call, keep writing past ``</execute>`` as real
      models do.
    - ``api_key``: when set, handshakes without ``Authorization: Bearer <key>``
      get HTTP 401.
    """

    tokens_per_second: float = 0.0
    chunk_size: int = 4
    first_token_delay: float = 0.0
    drop_after: int | None = None
    overrun: bool = True
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.tokens_per_second < 0:
            raise ValueError("tokens_per_second must be >= 0 (0 = as fast as possible)")
        if self.chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if self.first_token_delay < 0:
            raise ValueError("first_token_delay must be >= 0")
        if self.drop_after is not None and self.drop_after < 0:
            raise ValueError("drop_after must be >= 0 (or None to never drop)")


# --- the model ----------------------------------------------------------------------


def sim_reply(message: str, *, overrun: bool = True) -> str:
    """The simulated model's whole output for the last user ``message``."""
    if message.startswith("/raw"):
        rest = message[4:]
        if not rest or rest[0] == " ":
            return rest[1:]
    if message.startswith("/tool"):
        parts = message[5:].split(None, 1)
        if parts and message[5:6].isspace():
            return _tool_reply(parts[0], parts[1].strip() if len(parts) > 1 else "{}", overrun)
    if message.lstrip().startswith("<results>"):
        return f"<think>The tool answered.</think>{_results_reply(message)}<end>"
    return f"<think>The user said something.</think>Echo: {message}<end>"


def _tool_reply(name: str, args: str, overrun: bool) -> str:
    quoted = msgspec.json.encode(name).decode()
    text = (
        f"<think>I should call {name}.</think>\n"
        f'<execute>\n[{{"name": {quoted}, "args": {args}}}]\n</execute>'
    )
    if overrun:
        text += (
            f'\n\n<results>\n[{{"tool": {quoted}, "status": "success", '
            f'"content": "hallucinated"}}]\n</results>\n\nThe tool succeeded (I made that up).'
        )
    return text


def _results_reply(message: str) -> str:
    start = message.find("<results>") + len("<results>")
    end = message.rfind("</results>")
    body = message[start:end] if end >= start else message[start:]
    try:
        results = msgspec.json.decode(body.strip())
    except msgspec.DecodeError:
        return "The results were unreadable."
    if isinstance(results, list) and results and isinstance(results[0], dict):
        status = results[0].get("status")
        if isinstance(status, str):
            return f"The tool returned {status}."
    return "The results were unreadable."


# --- state and snapshots --------------------------------------------------------------


class SimItem(msgspec.Struct, frozen=True):
    """One conversation item as the simulator holds it (for tests)."""

    id: str
    role: str
    text: str
    status: str = "completed"


class SimConversation(msgspec.Struct, frozen=True):
    """A snapshot of one connection's conversation (for tests)."""

    instructions: str
    items: list[SimItem]

    def messages(self) -> list[tuple[str, str]]:
        """``(role, text)`` of every item, in conversation order."""
        return [(item.role, item.text) for item in self.items]


class SimStats(msgspec.Struct):
    """Counters over the simulator's lifetime (cheap; for load tests and logs)."""

    connections: int = 0
    connections_total: int = 0
    responses_total: int = 0
    deltas_total: int = 0


class _Item:
    __slots__ = ("id", "role", "status", "text")

    def __init__(self, item_id: str, role: str, text: str, status: str) -> None:
        self.id = item_id
        self.role = role
        self.text = text
        self.status = status


class _Response:
    __slots__ = ("deltas", "finishing", "id", "input_tokens", "item", "sent", "task", "text")

    def __init__(self, response_id: str, item: _Item, text: str, input_tokens: int) -> None:
        self.id = response_id
        self.item = item
        self.text = text
        self.input_tokens = input_tokens
        self.sent = 0  # characters of ``text`` sent as deltas
        self.deltas = 0
        self.finishing = False
        self.task: asyncio.Task[None] | None = None


_CONTENT_TYPES: Final[dict[str, frozenset[str]]] = {
    "user": frozenset({"input_text"}),
    "system": frozenset({"input_text"}),
    "assistant": frozenset({"output_text"}),
}


class _Probe(msgspec.Struct):
    type: object = None
    event_id: object = None


_probe_decoder: Final = msgspec.json.Decoder(_Probe)
_CLIENT_TYPES: Final = frozenset(
    {
        "session.update",
        "conversation.item.create",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
    }
)


class _Connection:
    """One client connection: its conversation, and at most one running response."""

    __slots__ = (
        "_event_ids",
        "_ids",
        "deltas_sent",
        "items",
        "no",
        "response",
        "session",
        "sim",
        "ws",
    )

    def __init__(self, sim: Sim, ws: ServerConnection, no: int, model: str) -> None:
        self.sim = sim
        self.ws = ws
        self.no = no
        self.items: dict[str, _Item] = {}
        self.session = wire.Session(
            type="realtime",
            id=f"sess_sim{no}",
            object="realtime.session",
            model=model,
            instructions="",
            output_modalities=["audio"],
            max_output_tokens="inf",
        )
        self.response: _Response | None = None
        self.deltas_sent = 0
        self._event_ids = itertools.count(1)
        self._ids = itertools.count(1)

    # --- plumbing -----------------------------------------------------------------

    def _eid(self) -> str:
        return f"event_{self.no}_{next(self._event_ids)}"

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_sim{self.no}_{next(self._ids)}"

    async def _send(self, event: wire.ServerEvent) -> None:
        await self.ws.send(wire.encode(event), text=True)

    async def _error(
        self,
        message: str,
        *,
        code: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        detail = wire.ErrorDetail(
            type=kind, message=message, code=code, param=param, event_id=event_id
        )
        await self._send(wire.ErrorEvent(event_id=self._eid(), error=detail))

    def snapshot(self) -> SimConversation:
        items = [SimItem(i.id, i.role, i.text, i.status) for i in self.items.values()]
        return SimConversation(instructions=self.session.instructions or "", items=items)

    # --- the connection's life ----------------------------------------------------

    async def run(self) -> None:
        try:
            await self._send(wire.SessionCreated(event_id=self._eid(), session=self.session))
            while True:
                data = await self.ws.recv(decode=False)
                await self._dispatch(data)
        except ConnectionClosed:
            pass

    async def stop(self) -> None:
        response, self.response = self.response, None
        if response is not None and response.task is not None and not response.task.done():
            response.task.cancel()
            await asyncio.wait([response.task])

    async def _dispatch(self, data: bytes) -> None:
        try:
            event = wire.decode_client_event(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._bad_frame(data, exc)
            return
        if isinstance(event, wire.ConversationItemCreate):
            await self._item_create(event)
        elif isinstance(event, wire.ResponseCreate):
            await self._response_create(event)
        elif isinstance(event, wire.ResponseCancel):
            await self._response_cancel(event)
        elif isinstance(event, wire.ConversationItemDelete):
            await self._item_delete(event)
        else:
            await self._session_update(event)

    async def _bad_frame(self, data: bytes, exc: Exception) -> None:
        try:
            probe = _probe_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            await self._error(
                f"The server could not parse the frame as a JSON object: {exc}",
                code="invalid_json",
            )
            return
        event_id = probe.event_id if isinstance(probe.event_id, str) else None
        if probe.type not in _CLIENT_TYPES:
            await self._error(
                f"Invalid value: {probe.type!r}. Supported values are: "
                + ", ".join(sorted(_CLIENT_TYPES))
                + " (the simulator supports text conversations only).",
                code="invalid_value",
                param="type",
                event_id=event_id,
            )
            return
        await self._error(
            f"Invalid {probe.type} event: {exc}",
            code="invalid_value",
            event_id=event_id,
        )

    # --- client events ------------------------------------------------------------

    async def _session_update(self, event: wire.SessionUpdate) -> None:
        update = event.session
        if update.type != "realtime":
            await self._error(
                f"Invalid value: {update.type!r}. The simulator supports 'realtime' sessions.",
                code="invalid_value",
                param="session.type",
                event_id=event.event_id,
            )
            return
        changes: dict[str, object] = {}
        for name in ("model", "instructions", "output_modalities", "max_output_tokens"):
            value = getattr(update, name)
            if value is not None:
                changes[name] = value
        self.session = msgspec.structs.replace(self.session, **changes)
        await self._send(wire.SessionUpdated(event_id=self._eid(), session=self.session))

    async def _item_create(self, event: wire.ConversationItemCreate) -> None:
        item = event.item
        if item.type != "message" or item.role not in _CONTENT_TYPES:
            await self._error(
                f"The simulator supports message items with role user, assistant or system; "
                f"got type {item.type!r} role {item.role!r}.",
                code="invalid_value",
                param="item",
                event_id=event.event_id,
            )
            return
        allowed = _CONTENT_TYPES[item.role]
        texts: list[str] = []
        for index, part in enumerate(item.content or ()):
            if part.type not in allowed:
                await self._error(
                    f"Invalid value: {part.type!r}. A {item.role} message's content must be "
                    + " or ".join(sorted(allowed))
                    + ".",
                    code="invalid_value",
                    param=f"item.content[{index}].type",
                    event_id=event.event_id,
                )
                return
            texts.append(part.text or "")
        item_id = item.id or self._new_id("item")
        if item_id in self.items:
            await self._error(
                f"Item with id {item_id!r} already exists.",
                code="item_already_exists",
                param="item.id",
                event_id=event.event_id,
            )
            return
        previous = event.previous_item_id
        if previous is not None and previous != "root" and previous not in self.items:
            await self._error(
                f"Item with id {previous!r} not found.",
                code="item_not_found",
                param="previous_item_id",
                event_id=event.event_id,
            )
            return
        new = _Item(item_id, item.role, "".join(texts), "completed")
        previous = self._insert(new, previous)
        out = self._wire_item(new)
        await self._send(
            wire.ConversationItemAdded(event_id=self._eid(), item=out, previous_item_id=previous)
        )
        await self._send(
            wire.ConversationItemDone(event_id=self._eid(), item=out, previous_item_id=previous)
        )

    def _insert(self, new: _Item, previous: str | None) -> str | None:
        """Put ``new`` after ``previous`` (``None``: at the end; ``"root"``: first).

        Returns the id of the item now before it.
        """
        if previous is None:
            last = next(reversed(self.items), None)
            self.items[new.id] = new
            return last
        ordered = list(self.items.values())
        at = 0 if previous == "root" else [i.id for i in ordered].index(previous) + 1
        ordered.insert(at, new)
        self.items = {i.id: i for i in ordered}
        return None if at == 0 else ordered[at - 1].id

    async def _item_delete(self, event: wire.ConversationItemDelete) -> None:
        if self.items.pop(event.item_id, None) is None:
            await self._error(
                f"Item with id {event.item_id!r} not found.",
                code="item_not_found",
                param="item_id",
                event_id=event.event_id,
            )
            return
        await self._send(wire.ConversationItemDeleted(event_id=self._eid(), item_id=event.item_id))

    async def _response_create(self, event: wire.ResponseCreate) -> None:
        if self.response is not None:
            await self._error(
                f"Conversation already has an active response in progress: "
                f"{self.response.id}. Wait until the response is finished before creating "
                "a new one.",
                code="conversation_already_has_active_response",
                event_id=event.event_id,
            )
            return
        config = self.sim.config
        last_user = next((i.text for i in reversed(self.items.values()) if i.role == "user"), "")
        context = len(self.session.instructions or "") + sum(
            len(i.text) for i in self.items.values()
        )
        previous = next(reversed(self.items), None)
        item = _Item(self._new_id("item"), "assistant", "", "in_progress")
        self.items[item.id] = item
        response = _Response(
            self._new_id("resp"),
            item,
            sim_reply(last_user, overrun=config.overrun),
            max(1, context // 4),
        )
        self.response = response  # before any await: a second create is refused
        self.sim.stats.responses_total += 1
        created = wire.Response(
            id=response.id,
            status="in_progress",
            conversation_id=f"conv_sim{self.no}",
            output_modalities=["text"],
            max_output_tokens="inf",
        )
        added = wire.Item(
            type="message",
            id=item.id,
            object="realtime.item",
            status="in_progress",
            role="assistant",
            content=[],
        )
        await self._send(wire.ResponseCreated(event_id=self._eid(), response=created))
        await self._send(
            wire.ResponseOutputItemAdded(
                event_id=self._eid(), response_id=response.id, output_index=0, item=added
            )
        )
        await self._send(
            wire.ConversationItemAdded(event_id=self._eid(), item=added, previous_item_id=previous)
        )
        await self._send(
            wire.ResponseContentPartAdded(
                event_id=self._eid(),
                response_id=response.id,
                item_id=item.id,
                output_index=0,
                content_index=0,
                part=wire.ContentPart(type="text", text=""),
            )
        )
        if self.response is response:
            response.task = asyncio.create_task(self._generate(response))

    async def _response_cancel(self, event: wire.ResponseCancel) -> None:
        response = self.response
        if (
            response is None
            or response.finishing
            or (event.response_id is not None and event.response_id != response.id)
        ):
            await self._error(
                "Cancellation failed: no active response found.",
                code="response_cancel_not_active",
                event_id=event.event_id,
            )
            return
        task = response.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        if self.response is response and not response.finishing:
            response.finishing = True
            await self._finish(response, "cancelled")

    # --- generation ---------------------------------------------------------------

    async def _generate(self, response: _Response) -> None:
        config = self.sim.config
        try:
            if config.first_token_delay > 0:
                await asyncio.sleep(config.first_token_delay)
            if self._drop_due():
                return
            loop = asyncio.get_running_loop()
            interval = 1.0 / config.tokens_per_second if config.tokens_per_second > 0 else 0.0
            start = loop.time()
            text, size, total = response.text, config.chunk_size, len(response.text)
            stats = self.sim.stats
            while response.sent < total:
                # Due times count from the start, so a late wake-up does not
                # push every later delta back; a response running behind (or
                # unpaced) still yields every few deltas so none starves the rest.
                delay = start + response.deltas * interval - loop.time() if interval else 0.0
                if delay > 0:
                    await asyncio.sleep(delay)
                elif response.deltas % _YIELD_EVERY == _YIELD_EVERY - 1:
                    await asyncio.sleep(0)
                chunk = text[response.sent : response.sent + size]
                # Count before the send: the frame is written before ``send`` can suspend.
                response.sent += len(chunk)
                response.deltas += 1
                self.deltas_sent += 1
                stats.deltas_total += 1
                await self._send(
                    wire.ResponseOutputTextDelta(
                        event_id=self._eid(),
                        response_id=response.id,
                        item_id=response.item.id,
                        output_index=0,
                        content_index=0,
                        delta=chunk,
                    )
                )
                if self._drop_due():
                    return
            response.finishing = True
            await self._finish(response, "completed")
        except ConnectionClosed:
            pass

    def _drop_due(self) -> bool:
        drop_after = self.sim.config.drop_after
        if drop_after is None or self.deltas_sent < drop_after:
            return False
        log.info("sim connection %d: dropping after %d deltas", self.no, self.deltas_sent)
        self.ws.transport.abort()
        return True

    async def _finish(self, response: _Response, status: str) -> None:
        """The closing events of ``response``, ending with ``response.done``."""
        item = response.item
        text = response.text[: response.sent]
        item.text = text
        item.status = "completed" if status == "completed" else "incomplete"
        rid, iid = response.id, item.id
        done_item = self._wire_item(item)
        await self._send(
            wire.ResponseOutputTextDone(
                event_id=self._eid(),
                response_id=rid,
                item_id=iid,
                output_index=0,
                content_index=0,
                text=text,
            )
        )
        await self._send(
            wire.ResponseContentPartDone(
                event_id=self._eid(),
                response_id=rid,
                item_id=iid,
                output_index=0,
                content_index=0,
                part=wire.ContentPart(type="text", text=text),
            )
        )
        await self._send(
            wire.ResponseOutputItemDone(
                event_id=self._eid(), response_id=rid, output_index=0, item=done_item
            )
        )
        if iid in self.items:
            await self._send(wire.ConversationItemDone(event_id=self._eid(), item=done_item))
        usage = wire.ResponseUsage(
            total_tokens=response.input_tokens + response.deltas,
            input_tokens=response.input_tokens,
            output_tokens=response.deltas,
            input_token_details=wire.InputTokenDetails(text_tokens=response.input_tokens),
            output_token_details=wire.OutputTokenDetails(text_tokens=response.deltas),
        )
        details = (
            None
            if status == "completed"
            else wire.StatusDetails(type="cancelled", reason="client_cancelled")
        )
        done = wire.Response(
            id=rid,
            status=status,
            status_details=details,
            output=[done_item],
            conversation_id=f"conv_sim{self.no}",
            output_modalities=["text"],
            max_output_tokens="inf",
            usage=usage,
        )
        # The response stops being active as response.done is written: a
        # response.create sent by a client that saw it is then accepted.
        if self.response is response:
            self.response = None
        await self._send(wire.ResponseDone(event_id=self._eid(), response=done))
        await self._send(
            wire.RateLimitsUpdated(
                event_id=self._eid(),
                rate_limits=[
                    wire.RateLimit("requests", 5000, 4999, 0.012),
                    wire.RateLimit("tokens", 400000, 400000 - usage.total_tokens, 0.5),
                ],
            )
        )

    @staticmethod
    def _wire_item(item: _Item) -> wire.Item:
        kind = "output_text" if item.role == "assistant" else "input_text"
        return wire.Item(
            type="message",
            id=item.id,
            object="realtime.item",
            status=item.status,
            role=item.role,
            content=[wire.ContentPart(type=kind, text=item.text)],
        )


# --- the server -----------------------------------------------------------------------


class Sim:
    """A running simulator (from ``serve_sim``): its address, state and counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = SimStats()
        self.host = ""
        self.port = 0
        self._server: Server | None = None
        self._live: dict[int, _Connection] = {}
        self._numbers = itertools.count(1)

    @property
    def url(self) -> str:
        """The WebSocket base URL (``ws://HOST:PORT/v1``) for an adapter or the SDK."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}/v1"

    def conversations(self) -> list[SimConversation]:
        """Snapshots of the open connections' conversations, oldest connection first."""
        return [conn.snapshot() for conn in self._live.values()]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await serve(
            self._handler,
            host,
            port,
            compression=None,
            process_request=self._process_request,
            max_size=_MAX_FRAME,
            backlog=_BACKLOG,
        )
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop accepting, close every connection (1001) and wait for them (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.partition("?")[0]
        if path.rstrip("/") != PATH:
            return connection.respond(404, f"Not found: the realtime endpoint is {PATH}\n")
        key = self.config.api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            body = (
                b'{"error": {"type": "invalid_request_error", "code": "invalid_api_key", '
                b'"message": "Incorrect API key provided.", "param": null}}'
            )
            headers = Headers(
                {"Content-Type": "application/json", "Content-Length": str(len(body))}
            )
            return Response(401, "Unauthorized", headers, body)
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        query = ws.request.path.partition("?")[2] if ws.request is not None else ""
        model = DEFAULT_MODEL
        for pair in query.split("&"):
            name, _, value = pair.partition("=")
            if name == "model" and value:
                model = value
        no = next(self._numbers)
        conn = _Connection(self, ws, no, model)
        self._live[no] = conn
        self.stats.connections += 1
        self.stats.connections_total += 1
        try:
            await conn.run()
        finally:
            del self._live[no]
            self.stats.connections -= 1
            await conn.stop()


@contextlib.asynccontextmanager
async def serve_sim(
    config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[Sim]:
    """Run a simulator for the ``async with`` block (``port=0``: any free port)."""
    sim = Sim(config or SimConfig())
    await sim.start(host, port)
    try:
        yield sim
    finally:
        await sim.close()


async def run_sim(
    config: SimConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    on_ready: Callable[[Sim], None] | None = None,
) -> None:
    """Serve until cancelled (``gateway sim``). ``on_ready`` is called once listening."""
    async with serve_sim(config, host, port) as sim:
        log.info("simulator listening on %s/realtime", sim.url)
        if on_ready is not None:
            on_ready(sim)
        await asyncio.Event().wait()


# --- command-line knobs -------------------------------------------------------------


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_sim_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """Define the simulator's knobs as flags (``--tokens-per-second`` …).

    ``prefix`` (e.g. ``"sim-"``) namespaces the flags when another command
    embeds the simulator; destinations are always ``sim_*``, so they never clash.
    """
    group = parser.add_argument_group("simulator")
    group.add_argument(
        f"--{prefix}tokens-per-second",
        dest="sim_tokens_per_second",
        type=_non_negative_float,
        default=0.0,
        metavar="N",
        help="text deltas per second per response (0 = as fast as possible; default 0)",
    )
    group.add_argument(
        f"--{prefix}chunk-size",
        dest="sim_chunk_size",
        type=_positive_int,
        default=4,
        metavar="CHARS",
        help="characters per text delta (default 4)",
    )
    group.add_argument(
        f"--{prefix}first-token-delay",
        dest="sim_first_token_delay",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="delay before the first delta of each response (default 0)",
    )
    group.add_argument(
        f"--{prefix}drop-after",
        dest="sim_drop_after",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="abort each connection's TCP socket after N deltas (fault injection)",
    )
    group.add_argument(
        f"--{prefix}no-overrun",
        dest="sim_overrun",
        action="store_false",
        help="stop tool-call responses at </execute> (default: write past it, as models do)",
    )
    group.add_argument(
        f"--{prefix}api-key",
        dest="sim_api_key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (default: accept any)",
    )


def sim_config_from_args(ns: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` of flags defined by ``add_sim_arguments``."""
    return SimConfig(
        tokens_per_second=ns.sim_tokens_per_second,
        chunk_size=ns.sim_chunk_size,
        first_token_delay=ns.sim_first_token_delay,
        drop_after=ns.sim_drop_after,
        overrun=ns.sim_overrun,
        api_key=ns.sim_api_key,
    )
