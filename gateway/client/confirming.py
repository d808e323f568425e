"""Commands a ``Client`` awaits an answer to: ``configure`` and ``context``.

Each is sent with an id of its own (``configure-3``) and settled by the first of: the
logged event that names it (``reply_to``: ``configured``, ``context``), an unlogged
``error`` reply naming it, or a ``guardrail`` that blocked it. A refusal is raised as
``CommandRefused`` (``ConfigureRefused`` for a configure), never dropped.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from gateway.client.dial import ClientError
from protocol.events import Configured, Context, Error, Event, Guardrail

__all__ = ["CommandRefused", "ConfigureRefused", "Confirmations"]

A = TypeVar("A", Configured, Context)


class CommandRefused(ClientError):
    """The gateway refused a command: ``code`` (``forbidden``, ``bad_frame``…) and its text."""

    def __init__(self, code: str, content: str) -> None:
        super().__init__(f"the gateway refused it ({code}): {content}")
        self.code = code
        self.content = content


class ConfigureRefused(CommandRefused):
    """The gateway refused a ``configure``."""


class Confirmations:
    """The commands waiting for their answer, by id."""

    __slots__ = ("_ids", "_waiting")

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[Event]] = {}
        self._ids = itertools.count(1)

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    async def ask(
        self,
        send: Callable[[bytes], Awaitable[object]],
        frame: dict[str, Any],
        answer: type[A],
        timeout: float,
    ) -> A:
        """Send ``frame`` and wait for what settles it (see the module docstring)."""
        waiter: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        ref = self.new_id(str(frame["type"]))
        self._waiting[ref] = waiter
        try:
            await send(orjson.dumps({**frame, "id": ref}))
            async with asyncio.timeout(timeout):
                event = await waiter
        except TimeoutError:
            raise ClientError(
                f"the gateway did not answer {frame['type']} within {timeout:g}s"
            ) from None
        finally:
            self._waiting.pop(ref, None)
        assert isinstance(event, answer), event
        return event

    def seen(self, event: Event) -> None:
        """A logged event: the answer to a waiting command, or a guardrail blocking it."""
        if not isinstance(event, Configured | Context | Guardrail):
            return
        ref = event.reply_to
        waiter = self._waiting.pop(ref, None) if isinstance(ref, str) else None
        if waiter is None or waiter.done():
            return
        if not isinstance(event, Guardrail):
            waiter.set_result(event)
        elif blocked := event.refusal():
            waiter.set_exception(CommandRefused("guardrail_blocked", blocked))
        else:  # redacted: the answer is the event still to come
            self._waiting[str(ref)] = waiter

    def refused(self, error: Error) -> bool:
        """An unlogged ``error`` reply: whether it refuses a waiting command (raised there)."""
        ref = error.reply_to
        waiter = self._waiting.pop(ref, None) if isinstance(ref, str) else None
        if waiter is None:
            return False
        if not waiter.done():
            refused = ConfigureRefused if str(ref).startswith("configure-") else CommandRefused
            waiter.set_exception(refused(error.code, error.content))
        return True
