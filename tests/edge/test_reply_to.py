"""Replies name their command: a command's ``id`` comes back as ``reply_to`` on
its refusal and on the event that shows it took effect, through a real gateway."""

from __future__ import annotations

import base64

import msgspec
import pytest

from gateway.common.pcm import silence
from protocol.events import Cancelled, Configured, Error, Pong, User
from tests.edge.conftest import GatewayFactory
from tests.support.client import GatewayClient

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


def _error(events: list[object]) -> Error:
    error = events[-1]
    assert isinstance(error, Error), events
    return error


@memory_only
async def test_each_refusal_and_confirmation_names_its_command(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.send({"type": "ping", "id": "p-1"})
        pong = (await client.until(lambda e: isinstance(e, Pong)))[-1]
        assert isinstance(pong, Pong) and pong.reply_to == "p-1"

        await client.send({"type": "cancel", "id": "c-1"})  # no turn runs
        error = _error(await client.until(lambda e: isinstance(e, Error)))
        assert (error.code, error.reply_to) == ("no_turn", "c-1")

        # A frame that does not decode still names its id when it has one.
        await client.send({"type": "user", "content": 5, "id": "u-1"})
        error = _error(await client.until(lambda e: isinstance(e, Error)))
        assert (error.code, error.reply_to) == ("bad_frame", "u-1")
        await client.send({"type": "user", "content": "hi", "id": "x" * 129})
        error = _error(await client.until(lambda e: isinstance(e, Error)))
        assert error.code == "bad_frame" and "id" in error.content
        assert error.reply_to is msgspec.UNSET  # too long to echo

        await client.send(
            {"type": "approve", "id": "call_9", "digest": "d" * 64, "decision": "allow"}
        )
        error = _error(await client.until(lambda e: isinstance(e, Error)))
        assert (error.code, error.reply_to) == ("unknown_call", "call_9")

        audio = base64.b64encode(silence(0.02, 24000)).decode()
        await client.send({"type": "audio", "audio": audio, "id": "a-1"})
        error = _error(await client.until(lambda e: isinstance(e, Error)))
        assert (error.code, error.reply_to) == ("bad_frame", "a-1")

        await client.send({"type": "configure", "instructions": "Be brief.", "id": "cfg-1"})
        configured = (await client.until(lambda e: isinstance(e, Configured)))[-1]
        assert isinstance(configured, Configured) and configured.reply_to == "cfg-1"

        await client.send({"type": "user", "content": "hello", "id": "m-1"})
        events = await client.until_type("end")
        users = [e for e in events if isinstance(e, User)]
        assert [u.reply_to for u in users] == ["m-1"]
        await client.close()


@memory_only
async def test_a_cancel_confirmed_and_a_message_queued_behind_it_name_theirs(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        await client.send({"type": "user", "content": "tell me a long story", "id": "m-1"})
        await client.until(lambda e: isinstance(e, User))
        await client.send({"type": "cancel", "id": "c-1"})
        await client.send({"type": "user", "content": "hello", "id": "m-2"})
        events = await client.until(lambda e: isinstance(e, User) and e.content == "hello")
        cancelled = [e for e in events if isinstance(e, Cancelled)]
        assert [c.reply_to for c in cancelled] == ["c-1"], events
        assert events[-1].reply_to == "m-2"  # type: ignore[union-attr]
        await client.close()
