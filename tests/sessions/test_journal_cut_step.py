"""A takeover between a step's ``execute`` and its usage: the step's calls were
sent to clients but history lacks them; ``unpersisted_step`` rebuilds them from
the log so the new driver finishes the same calls (same ids) instead of asking
the model again."""

from __future__ import annotations

import pytest

from gateway.sessions.journal import unpersisted_step
from gateway.store.base import LogEntry
from gateway.store.memory import MemoryStore
from protocol.events import Call, Event, Execute, Metric, Think, User, encode
from protocol.metering import ZERO_USAGE

pytestmark = pytest.mark.timeout(10)

SID = "s1"


async def _logged(events: list[Event]) -> MemoryStore:
    store = MemoryStore()
    assert await store.acquire_lease(SID, "n1", 30.0)
    entries = [
        LogEntry(seq, encode(type(e)(**{**_fields(e), "seq": seq})))
        for seq, e in enumerate(events, 1)
    ]
    await store.append(SID, "n1", entries)
    return store


def _fields(event: Event) -> dict[str, object]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


STEP: list[Event] = [
    User(content="book it"),
    Think(content="I will "),
    Think(content="book."),
    Call(content='{"name":"book","args":{"n":1}}', id="call_1", runs_on="client"),
    Call(content='{"name":"pay","args":{}}', id="call_2"),
    Execute(),
]


async def test_a_step_cut_after_its_execute_comes_back_with_its_calls_and_ids() -> None:
    store = await _logged(STEP)
    items = await unpersisted_step(store, SID, len(STEP))
    assert [type(i) for i in items] == [Think, Call, Call]
    assert items[0].content == "I will book."  # type: ignore[union-attr]
    calls = [i for i in items if isinstance(i, Call)]
    assert [(c.id, c.runs_on) for c in calls] == [("call_1", "client"), ("call_2", "gateway")]


async def test_a_step_whose_usage_was_logged_is_in_history_already() -> None:
    events = [*STEP, Metric(step=ZERO_USAGE, total=ZERO_USAGE)]
    store = await _logged(events)
    assert await unpersisted_step(store, SID, len(events)) == []


async def test_a_step_cut_before_its_execute_is_rerun() -> None:
    events = STEP[:-1]
    store = await _logged(events)
    assert await unpersisted_step(store, SID, len(events)) == []


async def test_a_cut_step_of_large_events_is_read_a_page_at_a_time() -> None:
    # 300 KB think deltas: the step spans several pages of the log's bytes.
    big = [Think(content="x" * 300_000) for _ in range(8)]
    events = [Metric(step=ZERO_USAGE, total=ZERO_USAGE), *STEP[:1], *big, *STEP[3:]]
    store = await _logged(events)
    pages: list[int] = []
    read_log = store.read_log

    async def counted(*args: object, **kwargs: object) -> list[LogEntry]:
        page = await read_log(*args, **kwargs)  # type: ignore[arg-type]
        pages.append(sum(len(e.data) for e in page))
        return page

    store.read_log = counted  # type: ignore[method-assign]
    items = await unpersisted_step(store, SID, len(events))
    assert [type(i) for i in items] == [Think, Call, Call]
    assert len(items[0].content) == 8 * 300_000  # type: ignore[union-attr]
    assert len(pages) > 1 and max(pages) <= (1 << 20) + 400_000
