"""Tool calls that do not block the turn: what runs in the background.

A tool marked ``background`` (a server tool in the tools file, a client
tool in ``configure``) answers the model at once with ``STARTED`` and the
turn goes on; its real result comes later. When it does, it is logged as
the call's one ``result`` event at once and *due*: the model gets it as the
next step — at once when no turn runs, else when the running turn ends.
Cancel and barge-in cancel the calls still running when the session says so
(each gets its ``result`` saying it was cancelled). Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Final

from protocol.calls import ToolResult, encode_results, result_payload
from protocol.events import Result

__all__ = ["STARTED", "BackgroundCalls", "result_event", "started_result"]

STARTED: Final = (
    "started in the background; its result comes in a later message (the same tool "
    "name). Go on meanwhile, and do not call it again for the same thing"
)


def started_result(name: str) -> ToolResult:
    """What the model reads for a background call in its batch's results."""
    return ToolResult(tool=name, status="success", content=STARTED)


class BackgroundCalls:
    """The session's background calls: those running, and results due to the model."""

    __slots__ = ("due", "limit", "native", "running")

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit  # calls that may run at once (the session's setting)
        self.running: dict[str, str] = {}  # call id → tool name
        self.native: dict[str, str] = {}  # call id → the provider's id (a native call)
        # Logged, not yet handed to the model (in order): call id → its result.
        self.due: list[tuple[str, ToolResult]] = []

    @property
    def room(self) -> int:
        """How many more calls may start now."""
        return max(self.limit - len(self.running), 0)

    def full(self) -> str:
        """The result of a call that did not start because ``limit`` calls run."""
        return (
            f"not started: a session may have at most {self.limit} background calls "
            "running at once (this block's earlier ones included); call it again after "
            "some of their results have come"
        )

    def start(self, call_id: str, name: str, native_id: str = "") -> None:
        self.running[call_id] = name
        if native_id:
            self.native[call_id] = native_id

    def done(self, call_id: str, result: ToolResult) -> Result | None:
        """A running call's result: its ``result`` event (None: not running here)."""
        if self.running.pop(call_id, None) is None:
            return None
        self.due.append((call_id, result))
        return result_event(call_id, result)

    def cancel(self, why: str) -> list[Result]:
        """Every running call is cancelled: their ``result`` events (not due: the user
        no longer wants them; history keeps them for a context rebuilt later)."""
        out = [
            result_event(call_id, ToolResult(tool=name, status="failure", content=why))
            for call_id, name in self.running.items()
        ]
        for call_id in self.running:
            self.native.pop(call_id, None)
        self.running = {}
        return out

    def take_due(self) -> list[tuple[str, ToolResult]]:
        due, self.due = self.due, []
        return due

    def forget(self) -> None:
        """The session stops on this node: the next one finds them in the journal."""
        self.running = {}
        self.due = []
        self.native = {}


def result_event(call_id: str, result: ToolResult) -> Result:
    """Call ``call_id``'s one ``result`` event (also its history item once delivered)."""
    return Result(content=encode_results((result,)), payload=result_payload((result,)), id=call_id)
