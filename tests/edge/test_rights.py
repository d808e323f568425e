"""Which keys are issued now (``gateway.edge.rights.KeyRights``), and a policy cut to a config.

No sockets: a keys file on disk, a fake Redis hash, the clock passed in.
The end-to-end checks (connections closed with 4401, tokens refused, on
every node) are tests/api/test_rights.py and tests/multinode/test_rights.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.edge.auth import KeyFile, KeyStoreUnavailable, RedisKeys, hash_key
from gateway.edge.rights import Credential, KeyRights
from gateway.sessions.policy import KeyPolicy, refusal, within
from protocol.configuration import SessionConfig
from tests.edge.conftest import Keys

A, B = hash_key("key-a"), hash_key("key-b")


class FakeRedisKeys(RedisKeys):
    """The Redis keys hash as a dict (digest → key id), counting the round trips."""

    def __init__(self, issued: dict[str, str]) -> None:
        self.hash_ = issued
        self.calls = 0
        self.down = False

    async def issued(self, digests: Sequence[str]) -> dict[str, str]:
        self.calls += 1
        if self.down:
            raise KeyStoreUnavailable("connection refused")
        return {d: self.hash_[d] for d in digests if d in self.hash_}

    async def key_ids(self) -> set[str]:
        self.calls += 1
        return set(self.hash_.values())


async def test_the_keys_file_answers_for_its_keys_and_a_reload_revokes(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "keys")
    alice = keys.add("alice")
    keys.add("bob")
    key_file = KeyFile(keys.path, check_interval=0.0)
    rights = KeyRights(key_file, None)
    cred = Credential("alice", hash_key(alice))
    assert await rights.alive(cred)
    assert not await rights.alive(Credential("bob", hash_key(alice)))  # a digest is one id's
    assert await rights.alive(Credential("alice", ""))  # an older token: by key id
    del keys.keys["alice"]
    keys.write()
    key_file.poll()
    assert await rights.check([cred, Credential("alice", "")]) == set()
    assert not await rights.alive(cred)


async def test_redis_answers_are_kept_briefly_and_forgotten_on_a_change() -> None:
    now = [0.0]
    redis = FakeRedisKeys({A: "alice", B: "bob"})
    rights = KeyRights(None, redis, fresh=0.5, clock=lambda: now[0])
    alice, bob = Credential("alice", A), Credential("bob", B)
    assert await rights.check([alice, bob]) == {alice, bob}
    assert redis.calls == 1  # one HMGET for every connection's key
    del redis.hash_[A]
    assert await rights.alive(alice)  # a reconnect burst costs no round trip...
    now[0] = 0.6
    assert not await rights.alive(alice)  # ...for longer than `fresh`
    redis.hash_[A] = "alice"
    assert not await rights.alive(alice)
    rights.forget([A])  # the bus said alice's key changed
    assert await rights.alive(alice)
    assert await rights.alive(Credential("bob", ""))  # an older token: by key id (HGETALL)
    redis.down = True
    now[0] = 2.0
    with pytest.raises(KeyStoreUnavailable):
        await rights.check([alice])


def test_within_cuts_a_configuration_to_a_tightened_policy() -> None:
    config = SessionConfig(
        instructions="be brief", server_tools=("read", "list"), provider="gemini", model="g-1"
    )
    assert within(KeyPolicy(), config) is config
    cut = within(KeyPolicy(server_tools=("read",), providers=("sim",)), config)
    assert cut == SessionConfig(instructions="be brief", server_tools=("read",))
    assert refusal(KeyPolicy(server_tools=("read",), providers=("sim",)), cut) is None
    only_model = within(KeyPolicy(models=("g-2",)), config)
    assert (only_model.provider, only_model.model) == ("gemini", "")
    assert within(KeyPolicy(server_tools=()), SessionConfig()) == SessionConfig()  # None: all
