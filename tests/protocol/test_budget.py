"""Bounded context (``protocol.budget.fit``): pure, so tested directly and with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.assembly import CANCELLED_NOTE, Message, results_message
from protocol.budget import CUT_NOTE, context_tokens_estimate, fit


def _size(messages: list[Message]) -> int:
    return sum(context_tokens_estimate(m.content) for m in messages)


def _turn(i: int, result_chars: int = 0) -> list[Message]:
    out = [Message(role="user", content=f"question {i}")]
    if result_chars:
        out.append(
            Message(role="assistant", content='<execute>\n[{"name":"read","args":{}}]\n</execute>')
        )
        out.append(results_message("x" * result_chars))
    out.append(Message(role="assistant", content=f"answer {i}\n<end>"))
    return out


def test_what_fits_is_untouched() -> None:
    history = _turn(1) + _turn(2)
    assert fit(history, 10_000) == history


def test_old_tool_results_are_shortened_first() -> None:
    history = _turn(1, result_chars=20_000) + _turn(2)
    out = fit(history, 1_000)
    assert [m.role for m in out] == [m.role for m in history]  # nothing dropped
    shortened = out[2].content
    assert "cut to fit the context budget" in shortened and len(shortened) < 1_000
    assert out[-2:] == history[-2:]
    assert _size(out) <= 1_000


def test_older_turns_are_dropped_with_a_note_and_the_last_turn_stays_whole() -> None:
    history = [m for i in range(300) for m in _turn(i)] + _turn(999, result_chars=3_000)
    out = fit(history, 1_500)
    assert _size(out) <= 1_500
    assert out[0].role == "user" and out[0].content.startswith(CUT_NOTE.split("—")[0])
    last_turn = _turn(999, result_chars=3_000)
    assert out[-len(last_turn) + 1 :] == last_turn[1:]
    assert out[-len(last_turn)].content.endswith(last_turn[0].content)


def test_the_last_turn_is_kept_even_over_budget() -> None:
    history = [*_turn(1), Message(role="user", content="y" * 10_000)]
    out = fit(history, 100)
    assert out[-1].content.endswith("y" * 10_000)


_messages = st.lists(
    st.one_of(
        st.builds(Message, role=st.just("user"), content=st.text(min_size=1, max_size=300)),
        st.builds(Message, role=st.just("assistant"), content=st.text(max_size=300)),
        st.builds(lambda n: results_message("r" * n), st.integers(0, 3_000)),
        st.just(Message(role="user", content=CANCELLED_NOTE)),
    ),
    max_size=40,
)


@given(_messages, st.integers(0, 3_000))
def test_fit_never_reorders_and_keeps_within_budget_or_the_last_turn(
    messages: list[Message], budget: int
) -> None:
    out = fit(messages, budget)
    if _size(messages) <= budget:
        assert out == messages
        return
    # Every kept message is an original one (maybe shortened or noted), in order.
    originals = [m.content for m in messages]
    position = -1
    for m in out:
        content = m.content.split("\n\n", 1)[1] if m.content.startswith("(Earlier") else m.content
        matches = [
            i
            for i, o in enumerate(originals)
            if i > position and (o == content or content.startswith(o[:400]))
        ]
        assert matches, f"{m!r} is not from the history"
        position = matches[0]
    assert out[-1].content.endswith(messages[-1].content) or "cut to fit" in out[-1].content
