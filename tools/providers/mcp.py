"""MCP tools: each configured server is connected once per node and its tools offered.

Through the official ``mcp`` SDK (2.x) as a client. A ``[mcp.NAME]`` server is
either a command (stdio: the gateway starts it as a child process) or a URL
(streamable HTTP). Its tools appear as ``NAME.TOOL`` with the JSON Schema the
server lists, and every call carries the session id in the request's ``_meta``
(``{"session_id": ..., "call_id": ..., "idempotency_key": ...}``) so a server can keep
per-session state and do a call's work once per key (a takeover reruns a call
whose outcome was not logged, under the same key).

One ``McpServer`` owns one connection and a supervisor task that keeps it up:
the SDK's client is entered and left in that task (anyio task groups must be),
a failed call or a failed periodic ping marks the connection broken, and the
supervisor reconnects (for stdio: starts a new child) with exponential backoff.
A call made while the server is down waits for it at most the server's
``timeout`` and then fails with a result that says the server is down, so a
dead server costs the model one failed call, never a hung turn.

Starting is different: the tools must be known to write the system prompt,
so ``start`` waits at most the section's ``timeout``, and a stdio server
whose command cannot be run or that exits before answering fails it at once,
with the reason (``exited with status 1 before it answered (last stderr
line: ModuleNotFoundError: …)``), rather
than being retried until the timeout. A URL server is retried until then: it
may be starting beside the gateway.

What a server can make the node hold is bounded: one MCP message is at most
``max_message`` bytes (1 MiB, the SDK's own limit on an event of an HTTP
event stream). stdio servers are read through ``tools.providers.mcp_stdio``,
HTTP ones through ``tools.providers.mcp_http``; a call whose answer was over
the limit fails saying so, and the connection stays up. What reaches the
model is then cut to the node's ``tool_max_output`` like any tool's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import ValidationError

from protocol.configuration import MAX_TOOL_DESCRIPTION, parameters_bytes
from tools.base import ToolContext, ToolFailure
from tools.described import DescribedTool
from tools.providers.mcp_http import TOO_LARGE_NOTE, TOO_WIDE_NOTE, streamable_http
from tools.providers.mcp_stdio import (
    MESSAGE_TOO_LARGE,
    MESSAGE_UNREADABLE,
    StdioChild,
    validation_reason,
)
from tools.providers.specs import McpServerSpec
from tools.secrets import Secrets

__all__ = ["MAX_MESSAGE", "MAX_TOOLS", "McpServer", "McpServerSpec", "McpTool", "result_content"]

log = logging.getLogger("tools.providers.mcp")

_PING_INTERVAL: Final = 10.0
_BACKOFF_FIRST: Final = 0.2
_BACKOFF_MAX: Final = 30.0
MAX_MESSAGE: Final = 1024 * 1024
"""Bytes of one MCP message the node reads (the SDK's default for one event of an event stream)."""
_SSE_TOO_LARGE: Final = "byte limit"
"""How the SDK's event stream reports an event over ``max_sse_event_size``."""
MAX_TOOLS: Final = 128
"""Tools of one server the node takes (OpenAI's limit for one model request); the
rest are left out, with a warning."""
_MAX_PAGES: Final = 32
"""Pages of ``tools/list`` read at most: a server's cursor that never ends held a start."""
_IMAGE_NOTE: Final = (
    "[{kind} ({mime}, {size:,} bytes) not shown: this text protocol carries no media]"
)


class McpServer:
    """A supervised connection to one MCP server, shared by every session of the node."""

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        backoff_first: float = _BACKOFF_FIRST,
        backoff_max: float = _BACKOFF_MAX,
        ping_interval: float = _PING_INTERVAL,
        connect_timeout: float | None = None,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        """``connect_timeout`` (default: the section's ``timeout``) bounds ``start``."""
        self.spec = spec
        self.secrets = Secrets(spec.secrets)  # its tools' (``tools.secrets``)
        self.connect_timeout = connect_timeout or spec.timeout
        self.max_message = max_message
        self._child: StdioChild | None = None
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._ping_interval = ping_interval
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self._listed: asyncio.Future[list[mcp_types.Tool]] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self.last_error = "not connected yet"
        self.connects = 0
        """How many times a connection was made (1 + restarts); for tests and logs."""

    # ------------------------------------------------------------------ life

    async def start(self) -> list[McpTool]:
        """Connect, list the server's tools, keep the connection up in the background.

        Raises ``ConnectionError`` (message says what failed) if the first
        connection does not succeed within ``connect_timeout``, or at once if
        a stdio server cannot be started or ends before it answers: the tools
        must be known to write the system prompt.
        """
        self._listed = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"mcp:{self.spec.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                listing = await asyncio.shield(self._listed)
        except TimeoutError:
            await self.close()
            raise ConnectionError(
                f"did not connect within {self.connect_timeout:g}s (last error: {self.last_error})"
            ) from None
        except ConnectionError:
            await self.close()
            raise
        return self._tools(listing)

    def _tools(self, listing: list[mcp_types.Tool]) -> list[McpTool]:
        """The listed tools the node can give a model: a bad one (its schema past the
        limits a client's tool has, or no JSON Schema) is left out with a warning, not
        the whole server (which may be a third party's and change under us)."""
        name = self.spec.name
        if len(listing) > MAX_TOOLS:
            log.warning(
                "MCP server %s lists %d tools; the first %d are used: serve fewer from it",
                name,
                len(listing),
                MAX_TOOLS,
            )
        tools: list[McpTool] = []
        for tool in listing[:MAX_TOOLS]:
            try:
                tools.append(McpTool(self, tool))
            except ValueError as exc:
                log.warning("MCP server %s: tool %r left out: %s", name, tool.name[:80], exc)
        return tools

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self._supervisor
            self._supervisor = None

    async def _supervise(self) -> None:
        delay = self._backoff_first
        while True:
            try:
                async with self._new_client() as client:
                    listing = await _list_all(client)
                    self.connects += 1
                    self._client = client
                    self._broken.clear()
                    self._ready.set()
                    if self._child is not None:
                        self._child.connected()
                    if self._listed is not None and not self._listed.done():
                        self._listed.set_result(listing)
                    log.info(
                        "mcp server %s connected (%s): %d tools",
                        self.spec.name,
                        self.spec.describe(),
                        len(listing),
                    )
                    delay = self._backoff_first
                    await self._watch(client)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # anyio wraps failures in ExceptionGroups
                self.last_error = self._why(exc)
                listed = self._listed
                if self._child is not None and listed is not None and not listed.done():
                    # A command that cannot run, or ends before it answers, will
                    # not do better in a second: fail the node's start now.
                    listed.set_exception(ConnectionError(self._start_failure(exc)))
                    return
                log.warning(
                    "mcp server %s lost (%s); reconnecting in %.1fs",
                    self.spec.name,
                    self.last_error,
                    delay,
                )
            finally:
                self._ready.clear()
                self._client = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff_max)

    async def _watch(self, client: Client) -> None:
        """Return when the connection is broken: a failed call, or a heartbeat not answered.

        The heartbeat is a fresh ``tools/list``: ``ping`` is gone from the
        2026-07-28 protocol the SDK negotiates, and listing works in every version.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ping_interval):
                    await self._broken.wait()
                    self.last_error = "a call found the connection broken"
                    return
            try:
                async with asyncio.timeout(self.spec.timeout):
                    await client.list_tools(cache_mode="refresh")
            except Exception as exc:
                self.last_error = f"heartbeat failed: {_describe(exc)}"
                return

    def _new_client(self) -> Client:
        spec = self.spec
        if spec.command:
            self._child = StdioChild(
                spec.name, spec.command, env=spec.env, cwd=spec.cwd, max_line=self.max_message
            )
            transport = self._child.connect()
        else:
            transport = streamable_http(spec.url, max_message=self.max_message)
        return Client(transport, read_timeout_seconds=spec.timeout, cache=None)

    def _why(self, exc: BaseException, *, stderr: bool = True) -> str:
        """Why a connection failed or ended: the child's fate when it has one."""
        fate = self._child.fate(stderr=stderr) if self._child is not None else ""
        return fate or _describe(exc)

    def _start_failure(self, exc: BaseException) -> str:
        fate = self._child.fate("before it answered") if self._child is not None else ""
        if fate:
            return fate
        if isinstance(_innermost(exc), OSError):
            return f"could not be started ({self.last_error})"
        return f"failed before it answered ({self.last_error})"

    # ------------------------------------------------------------------ calls

    async def call(
        self, tool: str, args: dict[str, Any], session_id: str, call_id: str = "", key: str = ""
    ) -> Any:
        """Call ``tool``; its output, or ``ToolFailure`` saying what went wrong.

        ``call_id`` and ``key`` (the call's idempotency key) go in ``_meta`` when given."""
        spec = self.spec
        client: Client | None = None
        try:
            async with asyncio.timeout(spec.timeout):
                await self._ready.wait()
                client = self._client
                assert client is not None
                fields: dict[str, str] = {"session_id": session_id}
                if key:
                    fields["call_id"] = call_id
                    fields["idempotency_key"] = key
                meta = mcp_types.RequestParamsMeta(**fields)  # type: ignore[typeddict-item]
                result = await client.call_tool(tool, args, meta=meta)
        except TimeoutError:
            if self._client is None:
                raise ToolFailure(
                    f"the MCP server {spec.name!r} is down (the gateway's log says why); "
                    "the gateway keeps restarting it: try again later or do without this tool"
                ) from None
            raise ToolFailure(
                f"'{spec.name}.{tool}' did not answer within {spec.timeout:g}s; "
                "try again later or ask for less at once"
            ) from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ToolFailure(
                    f"'{spec.name}.{tool}' did not answer within {spec.timeout:g}s; "
                    "try again later or ask for less at once"
                ) from None
            too_large = self._too_large(f"'{spec.name}.{tool}'", exc)
            if too_large:
                raise ToolFailure(too_large) from None
            if exc.code == MESSAGE_UNREADABLE:
                raise ToolFailure(_unreadable(f"'{spec.name}.{tool}'", exc.message)) from None
            if exc.code != CONNECTION_CLOSED:
                raise ToolFailure(
                    f"'{spec.name}.{tool}' was refused by its MCP server: {exc}"
                ) from None
            self._lost(client)
            fate = self._child.fate(stderr=False) if self._child is not None else ""
            why = f" ({fate})" if fate else ""
            raise ToolFailure(
                f"the MCP server {spec.name!r} closed the connection during the call{why}; "
                "it is being restarted: try again in a moment"
            ) from None
        except ValidationError as exc:
            # The answer came, but is no tool result: the connection is fine (restarting
            # the server killed the other sessions' calls running on it).
            raise ToolFailure(
                f"'{spec.name}.{tool}' answered with something that is not an MCP tool "
                f"result ({validation_reason(exc)}). This is a fault in the server, not in "
                "your call"
            ) from None
        except Exception as exc:
            # The transport failed under the call (server crashed, connection lost).
            self._lost(client)
            raise ToolFailure(
                f"the MCP server {spec.name!r} failed during the call "
                f"({self._why(exc, stderr=False)}); it is being restarted: try again in a moment"
            ) from None
        content = result_content(result)
        if result.is_error:
            raise ToolFailure(
                content if isinstance(content, str) else f"'{spec.name}.{tool}' failed: {content}"
            )
        return content

    def _too_large(self, what: str, exc: MCPError) -> str:
        """The failure for an answer refused for its size ("" if ``exc`` is something else).

        Each transport says it its own way: the stdio one with its own code,
        the HTTP one inside the SDK's "Failed to parse JSON response", the
        SDK's event stream as a closed stream "exceeded the N byte limit".
        """
        text = exc.message
        if TOO_WIDE_NOTE in text:  # an HTTP JSON body's; the rest say MESSAGE_UNREADABLE
            problem = text.partition(": ")[2] if text.startswith("Failed to parse") else text
            return _unreadable(what, problem.removesuffix(f", {TOO_WIDE_NOTE}"))
        if "compressed" in text and TOO_LARGE_NOTE in text:
            return (
                f"{what} was answered with a compressed body, which the gateway refuses from "
                "MCP servers (it asks for none, as it could not bound what it expands to). "
                "This is a fault in the server, not in your call"
            )
        if not (
            exc.code == MESSAGE_TOO_LARGE
            or TOO_LARGE_NOTE in text
            or (exc.code == CONNECTION_CLOSED and _SSE_TOO_LARGE in text)
        ):
            return ""
        return (
            f"{what} answered with more than {self.max_message:,} bytes, the most the gateway "
            "reads of one MCP message, so the answer was dropped. Ask for less at once "
            "(narrower arguments, a smaller page); the server itself is still up"
        )

    def _lost(self, client: Client | None) -> None:
        """A call found ``client`` broken: later calls wait for the next connection."""
        if client is not None and client is self._client:
            self._client = None
            self._ready.clear()
            self._broken.set()


