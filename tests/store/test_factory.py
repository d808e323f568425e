"""``open_store``: which store a URL gives, and with which settings."""

from __future__ import annotations

import pytest

from gateway.store import MemoryStore, RedisStore, open_store


@pytest.mark.parametrize("url", [None, "", "memory://"])
async def test_no_url_is_the_memory_store(url: str | None) -> None:
    store = open_store(url, ttl=60.0, max_log=50)
    assert isinstance(store, MemoryStore)
    assert store.kind == "memory"
    assert (store.ttl, store.max_log) == (60.0, 50)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/1", "unix:///run/redis/redis.sock"],
)
async def test_redis_urls_are_the_redis_store(url: str) -> None:
    store = open_store(url, prefix="app", ttl=60.0, max_log=50)  # nothing is contacted
    try:
        assert isinstance(store, RedisStore)
        assert store.kind == "redis"
        assert (store.prefix, store.ttl, store.max_log) == ("app", 60.0, 50)
    finally:
        await store.close()


async def test_the_factory_store_works(redis_url: str) -> None:
    store = open_store(redis_url)
    try:
        assert await store.ping()
        assert await store.create_session("s1", {"owner": "n1"})
    finally:
        await store.close()


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis:/oops", "postgres://db"])
def test_other_urls_say_what_is_supported(url: str) -> None:
    with pytest.raises(ValueError, match=r"memory://.*redis://"):
        open_store(url)
