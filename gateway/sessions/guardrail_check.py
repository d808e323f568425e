"""HTTP checker rules: an input is POSTed to the app's checker and awaited before the model sees it.

A rule with ``check_url`` (``protocol.guardrails``: input rules only) sends
``{"rule", "on": "input", "kind", "text", "session_id"}`` and expects
``{"allow": true}`` or ``{"allow": false, "reason": "..."}``. The reason is
logged here and goes nowhere else: the client, the log and the metrics name
the rule only, as with every other rule.

The checker is someone else's server, so a check is bounded as an HTTP tool's
call is (``tools.providers.http``): the text sent (``MAX_TEXT``), the answer
read (``MAX_ANSWER``, streamed and counted), and the rule's ``check_timeout``
as a deadline for the whole exchange. A checker that errs, times out or
answers something else follows the rule's ``on_check_error`` (``allow``:
fail-open, ``block``: fail-closed) and counts in
``rtgw_guardrail_check_errors{rule, reason}``. The client is ``httpx2``, the
HTTP tools' client, one per node (``Checkers``): no redirects, no proxies from
the environment, connections kept alive between checks.

Checks of one input run at once; the first rule (in order) that blocks wins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import httpx2
import msgspec

from gateway.metrics import Metrics
from gateway.sessions.guard import EventGuard
from gateway.sessions.guardrail_rules import checker_headers
from protocol.events import ContextMessage, Event, UserMessage
from protocol.guardrails import Hit, RuleSpec

__all__ = ["MAX_ANSWER", "MAX_TEXT", "Checkers", "Kind", "screen", "screened"]

log = logging.getLogger("gateway.sessions.guard")

Kind = Literal["user", "tool_result"]

MAX_TEXT: Final = 64 * 1024
"""Characters of an input a checker is sent; a longer input is a check error (never cut:
what is past the cut would go unjudged)."""
MAX_ANSWER: Final = 64 * 1024
"""Bytes of a checker's answer read; a longer one is a check error."""


_CONNECTIONS: Final = 256
"""Connections to checkers open at once, for every session of the node."""


class Checkers:
    """The node's client for HTTP checkers, made at its first check (a node without
    checker rules opens none), so checks reuse connections; closed with the node."""

    __slots__ = ("_client",)

    def __init__(self) -> None:
        self._client: httpx2.AsyncClient | None = None

    async def client(self) -> httpx2.AsyncClient:
        """Made in a thread: a client loads its TLS trust store when made (20-45 ms,
        measured), which held the loop for every session at a node's first check."""
        if self._client is None:
            made = await asyncio.to_thread(_new_client)
            if self._client is None:
                self._client = made
            else:  # another first check made one meanwhile
                await made.aclose()
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _new_client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        follow_redirects=False,  # a checker's URL is configured, not discovered
        trust_env=False,
        # An answer is a few bytes: nothing to inflate (a bomb has nothing to ride).
        headers={"Accept-Encoding": "identity"},
        limits=httpx2.Limits(max_connections=_CONNECTIONS, max_keepalive_connections=64),
    )


class _Answer(msgspec.Struct):
    allow: bool
    reason: str = ""


_DECODE: Final = msgspec.json.Decoder(_Answer)


class CheckError(Exception):
    """A checker could not be asked or did not answer as the contract says: why (a label)."""


async def _ask(
    client: httpx2.AsyncClient, spec: RuleSpec, kind: Kind, text: str, session_id: str
) -> _Answer:
    if len(text) > MAX_TEXT:
        raise CheckError("too_long")
    body = {"rule": spec.name, "on": "input", "kind": kind, "text": text, "session_id": session_id}
    kept = bytearray()
    try:
        async with asyncio.timeout(spec.check_timeout):
            async with client.stream(
                "POST",
                spec.check_url,
                json=body,
                headers=checker_headers(spec),
                timeout=spec.check_timeout,
            ) as response:
                if not 200 <= response.status_code < 300:
                    raise CheckError("status")
                async for piece in response.aiter_bytes():
                    kept += piece
                    if len(kept) > MAX_ANSWER:
                        raise CheckError("too_large")
    except CheckError:
        raise
    except (TimeoutError, httpx2.TimeoutException):
        raise CheckError("timeout") from None
    except httpx2.HTTPError:
        raise CheckError("unreachable") from None
    except Exception:  # whatever else a request can raise: still the rule's choice, not a crash
        log.exception("guardrail %r: asking its checker failed", spec.name)
        raise CheckError("unreachable") from None
    try:
        return _DECODE.decode(kept)
    except msgspec.DecodeError:
        raise CheckError("bad_answer") from None


async def _judge(
    client: httpx2.AsyncClient,
    spec: RuleSpec,
    kind: Kind,
    text: str,
    session_id: str,
    metrics: Metrics,
) -> Hit | None:
    try:
        answer = await _ask(client, spec, kind, text, session_id)
    except CheckError as exc:
        reason = str(exc)
        metrics.guardrails.check_errors.labels(spec.name, reason).inc()
        log.warning(
            "session %s: guardrail %r: checker %s (%s): %s",
            session_id,
            spec.name,
            reason,
            spec.check_url,
            "blocked" if spec.on_check_error == "block" else "allowed",
        )
        return Hit(spec.name, spec.action) if spec.on_check_error == "block" else None
    if answer.allow:
        return None
    log.info(
        "session %s: guardrail %r blocked a %s: %s", session_id, spec.name, kind, answer.reason
    )
    return Hit(spec.name, spec.action)


async def screen(
    client: httpx2.AsyncClient,
    checks: Sequence[RuleSpec],
    kind: Kind,
    text: str,
    session_id: str,
    metrics: Metrics,
) -> Hit | None:
    """Ask every checker about ``text``; the first rule (in order) that blocks it, or None."""
    if not checks:
        return None
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(_judge(client, spec, kind, text, session_id, metrics))
            for spec in checks
        ]
    for task in tasks:
        hit = task.result()
        if hit is not None:
            return hit
    return None


async def screened(
    given: Any,
    guard: EventGuard | None,
    checkers: Checkers,
    session_id: str,
    emit: Callable[[Event], None],
) -> Any:
    """A user's message or a tool's result (a client's or a server tool's) after the
    session's HTTP checker rules, their ``guardrail`` events given to ``emit``: a blocked message is None (it
    never reaches the model), a blocked tool result a failure naming the rule."""
    if guard is None or not guard.guardrails.input.checks:
        return given
    checks, metrics = guard.guardrails.input.checks, guard.metrics
    if isinstance(given, UserMessage | ContextMessage):
        hit = await screen(
            await checkers.client(), checks, "user", given.content, session_id, metrics
        )
        if hit is None:
            return given
        ends = type(given) is UserMessage  # a context ends no turn (``judged_input``)
        for event in guard.tripped([hit], "input", reply_to=given.id, ends=ends):
            emit(event)
        return None
    content = given.content
    text = content if isinstance(content, str) else msgspec.json.encode(content).decode()
    hit = await screen(await checkers.client(), checks, "tool_result", text, session_id, metrics)
    if hit is None:
        return given
    for event in guard.tripped([hit], "input", ends=False):
        emit(event)
    note = f"the result was withheld by the guardrail {hit.rule!r}"
    return msgspec.structs.replace(given, content=note, status="failure")