class McpTool(DescribedTool):
    """One tool of an MCP server, named ``SERVER.TOOL``."""

    def __init__(self, server: McpServer, tool: mcp_types.Tool) -> None:
        name = f"{server.spec.name}.{tool.name}"
        schema = {k: v for k, v in tool.input_schema.items() if k != "title"}
        size = parameters_bytes(name, schema)
        if isinstance(size, str):
            raise ValueError(size)
        description = tool.description or tool.title or tool.name
        if len(description) > MAX_TOOL_DESCRIPTION:
            log.warning(
                "MCP tool %s: its description is %d characters; the first %d are used",
                name,
                len(description),
                MAX_TOOL_DESCRIPTION,
            )
            description = description[:MAX_TOOL_DESCRIPTION]
        super().__init__(name, description, schema)
        self.server = server
        self.remote_name = tool.name
        self.require_approval = server.spec.require_approval
        self.secrets = server.secrets
        self.background = server.spec.background

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self.server.call(
            self.remote_name, args, ctx.session_id, ctx.call_id, ctx.idempotency_key
        )


def _unreadable(what: str, problem: str) -> str:
    """The failure for an answer the gateway did not take (``lines.too_wide``, too deep)."""
    return (
        f"{what} answered with {problem}; the gateway dropped it. This is a fault in the "
        "server, not in your call: ask for less at once, or do without this tool"
    )


