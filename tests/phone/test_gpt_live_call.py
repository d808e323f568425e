"""A phone call answered by GPT-Live (``gpt-live-1.1`` on the openai provider).

The carrier stand-in dials as Twilio does and speaks espeak-ng μ-law; the
gateway resamples it to GPT-Live's PCM16 24 kHz on ``/v1/live/sessions``
(the simulator's live flavour), and the model's spoken answer comes back to
the caller as μ-law, its transcript in the session's log.
"""

from __future__ import annotations

from pathlib import Path

from gateway.common.pcm import mulaw_decode, rms
from gateway.sim.live import LiveConnection
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from protocol.events import Respond, User
from tests.phone.test_calls import HELLO, call_sid, export, until
from tests.support.carrier import espeak, phone_gateway

KEY = "live-phone-key"


async def test_a_call_is_heard_and_answered_aloud_by_gpt_live(tmp_path: Path) -> None:
    async with serve_sim(SimConfig(flavor="openai", api_key=KEY, tokens_per_second=200)) as sim:
        settings = {
            "provider": "openai",
            "openai_base_url": sim.url,
            "openai_api_key": KEY,
            "model": "gpt-live-1.1",
        }
        async with phone_gateway(tmp_path, **settings) as gw:
            call = gw.call(parameters={"from": "+15550001111", "to": "+15550002222"})
            await call.dial()
            await call.say(espeak(HELLO))
            await call.answered()
            await call.heard_all()
            live = [conn for conn in sim.live() if isinstance(conn, LiveConnection)]
            sid = call_sid(gw)
            await call.hang_up()
            await until(lambda: not gw.gateway.phone.control.calls)
            events = await export(gw, sid)
    # GPT-Live only: one connection in all, to /v1/live/sessions (none to /v1/realtime).
    assert len(live) == 1 and sim.stats.connections_total == 1
    assert call.media_received > 0
    assert rms(mulaw_decode(bytes(call.audio_received))) > 1000  # the model's speech
    [user] = [e for e in events if isinstance(e, User)]
    assert user.source == "audio" and user.content.startswith("(speech")
    assert "".join(e.content for e in events if isinstance(e, Respond)).startswith("Echo: (speech")
