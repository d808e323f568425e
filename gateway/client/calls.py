"""What a ``Client`` does about its session's calls: runs its client tools, and
decides on calls that wait for approval.

Both answer events the client reads (``call`` with ``"runs_on": "client"``,
``approval_required``) with a frame of their own, in a task of their own, so
the reader never waits for an application's handler. ``approve()`` waits for
its answer as ``configure()`` does: the logged ``approval`` event of its
call, or the gateway's unlogged refusal (``wrong_digest``, ``unknown_call``,
``forbidden``), raised as ``ApprovalRefused``; a refusal is never silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import msgspec
import orjson

from gateway.client.dial import ClientError
from protocol.events import Approval, ApprovalRequired, Approve, Call, Error, ToolResultMessage

__all__ = [
    "ApprovalHook",
    "ApprovalRefused",
    "Calls",
    "Decision",
    "ToolHandler",
]

log = logging.getLogger("gateway.client")

ToolHandler = Callable[[dict[str, Any]], Awaitable[Any] | Any]
"""A client tool: called with the call's ``args``; returns the result's content."""

Decision = Literal["allow", "deny"]

ApprovalHook = Callable[
    [ApprovalRequired], Awaitable[Decision | bool | None] | Decision | bool | None
]
"""Told each ``approval_required`` the client reads (also in a resumed client's replay):
returns ``"allow"``/``True`` or ``"deny"``/``False`` to decide at once (the client
sends the ``approve``), or ``None`` to decide later with ``Client.approve``."""

Send = Callable[[bytes], Awaitable[int]]

_encoder: Final = msgspec.json.Encoder()


class ApprovalRefused(ClientError):
    """The gateway refused an ``approve``: ``code`` (``wrong_digest``, ``unknown_call``,
    ``forbidden``) and its text, which says what to do."""

    def __init__(self, code: str, content: str) -> None:
        super().__init__(f"the gateway refused the approval ({code}): {content}")
        self.code = code
        self.content = content


class Calls:
    """One client's tools and approvals (see the module docstring); ``send`` sends a
    text frame on the client's live connection."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.tools: dict[str, ToolHandler] = {}
        self.on_approval: ApprovalHook | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._approving: deque[tuple[str, asyncio.Future[Approval]]] = deque()

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        """Handlers running now (the client cancels them when it closes)."""
        return self._tasks

    def seen(self, event: object) -> None:
        """An event the client read: answer it if it is one of ours."""
        if isinstance(event, Call):
            if event.runs_on == "client" and self.tools:
                self._spawn(self._run_tool(event), f"client-tool:{event.id}")
        elif isinstance(event, ApprovalRequired):
            if self.on_approval is not None:
                self._spawn(self._ask(event, self.on_approval), f"approval:{event.id}")
        elif isinstance(event, Approval):
            for pending in [p for p in self._approving if p[0] == event.id]:
                self._approving.remove(pending)
                if not pending[1].done():
                    pending[1].set_result(event)

    def refused(self, error: Error) -> bool:
        """Whether ``error`` (an unlogged reply) refuses a pending ``approve`` (raised there):
        its ``reply_to`` is the call's id, which is the approve's ``id``."""
        refused = [p for p in self._approving if p[0] == error.reply_to]
        for pending in refused:
            self._approving.remove(pending)
            if not pending[1].done():
                pending[1].set_exception(ApprovalRefused(error.code, error.content))
        return bool(refused)

    async def approve(
        self, call_id: str, digest: str, decision: Decision, timeout: float
    ) -> Approval:
        if decision not in ("allow", "deny"):
            raise ValueError(f'decision must be "allow" or "deny", not {decision!r}')
        waiter: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        pending = (call_id, waiter)
        self._approving.append(pending)
        try:
            await self._send(_encoder.encode(Approve(call_id, digest, decision)))
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            raise ClientError(f"the gateway did not answer approve within {timeout:g}s") from None
        finally:
            with contextlib.suppress(ValueError):
                self._approving.remove(pending)

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(work)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self, event: ApprovalRequired, hook: ApprovalHook) -> None:
        try:
            answer = hook(event)
            if inspect.isawaitable(answer):
                answer = await answer
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gateway client: the approval hook raised for call %s", event.id)
            return
        if answer is None:
            return
        decision: Decision
        if answer is True or answer == "allow":
            decision = "allow"
        elif answer is False or answer == "deny":
            decision = "deny"
        else:
            log.warning(
                'gateway client: the approval hook returned %.80r for call %s; return "allow", '
                '"deny" or None (decide later with approve())',
                answer,
                event.id,
            )
            return
        try:
            await self.approve(event.id, event.digest, decision, timeout=30.0)
        except ApprovalRefused as exc:
            # A replay's approval_required that was decided already: nothing to do.
            if exc.code != "unknown_call":
                log.warning("gateway client: %s", exc)
        except ClientError as exc:
            log.warning("gateway client: could not approve call %s: %s", event.id, exc)

    async def _run_tool(self, call: Call) -> None:
        try:
            spec = orjson.loads(call.content)
        except orjson.JSONDecodeError:
            return
        if not isinstance(spec, dict):
            return
        name = str(spec.get("name", ""))
        args = spec.get("args")
        handler = self.tools.get(name)
        answer: ToolResultMessage
        if handler is None:
            known = ", ".join(sorted(self.tools)) or "none"
            answer = ToolResultMessage(
                call.id, "failure", f"this client has no tool {name!r} (it has: {known})"
            )
        else:
            try:
                value = handler(args if isinstance(args, dict) else {})
                if inspect.isawaitable(value):
                    value = await value
                answer = ToolResultMessage(call.id, "success", value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                answer = ToolResultMessage(call.id, "failure", f"{type(exc).__name__}: {exc}")
        try:
            payload = _encoder.encode(answer)
        except (TypeError, msgspec.EncodeError) as exc:
            payload = _encoder.encode(
                ToolResultMessage(call.id, "failure", f"the result is not JSON: {exc}")
            )
        with contextlib.suppress(ClientError):
            await self._send(payload)