def result_content(result: mcp_types.CallToolResult) -> Any:
    """What the model reads of an MCP result.

    Structured content when the server gave it (the SDK wraps a tool's plain
    return value as ``{"result": value}``; the wrapper is removed), else the
    content blocks: text as it is, media as a short note (this protocol is
    text), resources as their text or URI. One block gives a string, several
    are joined by blank lines.
    """
    structured = result.structured_content
    if structured is not None and not result.is_error:
        if isinstance(structured, dict) and list(structured) == ["result"]:
            return structured["result"]
        return structured
    parts = [_block_text(block) for block in result.content]
    return "\n\n".join(parts) if parts else ""


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
        return _IMAGE_NOTE.format(kind=kind, mime=block.mime_type, size=len(block.data) * 3 // 4)
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource: {block.uri}]"
    resource = block.resource
    if isinstance(resource, mcp_types.TextResourceContents):
        return resource.text
    return f"[resource {resource.uri} ({resource.mime_type or 'binary'}) not shown]"


async def _list_all(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None or len(tools) > MAX_TOOLS:
            return tools
    log.warning(
        "an MCP server's tools/list went on past %d pages; the rest are left out", _MAX_PAGES
    )
    return tools


def _innermost(exc: BaseException) -> BaseException:
    """The first exception inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """One line for an exception, unwrapping anyio's exception groups."""
    exc = _innermost(exc)
    text = str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"
