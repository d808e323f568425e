"""The simulator: the deterministic model of ``gateway.sim.model`` behind a realtime wire.

Two flavours share one model (``sim_reply``), one pacing (``Pacer``) and one
set of knobs (``SimConfig``), so a scripted conversation gives the same text
on either provider:

- ``openai`` (this module): serves ``/v1/realtime`` the way the OpenAI
  Realtime (GA) API does, so the OpenAI adapter is tested end to end over real
  sockets and the official ``openai`` SDK can connect to it
  (``AsyncOpenAI(websocket_base_url=sim.url)``). Frames are the Structs of
  ``gateway.upstream.openai_wire``: one definition of the wire for both sides.
- ``gemini`` (``gateway.sim.gemini``): serves the Gemini Live
  ``BidiGenerateContent`` endpoint.

``serve_sim(SimConfig(flavor=...))`` runs either; ``gateway sim --flavor``
on the command line.

Knobs (``SimConfig``) shape timing and faults for load and failure tests:
tokens per second, chunk size, first-token delay, dropping the TCP connection
after N deltas, an API key to enforce, and (Gemini) a ``goAway``.

Cost per connection is one handler task (the reader) plus, while a response
runs, one generator task; there is no task or timer per token beyond the one
sleep that paces it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Final

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.sim.model import (
    Pacer,
    Sim,
    SimConnection,
    SimConversation,
    SimItem,
    estimate_tokens,
    sim_reply,
)
from gateway.upstream import openai_wire as wire

__all__ = ["DEFAULT_MODEL", "PATH", "OpenAISim"]

log = logging.getLogger(__name__)

PATH: Final = "/v1/realtime"
DEFAULT_MODEL: Final = "gpt-realtime"


# --- state and snapshots --------------------------------------------------------------


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


class _Connection(SimConnection):
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

    def __init__(self, sim: OpenAISim, ws: ServerConnection, no: int, model: str) -> None:
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
            estimate_tokens(context),
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
            pacer = Pacer(config)
            await pacer.begin()
            if self._drop_due():
                return
            text, size, total = response.text, config.chunk_size, len(response.text)
            stats = self.sim.stats
            while response.sent < total:
                await pacer.wait(response.deltas)
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
        return self.sim.drop_due(self.no, self.ws, self.deltas_sent)

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


class OpenAISim(Sim):
    """The OpenAI Realtime flavour: ``/v1/realtime``, ``Authorization: Bearer``."""

    flavor = "openai"

    @property
    def url(self) -> str:
        """The WebSocket base URL (``ws://HOST:PORT/v1``) for an adapter or the SDK."""
        return f"{self.address}/v1"

    @property
    def endpoint(self) -> str:
        return f"{self.address}{PATH}"

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

    def _connection(self, ws: ServerConnection, no: int) -> _Connection:
        query = ws.request.path.partition("?")[2] if ws.request is not None else ""
        model = DEFAULT_MODEL
        for pair in query.split("&"):
            name, _, value = pair.partition("=")
            if name == "model" and value:
                model = value
        return _Connection(self, ws, no, model)
