"""A ``kill -9`` of the node holding a WebRTC call, mid-answer: the client offers again
to another node with the door's session extension (``session_id`` + ``after_event``) and
its new call gets the rest, each event once (the broken response fails, the rerun
answers in full), and its microphone is heard there.

The new call's microphone sends from its first moment, while the dead node's lease still
holds the session: its frames are dropped until the new node drives the session, not
refused (a refusal is an ``error`` that failed the broken response early and hid its
``failed`` end).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.multinode.conftest import (
    NodeFactory,
    SimFactory,
    durable_redis,
    start_node,
    start_sim,
)
from tests.voice.conftest import utterance
from tests.webrtc.conftest import RATE, Peer

__all__ = ["durable_redis", "start_node", "start_sim"]

pytestmark = pytest.mark.timeout(120)
MESSAGE = "please echo this whole sentence back to me, slowly and carefully"
MODEL = "gpt-realtime-2.1"
_TEXT = ("response.output_text.delta", "response.output_audio_transcript.delta")


def _calls(node_base: str) -> str:
    return node_base.replace("ws://", "http://") + f"/openai/v1/realtime/calls?model={MODEL}"


def _say(peer: Peer, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    peer.send(type="conversation.item.create", item=item)
    peer.send(type="response.create")


async def test_kill_9_mid_answer_then_the_call_resumes_on_another_node(
    start_sim: SimFactory, start_node: NodeFactory
) -> None:
    sim = start_sim("--tokens-per-second", "20")
    a = start_node(sim, "node-a")
    b = start_node(sim, "node-b")
    first = Peer()
    try:
        assert (await first.call(_calls(a.base))).status == 201
        sid = (await first.until("session.created"))[-1]["session"]["id"]
        _say(first, MESSAGE)
        await first.until(*_TEXT)  # mid-answer
        a.kill()  # the call's media and channel go with it: no close reaches the client
    finally:
        await first.close()
    last = first.seen[-1]["event_id"]  # the last event the client took

    again = Peer()
    try:
        url = f"{_calls(b.base)}&session_id={sid}&after_event={last}"
        assert (await again.call(url)).status == 201
        rest: list[dict[str, Any]] = []
        while True:  # the broken response's end (failed), then the rerun's (completed)
            rest += await again.until("response.done", timeout=30)
            if rest[-1]["response"]["status"] == "completed":
                break
        again.mic.say(utterance(0.5, RATE))  # the new node hears the microphone
        spoken = await again.until("response.done", timeout=30)
    finally:
        await again.close()
    events = first.seen + rest
    # Nothing logged twice. (The answer's speech, a call's default, is unlogged: its
    # ``evt_SEQ_NxK`` ids count per connection, docs/openai-door.md.)
    ids = [e["event_id"] for e in events if "x" not in e["event_id"]]
    assert len(ids) == len(set(ids))
    assert "session.created" not in [e["type"] for e in rest]
    statuses = [e["response"]["status"] for e in rest if e["type"] == "response.done"]
    assert statuses == ["failed", "completed"]  # the broken one, then the rerun
    assert not [e for e in rest if e["type"] == "error"]
    text = "".join(e["delta"] for e in rest if e["type"] in _TEXT)
    assert f"Echo: {MESSAGE}" in text
    assert "input_audio_buffer.speech_started" in [e["type"] for e in spoken]
