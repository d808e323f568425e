"""Calls that wait for a user's decision before they run: pure bookkeeping.

A tool may require approval (the operator's tools file, the key's policy, the
session's configuration). Its call is announced as ``approval_required``
with a digest of exactly that call (``protocol.journal.approval_digest``);
it runs only after an ``approve`` carrying that digest and ``allow``. A
decision is used once: the call leaves the pending set, and a second
``approve`` for it is refused saying it was decided. A wrong digest is
refused and the call keeps waiting. Nobody deciding within the timeout is a
deny. ``protocol.batch`` holds one of these per batch.
"""

from __future__ import annotations

from typing import Final

from protocol.calls import ToolCall, ToolResult
from protocol.events import Approval, ApprovalRequired, Approve, Error
from protocol.journal import approval_digest
from protocol.turn_events import Refuse

__all__ = ["DENIED", "PendingApprovals", "denied_result"]

DENIED: Final = (
    "the user denied this call, so it was not run; do not try it again unless the user "
    "asks you to — tell the user it was not done, or find another way"
)


def denied_result(name: str, *, timeout: float | None = None) -> ToolResult:
    """What the model reads for a call the user denied (or left undecided)."""
    if timeout is None:
        return ToolResult(tool=name, status="failure", content=DENIED)
    return ToolResult(
        tool=name,
        status="failure",
        content=f"nobody approved this call within {timeout:g}s, so it was not run; ask the "
        "user whether to do it, and call it again only if they say so",
    )


class PendingApprovals:
    """The calls of one batch that wait for a decision: call id → (slot, digest)."""

    __slots__ = ("_pending", "_settled")

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, str]] = {}
        self._settled: dict[str, str] = {}  # decided or given up → why (for refusals)

    def clear(self) -> None:
        self._pending = {}
        self._settled = {}

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(self._pending)

    def ask(self, index: int, call_id: str, call: ToolCall) -> ApprovalRequired:
        """Call ``call_id`` (slot ``index``) waits: the event that says so."""
        digest = approval_digest(call_id, call.name, call.args)
        self._pending[call_id] = (index, digest)
        return ApprovalRequired(id=call_id, name=call.name, args=call.args, digest=digest)

    def wait_again(self, index: int, call_id: str, call: ToolCall) -> None:
        """After a takeover: the call's ``approval_required`` is logged, its decision not."""
        self._pending[call_id] = (index, approval_digest(call_id, call.name, call.args))

    def decide(self, given: Approve) -> tuple[int, Approval] | Refuse:
        """The slot ``given`` decides and the logged ``approval``, or why it is refused."""
        waiting = self._pending.get(given.id)
        if waiting is None:
            why = self._settled.get(given.id, "is not waiting for approval")
            return Refuse(
                Error(
                    code="unknown_call",
                    content=f"call {given.id[:80]!r} {why}; approve only a call whose "
                    "approval_required event has no approval event yet, once",
                )
            )
        index, digest = waiting
        if given.digest != digest:
            return Refuse(
                Error(
                    code="wrong_digest",
                    content=f"the digest does not match call {given.id!r}: an approval applies "
                    "only to exactly the call shown; send the digest of its approval_required "
                    "event (the call still waits for a decision)",
                )
            )
        del self._pending[given.id]
        self._settled[given.id] = f"was already decided ({given.decision})"
        return index, Approval(id=given.id, digest=digest, decision=given.decision)

    def time_out(self, seconds: float) -> list[tuple[int, Approval]]:
        """Every call still undecided is denied: nobody decided within ``seconds``."""
        out = [
            (index, Approval(id=call_id, digest=digest, decision="deny", reason="timeout"))
            for call_id, (index, digest) in self._pending.items()
        ]
        for call_id in self._pending:
            self._settled[call_id] = f"was denied after {seconds:g}s without a decision"
        self._pending = {}
        return out

    def settle(self, why: str) -> None:
        for call_id in self._pending:
            self._settled[call_id] = why
        self._pending = {}
