"""agents-js (``@openai/agents-realtime``, unmodified, under Node) through the OpenAI door
of a ``gateway serve`` node: a text turn, then a turn whose tool the app declares and
runs, with an OpenAI and a Gemini model. Its packages are pinned in
``tests/openai_door/js/package-lock.json`` and installed with ``npm ci`` on first use."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.openai_door.conftest import MODELS
from tests.support.agents_js import agents_js as installed_agents_js
from tests.support.procs import NodeProcess

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def agents_js() -> Path:
    return installed_agents_js()


@pytest.mark.parametrize("model", MODELS)
async def test_agents_js_has_a_text_turn_and_runs_its_own_tool(
    node: NodeProcess, agents_js: Path, model: str
) -> None:
    url = f"{node.base}/openai/v1/realtime?model={model}"
    proc = await asyncio.create_subprocess_exec(
        "node",
        "agents_js_turns.mjs",
        url,
        model,
        cwd=agents_js,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out + err).decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["tool_calls"] == ["Paris"]  # run by the app, with the model's arguments
    first, after_tool = result["texts"][0], result["texts"][-1]
    assert "hello" in first.lower()
    assert after_tool  # the model answered with the tool's output


async def test_agents_js_speaking_keeps_its_question_before_the_answer_in_history(
    node: NodeProcess, agents_js: Path
) -> None:
    """agents-js speaks at a microphone's pace and is answered in speech; its own
    history (built from the items' events) holds the user's spoken item, then the
    answer. The answer's speech overtook the user's turn in its log round and showed
    the response first, and agents-js put the answer above the question."""
    model = "gpt-realtime-2.1"
    proc = await asyncio.create_subprocess_exec(
        "node",
        "agents_js_voice.mjs",
        f"{node.base}/openai/v1/realtime?model={model}",
        model,
        cwd=agents_js,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out + err).decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["errors"] == []
    assert result["history"] == [["message", "user"], ["message", "assistant"]], result
