"""Limits: connections per key (429) and per node (503), turns per minute, tokens per day."""

from __future__ import annotations

import re

import pytest

from gateway.edge.server import Gateway
from protocol.events import Error, User
from tests.edge.conftest import GatewayFactory, Keys, http_get, metric_value, poll_until, refusal
from tests.support.client import GatewayClient, text_of

# A fixed wall clock for the limiter: 20 s into a minute, 12h into a UTC day.
NOW = 1_700_000_000.0
assert NOW % 60 == 20


def held(gw: Gateway, key: str) -> int:
    return len(gw.edges.slots._held.get(key, ()))


# --------------------------------------------------------------------- connections


async def test_connections_per_key_beyond_the_limit_are_429(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path), max_connections_per_key=2) as gw:
        first = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        second = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        status, body, headers = await refusal(gw.url, additional_headers=keys.bearer("alice"))
        assert status == 429
        assert "2 open connections" in body and "close one" in body
        assert "Retry-After" in headers
        other = await GatewayClient.connect(gw.url, headers=keys.bearer("bob"))  # per key
        await first.close()
        await poll_until(lambda: held(gw, "alice") == 1, "the closed connection's slot is freed")
        third = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        for c in (second, third, other):
            await c.close()
        await poll_until(lambda: gw.edges.open == 0, "every slot is freed")
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_connections_refused_total", 'reason="key_full"') == 1


