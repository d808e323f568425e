"""The recovery steps of the turn machine: a provider lost, silent or failing mid-step.

``TurnMachine`` (``protocol.turn``) inherits these transitions, as it does
``protocol.turn_tools``'s (their base) and ``protocol.turn_voice``'s: they are the machine's
own (same state, same rules — see that module), kept apart because they are one
job, deciding what a step that lost its provider becomes. A lost connection
reruns the step after a backoff (``upstream_retries`` times, each rerun's
partial output withdrawn by an ``interrupt``) or on the fallback provider at
once; a silent provider gets one rerun on a new connection; a refusal ends the
turn with an ``error``; a step whose answer or calls were complete only loses
its usage report, which is estimated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from protocol.events import End, Error, Interrupt, Respond, Think, Usage
from protocol.spoken import UNHEARD, SpokenAnswer
from protocol.steps import StepRecorder
from protocol.turn_events import Action, Backoff, DropUpstream, UpstreamFailed
from protocol.turn_state import BACKOFF, CANCELLING, ENDING, NOTHING, STOPPING, STREAMING
from protocol.turn_tools import ToolSteps

__all__ = ["RecoverySteps"]


class RecoverySteps(ToolSteps):
    """The recovery transitions of ``TurnMachine`` (which holds the state named here)."""

    # The step's own state these transitions write (the rest is ``ToolSteps``'s and
    # ``TurnMachine``'s): how often the step was retried, whether it went silent once,
    # and the recorder's append (the hot path's, rebound with each new recorder).
    __slots__ = ("_attempt", "_chunk", "_stalled")

    spoken: SpokenAnswer
    upstream_retries: int
    _chunk: Callable[[Respond | Think], None]
    _attempt: int
    _stalled: bool

    def _count_usage(self, usage: Usage | None, estimated: bool) -> None:
        """Count an attempt's usage (without a report: its output estimated from the text seen)."""
        self.meter.count(
            usage,
            estimated,
            lambda: len(self._parser.accepted_text) + self.spoken.chars,
        )

    # The machine's own steps these transitions lead to (``protocol.turn``).

    def _new_attempt(self) -> None:
        raise NotImplementedError

    def _fail(self, out: list[Action], content: str, *, code: str = "upstream") -> list[Action]:
        raise NotImplementedError

    def _upstream_lost(
        self, reason: str, *, fatal: bool = False, fallback: str = ""
    ) -> Sequence[Action]:
        state = self.state
        if state is CANCELLING:
            self._count_usage(None, True)
            return self._close([DropUpstream()])
        if state is ENDING:
            # The answer is complete (end was sent, with it in history); only its
            # usage report is lost.
            self._count_usage(None, True)
            return self._close([DropUpstream()])
        if state is STOPPING:
            # The calls are complete: run them; the next request reopens from history.
            self._count_usage(None, True)
            return [DropUpstream(), *self._tool_step([])]
        if state is not STREAMING:
            return NOTHING  # a best-effort action failed while nothing was asked of the model
        self._count_usage(None, True)
        self._attempt += 1
        attempt = self._attempt
        out: list[Action] = [DropUpstream(), *self.spoken.release(UNHEARD)]
        if attempt > self.upstream_retries or (fatal and not fallback):
            problem = "refused the request" if fatal and not fallback else "is unreachable"
            out += [
                Error(
                    code="upstream",
                    content=f"the model's API {problem} ({reason}); "
                    "the turn was stopped — send your message again later",
                ),
                self._recorder.persist(),
                End(),
            ]
            return self._close(out)
        if fallback:
            if self._recorder.emitted:
                out.append(
                    Interrupt(
                        content=f"the model's API failed ({reason}); continuing with "
                        f"{fallback} — discard this step's partial output"
                    )
                )
            self._recorder = StepRecorder()
            self._chunk = self._recorder.chunk
            self._new_attempt()
            self.state = BACKOFF
            out.append(Backoff(attempt=attempt, delay=0.0))
            return out
        if self._recorder.emitted:
            out.append(
                Interrupt(
                    content=f"upstream connection lost ({reason}); "
                    "this step is being rerun — discard its partial output"
                )
            )
        self._recorder = StepRecorder()  # the partial step is not history
        self._chunk = self._recorder.chunk
        self._new_attempt()
        self.state = BACKOFF
        out.append(Backoff(attempt=attempt, delay=min(0.1 * 2**attempt, 2.0)))
        return out

    def _upstream_stalled(self, seconds: float) -> Sequence[Action]:
        """Nothing from the provider for ``seconds``: rerun the step once on a new
        connection, then end the turn (``upstream_timeout``)."""
        silent = f"the model's API sent nothing for {seconds:g}s"
        if self.state is not STREAMING:
            # The answer or the calls are complete (or cancelled): as a lost connection.
            return self._upstream_lost(silent)
        self._count_usage(None, True)
        if self._stalled:
            return self._fail(
                [],
                f"{silent}, again after the step was retried on a new connection; the turn "
                "was stopped — send your message again, and if it keeps happening tell the "
                "operator (the provider may be overloaded)",
                code="upstream_timeout",
            )
        self._stalled = True
        partial = " — discard its partial output" if self._recorder.emitted else ""
        out: list[Action] = [DropUpstream(stop=True), *self.spoken.release(UNHEARD)]
        out.append(
            Interrupt(content=f"{silent}; this step is being rerun on a new connection{partial}")
        )
        self._recorder = StepRecorder()  # the partial step is not history
        self._chunk = self._recorder.chunk
        self._new_attempt()
        self.state = BACKOFF
        out.append(Backoff(attempt=self._attempt + 1, delay=0.0))
        return out

    def _upstream_failed(self, failed: UpstreamFailed) -> Sequence[Action]:
        state = self.state
        if state is CANCELLING or state is ENDING:
            # The closing event is out: end the wait for a usage report that may not come.
            return self._upstream_lost(f"{failed.code}: {failed.message}")
        if state is not STREAMING and state is not STOPPING:
            return NOTHING
        if failed.fallback:
            return self._upstream_lost(failed.code, fatal=True, fallback=failed.fallback)
        self._count_usage(None, True)
        return self._fail([], f"the model's API reported {failed.code}: {failed.message}")
