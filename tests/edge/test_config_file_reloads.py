"""Rewriting the keys file or the key policy file while the node runs (``ReloadedFile``):
a broken version is logged once and the last good one keeps serving; a fixed one is
picked up; an oversized one is refused unread; a large legal one is parsed off the loop.

Before, a 5 MB keys file held the loop 250 ms at each reload, a 1.6 MB policy file
1.2 s, and a broken one was parsed again at every check (~1 s of every second)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.common.reloaded_file import ReloadedFile
from gateway.common.settings import ConfigError
from gateway.edge.auth import MAX_KEYS_FILE_BYTES, KeyFile, hash_key
from gateway.sessions.guardrail_rules import MAX_FILE_BYTES, GuardrailsFile
from gateway.sessions.policy import MAX_POLICY_FILE_BYTES, KeyPolicies
from tests.support.stall import LoopWatch

pytestmark = pytest.mark.timeout(60)


def _key_lines(n: int) -> str:
    """``n`` keys file lines (72 bytes each), ``k0`` … ``k{n-1}``."""
    return "".join(f"k{i}:{hashlib.sha256(str(i).encode()).hexdigest()}\n" for i in range(n))


def _policy_tables(n: int) -> str:
    return "".join(f'[k{i}]\ninstructions = "x{i}"\n' for i in range(n))


def _rewrite(path: Path, text: str, when: int) -> None:
    """Replace ``path`` as editors and ``gateway keys`` do (a new inode, its own mtime)."""
    new = path.with_suffix(".new")
    new.write_text(text)
    new.chmod(0o600)
    os.utime(new, (when, when))
    os.replace(new, path)


def _bound(on_the_loop: float) -> float:
    """The longest the loop may wait while a file that took ``on_the_loop`` s to parse is
    parsed in a thread: ~20-40 ms here (the GIL's switches), 185 ms on a machine so loaded
    that the parse took 3.5 s; parsed on the loop, the wait is the whole parse."""
    return max(0.1, on_the_loop / 5)


def _errors(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and words in r.getMessage()
    ]


async def test_a_broken_large_keys_file_is_logged_once_and_the_keys_keep_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    _rewrite(path, f"alice:{hash_key('key-a')}\n", 1)
    keys = KeyFile(path, check_interval=0.0)
    caplog.set_level(logging.INFO, logger="gateway")
    # Large enough to be read off the loop; its last line is broken.
    _rewrite(path, _key_lines(2_000) + "this line is broken\n", 2)
    for _ in range(5):  # every check of the rights watch, and every handshake's lookup
        keys.poll()
        await keys.settled()
        assert keys.lookup(hash_key("key-a")) == "alice"
    [said] = _errors(caplog, "api keys file not reloaded")
    assert "keeping the 1 keys loaded" in said and "line 2001" in said
    assert "key_id:sha256hex" in said and "read again when it changes" in said
    # The fixed file is picked up: alice is revoked by it, the new keys are in.
    _rewrite(path, _key_lines(2_000), 3)
    keys.poll()
    await keys.settled()
    assert keys.lookup(hash_key("key-a")) is None
    assert len(keys) == 2_000 and keys.issued(hashlib.sha256(b"1999").hexdigest()) == "k1999"
    assert len(_errors(caplog, "api keys file")) == 1


async def test_a_broken_policy_file_is_logged_once_and_the_policies_keep_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "policy.toml"
    _rewrite(path, '[alice]\nserver_tools = ["read"]\n', 1)
    policies = KeyPolicies(path, check_interval=0.0)
    caplog.set_level(logging.INFO, logger="gateway")
    _rewrite(path, _policy_tables(200) + "[broken\n", 2)
    for _ in range(5):
        policies.poll()
        await policies.settled()
        assert policies.get("alice").server_tools == ("read",)
    [said] = _errors(caplog, "key policy file not reloaded")
    assert "is not valid TOML" in said and "read again when it changes" in said
    _rewrite(path, _policy_tables(200), 3)
    policies.poll()
    assert await policies.settled() == 2
    assert (
        policies.get("alice").server_tools is None and policies.get("k199").instructions == "x199"
    )
    assert len(_errors(caplog, "key policy file")) == 1


async def test_a_sighup_reads_the_file_again_even_unchanged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator who fixed what was wrong outside the file (its mode, a missing
    environment variable) asks again with SIGHUP: that is not deduplicated."""
    path = tmp_path / "keys"
    _rewrite(path, f"alice:{hash_key('key-a')}\n", 1)
    keys = KeyFile(path, check_interval=0.0)
    caplog.set_level(logging.ERROR, logger="gateway")
    _rewrite(path, "garbage\n", 2)
    assert keys.reload() is False
    keys.poll()
    assert keys.reload() is False
    assert len(_errors(caplog, "api keys file not reloaded")) == 2
    assert keys.lookup(hash_key("key-a")) == "alice"


@pytest.mark.parametrize(
    ("make", "limit", "flag"),
    [
        (lambda p: KeyFile(p, check_interval=0.0), MAX_KEYS_FILE_BYTES, "--api-keys-file"),
        (lambda p: KeyPolicies(p, check_interval=0.0), MAX_POLICY_FILE_BYTES, "--key-policy-file"),
        (lambda p: GuardrailsFile(p, check_interval=0.0), MAX_FILE_BYTES, "--guardrails"),
    ],
    ids=["keys", "policy", "guardrails"],
)
async def test_an_oversized_file_is_refused_unread_and_what_was_loaded_stays(
    make: Callable[[Path], ReloadedFile[Any]],
    limit: int,
    flag: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "file"
    _rewrite(path, "# nothing yet\n", 1)
    loaded = make(path)
    version = loaded.version
    caplog.set_level(logging.ERROR, logger="gateway")
    with path.open("r+b") as file:  # sparse: refused on its size, never read
        file.truncate(limit + 1)
    for _ in range(3):
        assert loaded.poll() == version
        await loaded.settled()
    [said] = _errors(caplog, "not reloaded")
    assert (
        f"is {limit + 1} bytes, over the " in said
        and f"limit of the {loaded.what} ({flag})" in said
    )
    # At start it stops the gateway, as a broken file does.
    with pytest.raises(
        ConfigError, match=f"^{loaded.setting}: {re.escape(str(path))} is {limit + 1} bytes"
    ):
        make(path)


async def test_a_missing_keys_file_is_said_once_with_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    _rewrite(path, f"alice:{hash_key('key-a')}\n", 1)
    keys = KeyFile(path, check_interval=0.0)
    caplog.set_level(logging.ERROR, logger="gateway")
    path.unlink()
    for _ in range(3):
        keys.poll()
    [said] = _errors(caplog, "api keys file not reloaded")
    assert "does not exist: create it with `gateway keys add KEY_ID" in said
    assert keys.lookup(hash_key("key-a")) == "alice"
    _rewrite(path, f"bob:{hash_key('key-b')}\n", 2)
    keys.poll()
    assert keys.lookup(hash_key("key-b")) == "bob"


async def test_a_large_keys_file_is_parsed_off_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    _rewrite(path, f"alice:{hash_key('key-a')}\n", 1)
    keys = KeyFile(path, check_interval=0.0)
    large = _key_lines(100_000)  # 7.2 MB, under the limit
    _rewrite(path, large, 2)
    started = time.perf_counter()
    KeyFile(path)  # what a reload cost the loop before
    on_the_loop = time.perf_counter() - started
    async with LoopWatch() as watch:
        keys.poll()
        assert keys.lookup(hash_key("key-a")) == "alice"  # served meanwhile
        await keys.settled()
    assert len(keys) == 100_000 and keys.lookup(hash_key("key-a")) is None
    print(
        f"\n7.2 MB keys file: {on_the_loop * 1000:.0f} ms to parse; "
        f"longest loop stall while it reloaded: {watch.longest * 1000:.0f} ms"
    )
    assert on_the_loop > 0.1  # heavy enough: parsed on the loop, it fails the bound below
    assert watch.longest < _bound(on_the_loop), (watch.longest, on_the_loop)


async def test_a_large_policy_file_is_parsed_off_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _rewrite(path, '[alice]\nserver_tools = ["read"]\n', 1)
    policies = KeyPolicies(path, check_interval=0.0)
    _rewrite(path, _policy_tables(15_000), 2)  # ~0.5 MB
    started = time.perf_counter()
    KeyPolicies(path)
    on_the_loop = time.perf_counter() - started
    async with LoopWatch() as watch:
        assert policies.poll() == 1
        assert policies.get("alice").server_tools == ("read",)  # served meanwhile
        assert await policies.settled() == 2
    assert policies.get("k14999").instructions == "x14999"
    print(
        f"\n0.5 MB key policy file: {on_the_loop * 1000:.0f} ms to parse; "
        f"longest loop stall while it reloaded: {watch.longest * 1000:.0f} ms"
    )
    assert on_the_loop > 0.1
    assert watch.longest < _bound(on_the_loop), (watch.longest, on_the_loop)
