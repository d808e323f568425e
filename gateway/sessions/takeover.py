"""What a node that took a session over does with the turn its last driver left cut.

The node loads the session (``SessionRuntime``), takes the totals its clients
were last shown from the log's last ``metric`` (and gives a turn closed
without one its metric), and then goes on with its last turn if that was in
flight: a batch of calls is finished from the journal
(``gateway.sessions.journal``), a step is rerun, and background calls whose
result the model has not had are reused or run again. It is its own room
because it runs once per takeover, before any client command, and reads the
log: no part of the live session's command path.
"""

from __future__ import annotations

import contextlib
import logging

from gateway.sessions.driver import TurnDriver
from gateway.sessions.journal import (
    read_journal,
    read_journal_calls,
    since_last_metric,
    unpersisted_step,
)
from gateway.store.base import EventLog, StoreError
from protocol.events import Call, Cancelled, End, Respond, Think
from protocol.journal import (
    JournalCall,
    background_in_flight,
    batch_in_flight,
    turn_in_flight,
)
from protocol.turn_events import Rerun, Resume, ResumeBackground

__all__ = ["rerun_interrupted"]

log = logging.getLogger("gateway.sessions.takeover")


async def rerun_interrupted(driver: TurnDriver, reason: str, events: EventLog) -> None:
    """After a takeover: if the last turn was in flight, mark it and go on with it.

    A batch in flight (history ends with its calls) is finished from the
    journal: outcomes the log holds are reused, the other calls run again
    under their own ids and keys (``Resume``). Otherwise the step is rerun.
    The rerun's span links to the cut turn's (``observer.follows``, from the meta).
    ``events``: the session's log, where the journal is read.
    """
    session_log, machine, sid = driver.log, driver.machine, driver.sid
    await _as_last_shown(driver, events)
    calls = batch_in_flight(session_log.history)
    if not calls and turn_in_flight(session_log.history):
        # Cut between its execute and its usage: the step's calls were sent
        # (a client may act on them) but history lacks them. The same calls.
        with contextlib.suppress(StoreError):
            items = await unpersisted_step(events, sid, session_log.last_seq)
            if items:
                session_log.persist(items)
                calls = batch_in_flight(session_log.history)
    if calls:
        journal = await _journal(events, sid, calls, session_log.last_seq)
        driver.command(machine.feed(Resume(reason, journal)), interrupt=False)
    elif turn_in_flight(session_log.history):
        driver.command(machine.feed(Rerun(reason)), interrupt=False)
    else:
        driver.observer.follows = ""
    in_batch = {call.id for call in calls}
    running = [c for c in background_in_flight(session_log.history) if c.id not in in_batch]
    if running:
        # Background calls whose result the model has not had: reused or run again
        # (due when the turn above ends, or at once).
        found = await _journal(events, sid, running, session_log.last_seq)
        driver.command(machine.feed(ResumeBackground(found)), interrupt=False)


async def _as_last_shown(driver: TurnDriver, events: EventLog) -> None:
    """The session's totals as its clients were last shown them (the meta has them only
    from a clean release), and a metric for a turn that closed without one: its node
    died between the turn's ``end`` (or ``cancelled``) and the provider's usage."""
    machine, observer = driver.machine, driver.observer
    try:
        shown, after = await since_last_metric(events, driver.sid, driver.log.last_seq)
    except StoreError as exc:
        log.warning("session %s: its last metric not read (%s)", driver.sid, exc)
        return
    total = machine.meter.total
    if shown is not None and shown.total.input + shown.total.output >= total.input + total.output:
        machine.meter.total = shown.total
        observer.cost_total = max(observer.cost_total, shown.cost.total)
    if any(type(event) is End or type(event) is Cancelled for event in after):
        text = [e.content for e in after if type(e) is Respond or type(e) is Think]
        driver.command(machine.meter.lost(sum(map(len, text))), interrupt=False)


async def _journal(
    events: EventLog, sid: str, calls: list[Call], last_seq: int
) -> tuple[JournalCall, ...]:
    """The journal of ``calls`` (``read_journal``); unread, every call runs again."""
    try:
        return await read_journal(events, sid, calls, last_seq)
    except StoreError as exc:
        # Without the outcomes every call runs again, each under its own key.
        log.warning("session %s: journal not read (%s); rerunning its calls", sid, exc)
        return read_journal_calls(calls)
