"""Guardrails on a phone call (issue 41): the call's greeting is a spoken answer with a
card number in it; the caller hears the words before it and nothing after, the
transcript in the log stops at ``[redacted]``, and the provider keeps what was played."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from protocol.events import Cancelled, Guardrail, Respond
from tests.phone.test_calls import export, numbers_file, until, until_call
from tests.support.carrier import phone_gateway

pytestmark = pytest.mark.timeout(60)

RULES = """
[[rule]]
name = "no-cards"
on = "output"
action = "redact"
detect = "card"
"""
MS_PER_CHAR = 60


async def test_a_greeting_that_speaks_a_card_is_cut_before_the_caller_hears_it(
    tmp_path: Path,
) -> None:
    before = "Your card is "
    rules = tmp_path / "guardrails.toml"
    rules.write_text(RULES)
    sim_config = SimConfig(
        flavor="openai",
        api_key="sim-key",
        audio_ms_per_char=MS_PER_CHAR,
        tokens_per_second=40,
        chunk_size=4,
    )
    greeting = f"/raw {before}4242 4242 4242 4242, thanks!"
    async with (
        serve_sim(sim_config) as sim,
        phone_gateway(
            tmp_path,
            provider="openai",
            openai_base_url=sim.url,
            openai_api_key="sim-key",
            model="sim",
            guardrails=str(rules),
            phone_numbers_file=numbers_file(tmp_path, f'[defaults]\ngreeting = "{greeting}"\n'),
        ) as gw,
    ):
        call = gw.call()
        await call.dial()
        sid = await until_call(gw)
        await until(lambda: bool(sim.stats.truncations))  # cut, and the provider told
        await call.hang_up()
        await until(lambda: not gw.gateway.phone.control.calls)
        events = await export(gw, sid)
    said = "".join(e.content for e in events if isinstance(e, Respond))
    assert said == before + "[redacted]"
    assert [(e.rule, e.on) for e in events if isinstance(e, Guardrail)] == [("no-cards", "output")]
    assert any(isinstance(e, Cancelled) and e.content == "stopped by a guardrail" for e in events)
    heard_ms = len(call.audio_received) / 8  # μ-law at 8 kHz
    assert 0 < heard_ms <= len(before) * MS_PER_CHAR
    [kept] = sim.stats.truncations
    assert kept <= len(before) * MS_PER_CHAR  # the provider keeps what was sent