async def test_refused_handshakes_do_not_keep_a_slot(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path), max_connections_per_key=1) as gw:
        for _ in range(3):  # 404 after the slot was taken: the slot comes back
            status, _, _ = await refusal(
                f"{gw.url}?session_id=nope", additional_headers=keys.bearer("alice")
            )
            assert status == 404
            await poll_until(lambda: held(gw, "alice") == 0, "the refused handshake's slot")
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_the_per_key_limit_holds_across_nodes(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    settings = {"api_keys_file": str(keys.path), "max_connections_per_key": 1}
    async with gateway_factory(**settings) as one, gateway_factory(**settings) as two:
        client = await GatewayClient.connect(one.url, headers=keys.bearer("alice"))
        status, _, _ = await refusal(two.url, additional_headers=keys.bearer("alice"))
        assert status == 429
        await client.close()
        await poll_until(lambda: held(one, "alice") == 0, "node one frees the slot")
        again = await GatewayClient.connect(two.url, headers=keys.bearer("alice"))
        await again.close()


async def test_a_full_node_answers_503_and_says_to_try_another(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(max_connections=1) as gw:
        client = await GatewayClient.connect(gw.url)
        status, body, _ = await refusal(gw.url)
        assert status == 503 and "another node" in body
        await client.close()
        await poll_until(lambda: gw.edges.open == 0, "the node has room again")
        again = await GatewayClient.connect(gw.url)
        await again.close()
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_connections_refused_total", 'reason="node_full"') == 1


# --------------------------------------------------------------------- turns per minute


async def test_turns_per_minute_are_limited_with_a_retry_after(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path), turns_per_minute=2) as gw:
        gw.node.limits.clock = lambda: NOW
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.turn("one")
        await client.turn("two")
        last = client.last_seq
        await client.user("three")
        refused = await client.next()
        assert isinstance(refused, Error) and refused.code == "rate_limited"
        assert re.search(r"retry after 40 s", refused.content), refused.content
        assert refused.seq == last  # a reply, not logged
        # Another key has its own budget; a new minute gives alice hers back.
        bob = await GatewayClient.connect(gw.url, headers=keys.bearer("bob"))
        assert text_of(await bob.turn("hi"), "respond") == "Echo: hi"
        gw.node.limits.clock = lambda: NOW + 60
        events = await client.turn("four")
        assert isinstance(events[0], User) and events[0].content == "four"
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_turns_refused_total", 'reason="rate_limited"') == 1
        await client.close()
        await bob.close()


async def test_a_message_during_a_turn_is_turn_active_and_not_counted(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    # Limits count per API key: a session without one (an open node) has no limits.
    settings = {"api_keys_file": str(keys.path), "turns_per_minute": 2}
    async with gateway_factory(**settings, sim_tokens_per_second=50.0) as gw:
        gw.node.limits.clock = lambda: NOW
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.user("a slow one")
        await client.until(lambda e: isinstance(e, User))
        await client.user("again")
        reply = await client.until(lambda e: isinstance(e, Error))
        assert isinstance(reply[-1], Error) and reply[-1].code == "turn_active"
        await client.until_type("end")
        await client.until_type("metric")
        counted = await gw.node.store.incr_window(f"turns:alice:{int(NOW // 60)}", 0, 120)
        assert counted == 1
        # The refused message took none of the minute's two turns: the second starts,
        # and the limit still holds after it.
        events = await client.turn("the second")
        assert isinstance(events[0], User) and events[0].content == "the second"
        await client.user("a third")
        refused = await client.next()
        assert isinstance(refused, Error) and refused.code == "rate_limited"
        await client.close()


async def test_a_listening_voice_sessions_typed_turns_are_counted(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    """A voice session's driver reads its upstream between turns too; the limit took a
    running driver for a running turn and counted none of its typed turns, so a key
    could pass its turns per minute by configuring input audio first."""
    async with gateway_factory(api_keys_file=str(keys.path), turns_per_minute=2) as gw:
        gw.node.limits.clock = lambda: NOW
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await client.send({"type": "configure", "input_audio": {"format": "pcm16", "rate": 24000}})
        await client.until_type("configured")
        await client.turn("one")
        await client.turn("two")
        await client.user("three")
        refused = await client.until(lambda e: isinstance(e, Error))
        assert isinstance(refused[-1], Error) and refused[-1].code == "rate_limited"
        await client.close()


# --------------------------------------------------------------------- tokens per day


async def test_tokens_per_day_refuse_new_turns_until_the_day_rolls_over(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path), tokens_per_day=100) as gw:
        gw.node.limits.clock = lambda: NOW
        client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        events = await client.turn("this turn may go over the quota; it finishes")
        assert text_of(events, "respond").startswith("Echo:")
        await client.user("one more")
        refused = await client.next()
        assert isinstance(refused, Error) and refused.code == "quota_exceeded"
        assert "00:00 UTC" in refused.content and "of its 100 tokens" in refused.content
        # The count is in the store, per key and day.
        used = await gw.node.store.incr_window(f"tokens:alice:{int(NOW // 86400)}", 0, 60)
        assert used > 100
        gw.node.limits.clock = lambda: NOW + 86400
        events = await client.turn("a new day")
        assert text_of(events, "respond") == "Echo: a new day"
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_turns_refused_total", 'reason="quota_exceeded"') == 1
        await client.close()


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_limits_off_touch_nothing(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory() as gw:
        assert not gw.node.limits.active and not gw.edges.slots.active
        client = await GatewayClient.connect(gw.url)
        await client.turn("free")
        await client.close()
        assert not gw.node.store._counters  # type: ignore[attr-defined]


# --------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_connections", -1),
        ("turns_per_minute", -5),
        ("tokens_per_day", -1),
        ("coalesce_after", -1),
        ("slow_client_timeout", -1.0),
        ("write_limit", 10),
        ("send_queue_frames", 2),
    ],
)
def test_out_of_range_edge_settings_name_the_setting(name: str, value: float) -> None:
    from gateway.config import ConfigError, load_config
    from gateway.edge.admission import validate

    with pytest.raises(ConfigError, match=name):
        validate(load_config({name: value}, env={}))


def test_serve_flags_and_environment_reach_the_config() -> None:
    from gateway.cli import build_parser
    from gateway.common.settings import flag_values
    from gateway.config import Config, load_config

    args = build_parser().parse_args(
        [
            "serve",
            "--api-keys-file=/k",
            "--api-keys-redis",
            "--insecure-no-auth",
            "--allowed-origins=https://a.example",
            "--max-connections=5",
            "--max-connections-per-key=2",
            "--turns-per-minute=30",
            "--tokens-per-day=1000",
            "--send-queue-frames=100",
            "--coalesce-after=10",
            "--write-limit=4096",
            "--slow-client-timeout=2.5",
        ]
    )
    config = load_config(flag_values(args, Config), env={"GATEWAY_TOKENS_PER_DAY": "7"})
    assert (config.api_keys_file, config.api_keys_redis, config.insecure_no_auth) == (
        "/k",
        True,
        True,
    )
    assert config.allowed_origins == "https://a.example"
    assert (config.max_connections, config.max_connections_per_key) == (5, 2)
    assert (config.turns_per_minute, config.tokens_per_day) == (30, 1000)  # flags win
    assert (config.send_queue_frames, config.coalesce_after, config.write_limit) == (100, 10, 4096)
    assert config.slow_client_timeout == 2.5
    assert load_config({}, env={"GATEWAY_TOKENS_PER_DAY": "7"}).tokens_per_day == 7
