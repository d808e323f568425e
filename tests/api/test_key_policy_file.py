"""A broken key policy file (issues 37 and 38): at start it is one line and exit 2;
on reload the node says so and keeps the policies it had, and a fixed file applies."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.client import Client
from gateway.client.client import ConfigureRefused
from protocol.events import Configured
from tests.api.conftest import Keys, NodesFactory

pytestmark = pytest.mark.timeout(60)

BROKEN = {
    "not TOML": ("[alice\nserver_tools = []\n", "is not valid TOML"),
    "an unknown field": ('[alice]\nserver_tool = ["read"]\n', "fields are providers"),
    "an unknown provider": (
        '[alice]\nproviders = ["opnai"]\n',
        "[alice]: providers: 'opnai' is not a provider this gateway knows; "
        "use one of sim, openai, gemini",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_policy_file_stops_the_start_in_one_line(case: str, tmp_path: Path) -> None:
    text, says = BROKEN[case]
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port=0", f"--key-policy-file={policy}"],
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "REDIS_URL": ""},
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"gateway: key_policy_file: {policy}")
    assert says in lines[0]
    assert "listening" not in done.stdout


class _Said(logging.Handler):
    """Wakes the test when the node logs a line containing ``words``."""

    def __init__(self, words: str) -> None:
        super().__init__(logging.ERROR)
        self.words = words
        self.lines: list[str] = []
        self.said = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if self.words in line:
            self.lines.append(line)
            self.said.set()


async def _allowed(c: Client, tools: list[str]) -> bool:
    try:
        await c.configure(server_tools=tools)
    except ConfigureRefused as refused:
        assert refused.code == "forbidden"
        return False
    return True


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_broken_reload_keeps_the_policies_and_a_fixed_file_applies(
    nodes: NodesFactory, keys: Keys, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[alice]\nserver_tools = ["read", "list"]\n')
    said = _Said("key policy file not reloaded")
    logging.getLogger("gateway.sessions.policy").addHandler(said)
    try:
        async with (
            nodes(1, key_policy_file=str(policy)) as (gw,),
            Client(gw.url, token=keys.keys["alice"]) as c,
        ):
            assert await _allowed(c, ["list"])
            assert not await _allowed(c, ["write"])
            for text, says in BROKEN.values():
                said.said.clear()
                policy.write_text(text + "# " + "x" * len(said.lines))  # a new size each time
                async with asyncio.timeout(10):
                    await said.said.wait()
                assert says in said.lines[-1]
                # The policies loaded before still hold: list allowed, write not.
                assert await _allowed(c, ["list"])
                assert not await _allowed(c, ["write"])
            # A fixed file applies, to the live session too (its `configured` says so).
            cut = asyncio.Event()
            c.on_event = lambda e: cut.set() if isinstance(e, Configured) else None
            policy.write_text('[alice]\nserver_tools = ["read"]\n')
            async with asyncio.timeout(10):
                await cut.wait()
            assert not await _allowed(c, ["list"])
            assert await _allowed(c, ["read"])
    finally:
        logging.getLogger("gateway.sessions.policy").removeHandler(said)
