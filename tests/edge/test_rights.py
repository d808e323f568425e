"""Which keys are issued now (``gateway.edge.rights.KeyRights``), and a policy cut to a config.

A keys file on disk, a redis-server of the test's own, the clock passed in.
The end-to-end checks (connections closed with 4401, tokens refused, on
every node) are tests/api/test_rights.py and tests/multinode/test_rights.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from gateway.edge.auth import KeyFile, KeyStoreUnavailable, RedisKeys, hash_key
from gateway.edge.rights import Credential, KeyRights
from gateway.sessions.policy import KeyPolicy, refusal, within
from gateway.store import open_store
from protocol.configuration import SessionConfig
from tests.edge.conftest import Keys
from tests.support.redis_server import RedisServer

A, B = hash_key("key-a"), hash_key("key-b")


def hmget_calls(url: str) -> int:
    """How many HMGETs the redis-server has answered (its own count: the round trips)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats").get("cmdstat_hmget", {"calls": 0})
    finally:
        client.close()
    return int(stats["calls"])


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


async def test_redis_answers_are_kept_briefly_and_forgotten_on_a_change(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")  # this test's own: it is killed at the end
    server.start()
    store = open_store(server.url, retry_window=0.2)
    try:
        await store.put_api_key(A, "alice")
        await store.put_api_key(B, "bob")
        now = [0.0]
        rights = KeyRights(None, RedisKeys(store), fresh=0.5, clock=lambda: now[0])
        alice, bob = Credential("alice", A), Credential("bob", B)
        before = hmget_calls(server.url)
        assert await rights.check([alice, bob]) == {alice, bob}
        assert hmget_calls(server.url) == before + 1  # one HMGET for every connection's key
        assert await store.remove_api_keys([A]) == 1
        assert await rights.alive(alice)  # a reconnect burst costs no round trip...
        assert hmget_calls(server.url) == before + 1
        now[0] = 0.6
        assert not await rights.alive(alice)  # ...for longer than `fresh`
        await store.put_api_key(A, "alice")
        assert not await rights.alive(alice)
        rights.forget([A])  # the bus said alice's key changed
        assert await rights.alive(alice)
        assert await rights.alive(Credential("bob", ""))  # an older token: by key id (HGETALL)
        server.kill()
        now[0] = 2.0
        with pytest.raises(KeyStoreUnavailable):
            await rights.check([alice])
    finally:
        await store.close()
        server.stop()


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
