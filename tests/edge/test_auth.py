"""Auth at the handshake: API keys (header, subprotocol, query), owners, origins, dev mode."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from gateway.cli import main
from gateway.config import ConfigError, load_config
from gateway.edge.auth import (
    KeyFile,
    KeyStoreUnavailable,
    RedisKeys,
    check_exposure,
    hash_key,
    is_loopback,
    parse_key_line,
)
from gateway.store import open_store
from protocol.events import Session, decode_event
from tests.edge.conftest import GatewayFactory, Keys, http_get, metric_value, refusal
from tests.support.client import GatewayClient, text_of
from tests.support.redis_server import free_port

memory_only = pytest.mark.parametrize("store_kind", ["memory"])


# --------------------------------------------------------------------- 401


@memory_only
async def test_no_key_is_401_and_the_body_says_how_to_authenticate(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        status, body, headers = await refusal(gw.url)
        assert status == 401
        assert "Authorization: Bearer KEY" in body and "?token=KEY" in body
        assert "rtgw.bearer.KEY" in body
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
        _, text = await http_get(gw, "/metrics")
        assert metric_value(text, "rtgw_connections_refused_total", 'reason="unauthorized"') == 1


@memory_only
@pytest.mark.parametrize(
    "how",
    [
        {"additional_headers": {"Authorization": "Bearer not-a-key"}},
        {"subprotocols": ["rtgw.v1", "rtgw.bearer.not-a-key"]},
        {"query": "?token=not-a-key"},
        {"additional_headers": {"Authorization": "Basic YWxpY2U6cHc="}},
    ],
)
async def test_a_wrong_key_is_401(
    gateway_factory: GatewayFactory, keys: Keys, how: dict[str, object]
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        kwargs = dict(how)
        query = str(kwargs.pop("query", ""))
        status, body, _ = await refusal(gw.url + query, **kwargs)  # type: ignore[arg-type]
        assert status == 401
        assert "Bearer" in body


@memory_only
async def test_the_bearer_subprotocol_needs_rtgw_v1_next_to_it(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        bearer = "rtgw.bearer." + keys.keys["alice"]
        status, body, _ = await refusal(gw.url, subprotocols=[bearer])  # type: ignore[list-item]
        assert status == 401 and "rtgw.v1" in body


@memory_only
@pytest.mark.parametrize("beside", ["header", "subprotocol", "query"])
async def test_different_keys_in_several_places_are_refused_not_ranked(
    gateway_factory: GatewayFactory, keys: Keys, beside: str
) -> None:
    # Two valid keys: a ranking would run the request as one of them without saying
    # which, and a stale header would hide a good token.
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        alice, bob = keys.keys["alice"], keys.keys["bob"]
        url, kwargs = f"{gw.url}?token={alice}", dict[str, object]()
        if beside == "header":
            kwargs["additional_headers"] = {"Authorization": f"Bearer {bob}"}
        elif beside == "subprotocol":
            kwargs["subprotocols"] = ["rtgw.v1", f"rtgw.bearer.{bob}"]
        else:
            url += f"&token={bob}"
        status, body, _ = await refusal(url, **kwargs)
        assert status == 401
        assert "send the key in one" in body
        # The same key in two places is one credential.
        client = await GatewayClient.connect(
            f"{gw.url}?token={alice}", headers={"Authorization": f"Bearer {alice}"}
        )
        assert text_of(await client.turn("hi"), "respond") == "Echo: hi"
        await client.close()


# --------------------------------------------------------------------- the three ways in


@pytest.mark.parametrize("via", ["header", "subprotocol", "query"])
async def test_a_key_works_as_bearer_subprotocol_or_token(
    gateway_factory: GatewayFactory, keys: Keys, via: str
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        key = keys.keys["alice"]
        if via == "header":
            client = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        elif via == "subprotocol":
            client = await GatewayClient.connect(
                gw.url,
                subprotocols=["rtgw.v1", f"rtgw.bearer.{key}"],  # type: ignore[list-item]
            )
            # The server selects rtgw.v1, never echoes the key back.
            assert client.ws.subprotocol == "rtgw.v1"
        else:
            client = await GatewayClient.connect(f"{gw.url}?token={key}")
        events = await client.turn("hello")
        assert text_of(events, "respond") == "Echo: hello"
        meta = await gw.node.store.get_meta(client.sid)
        assert meta is not None and meta["owner"] == "alice"
        await client.close()


@memory_only
async def test_clients_that_offer_no_subprotocol_still_connect(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory() as gw, connect(gw.url) as ws:
        assert ws.subprotocol is None
        assert isinstance(decode_event(await ws.recv()), Session)


# --------------------------------------------------------------------- ownership


async def test_another_key_cannot_resume_a_session(
    gateway_factory: GatewayFactory, keys: Keys
) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        alice = await GatewayClient.connect(gw.url, headers=keys.bearer("alice"))
        await alice.turn("mine")
        await alice.close()
        status, body, _ = await refusal(
            f"{gw.url}?session_id={alice.sid}&after=0", additional_headers=keys.bearer("bob")
        )
        assert status == 403 and "another API key" in body
        again = await GatewayClient.connect(
            gw.url, session_id=alice.sid, after=alice.last_seq, headers=keys.bearer("alice")
        )
        assert again.session.resumed
        await again.close()


# --------------------------------------------------------------------- origins


@memory_only
async def test_origins_outside_the_allow_list_are_403(gateway_factory: GatewayFactory) -> None:
    allowed = "https://a.example, https://b.example:8443"
    async with gateway_factory(allowed_origins=allowed) as gw:
        for origin in ("https://a.example", "https://B.example:8443"):
            async with connect(gw.url, origin=origin) as ws:  # type: ignore[arg-type]
                assert isinstance(decode_event(await ws.recv()), Session)
        status, body, _ = await refusal(gw.url, origin="https://evil.example")  # type: ignore[arg-type]
        assert status == 403 and "--allowed-origins" in body
        # No Origin: not a browser, allowed.
        async with connect(gw.url) as ws:
            assert isinstance(decode_event(await ws.recv()), Session)
        # The gateway's own page (same host) may connect back.
        same = f"http://127.0.0.1:{gw.port}"
        async with connect(gw.url, origin=same) as ws:  # type: ignore[arg-type]
            assert isinstance(decode_event(await ws.recv()), Session)


def test_allowed_origins_must_be_origins() -> None:
    from gateway.edge.admission import validate

    with pytest.raises(ConfigError, match="scheme://host"):
        validate(load_config({"allowed_origins": "a.example"}, env={}))
    with pytest.raises(ConfigError, match="scheme://host"):
        validate(load_config({"allowed_origins": "https://a.example/app"}, env={}))


# --------------------------------------------------------------------- dev mode


@memory_only
async def test_loopback_without_keys_works_and_warns_once(
    gateway_factory: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    async with gateway_factory() as gw:
        client = await GatewayClient.connect(gw.url)
        events = await client.turn("hello")
        assert text_of(events, "respond") == "Echo: hello"
        meta = await gw.node.store.get_meta(client.sid)
        assert meta is not None and meta["owner"] == "anonymous"
        await client.close()
    warnings = [r for r in caplog.records if "auth is OFF" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_a_non_loopback_host_without_keys_refuses_to_start() -> None:
    with pytest.raises(ConfigError) as info:
        check_exposure(load_config({"host": "0.0.0.0"}, env={}))
    message = str(info.value)
    assert "--api-keys-file" in message and "--insecure-no-auth" in message


def test_insecure_no_auth_starts_but_warns(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    check_exposure(load_config({"host": "0.0.0.0", "insecure_no_auth": True}, env={}))
    check_exposure(load_config({"host": "0.0.0.0"}, env={"GATEWAY_INSECURE_NO_AUTH": "true"}))
    assert sum("--insecure-no-auth" in r.getMessage() for r in caplog.records) == 2


def test_keys_make_a_public_host_acceptable(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("")
    check_exposure(load_config({"host": "0.0.0.0", "api_keys_file": str(keys)}, env={}))
    with pytest.raises(ConfigError, match="REDIS_URL"):
        check_exposure(load_config({"host": "0.0.0.0", "api_keys_redis": True}, env={}))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("gateway.internal", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_gateway_serve_on_0000_without_keys_exits_2_with_the_fix(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "REDIS_URL"))}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "GATEWAY_WORKSPACE_ROOT": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0 without authentication" in proc.stderr
    assert "--api-keys-file" in proc.stderr


# --------------------------------------------------------------------- the keys file


def test_key_lines_parse_and_bad_lines_say_what_a_line_looks_like() -> None:
    digest = hash_key("k")
    assert parse_key_line(f"alice:{digest}  # laptop") == ("alice", digest)
    assert parse_key_line("   # comment") is None
    assert parse_key_line("") is None
    for bad in ("alice", f"al ice:{digest}", "alice:abc", f":{digest}"):
        with pytest.raises(ValueError, match="key_id:sha256hex"):
            parse_key_line(bad)


def test_a_broken_keys_file_stops_startup_with_the_line_number(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"alice:{hash_key('a')}\nbob:nothex\n")
    with pytest.raises(ConfigError, match="line 2"):
        KeyFile(path)
    with pytest.raises(ConfigError, match="does not exist"):
        KeyFile(tmp_path / "missing")
    path.write_bytes(b"alice:\xff\n")  # named no file nor fix: "'utf-8' codec can't decode"
    with pytest.raises(ConfigError, match=r"keys is not UTF-8 text .*save it as UTF-8"):
        KeyFile(path)


def test_the_keys_file_reloads_on_change_and_keeps_old_keys_when_broken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    path.write_text(f"alice:{hash_key('key-a')}\n")
    keys = KeyFile(path, check_interval=0.0)
    assert keys.lookup(hash_key("key-a")) == "alice"
    assert keys.lookup(hash_key("key-b")) is None
    path.write_text(f"bob:{hash_key('key-b')}\n")
    os.utime(path, (1, 1))  # a different mtime even on coarse clocks
    assert keys.lookup(hash_key("key-b")) == "bob"
    assert keys.lookup(hash_key("key-a")) is None  # revoked by editing the file
    path.write_text("garbage\n")
    os.utime(path, (2, 2))
    caplog.set_level(logging.ERROR, logger="gateway")
    assert keys.lookup(hash_key("key-b")) == "bob"
    assert any("keeping" in r.getMessage() for r in caplog.records)


@memory_only
async def test_sighup_reload_lets_a_new_key_in(gateway_factory: GatewayFactory, keys: Keys) -> None:
    async with gateway_factory(api_keys_file=str(keys.path)) as gw:
        assert gw.edges.key_file is not None
        gw.edges.key_file.check_interval = 3600.0  # only an explicit reload reads it
        carol = keys.add("carol")
        status, _, _ = await refusal(f"{gw.url}?token={carol}")
        assert status == 401
        gw.edges.reload_keys()  # what SIGHUP does
        client = await GatewayClient.connect(f"{gw.url}?token={carol}")
        await client.close()


# --------------------------------------------------------------------- gateway keys


def run_cli(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr, sys.stdin = out, err, io.StringIO(stdin)
    try:
        code = main(args)
    finally:
        sys.stdout, sys.stderr, sys.stdin = old
    return code, out.getvalue(), err.getvalue()


@memory_only
async def test_gateway_keys_with_a_file(gateway_factory: GatewayFactory, tmp_path: Path) -> None:
    path = tmp_path / "etc" / "keys"
    code, out, err = run_cli(["keys", "add", "alice", "--file", str(path)])
    assert code == 0 and "shown only now" in err
    key = out.strip()
    text = path.read_text()
    assert key not in text and hash_key(key) in text  # only the digest is stored
    assert path.stat().st_mode & 0o777 == 0o600
    code, out, _ = run_cli(["keys", "list", "--file", str(path)])
    assert code == 0 and out.startswith("alice\t")
    async with gateway_factory(api_keys_file=str(path)) as gw:
        client = await GatewayClient.connect(gw.url, headers={"Authorization": f"Bearer {key}"})
        await client.close()
    code, _, _ = run_cli(["keys", "revoke", "alice", "--file", str(path)])
    assert code == 0 and hash_key(key) not in path.read_text()
    code, _, err = run_cli(["keys", "revoke", "alice", "--file", str(path)])
    assert code == 1 and "no key" in err
    code, out, _ = run_cli(["keys", "hash", "bob"], stdin="my-own-key\n")
    assert code == 0 and out.strip() == f"bob:{hash_key('my-own-key')}"
    code, _, err = run_cli(["keys", "add", "not valid", "--file", str(path)])
    assert code == 2 and "key id" in err


def test_gateway_keys_add_with_tools_writes_the_keys_allow_list(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    code, out, _ = run_cli(["keys", "add", "bob", "--file", str(path), "--tools", "read, calc.*"])
    assert code == 0
    line = path.read_text().strip()
    assert line == f"bob:{hash_key(out.strip())} tools=read,calc.*"
    allowed = KeyFile(path).tools_for("bob")
    assert allowed is not None
    assert allowed.allows("read") and allowed.allows("calc.add") and not allowed.allows("shell")
    # An empty list is a key whose sessions may call no tool at all.
    code, _, _ = run_cli(["keys", "add", "carol", "--file", str(path), "--tools", ""])
    none = KeyFile(path).tools_for("carol")
    assert code == 0 and none is not None and not none.allows("read")
    code, _, err = run_cli(["keys", "add", "dave", "--file", str(path), "--tools", "re ad"])
    assert code == 2 and "not a tool name pattern" in err
    assert "dave" not in path.read_text()  # nothing written for a refused list


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_gateway_keys_in_redis(gateway_factory: GatewayFactory, redis_url: str) -> None:
    # The CLI runs its own event loop, as it does from a shell: call it from a thread.
    code, out, _ = await asyncio.to_thread(run_cli, ["keys", "add", "alice", "--redis", redis_url])
    assert code == 0
    key = out.strip()
    code, listing, _ = await asyncio.to_thread(run_cli, ["keys", "list", "--redis", redis_url])
    assert listing.startswith("alice\t")
    async with gateway_factory(api_keys_redis=True) as gw:
        client = await GatewayClient.connect(f"{gw.url}?token={key}")
        await client.turn("hello")  # a session is stored at its first turn
        meta = await gw.node.store.get_meta(client.sid)
        assert meta is not None and meta["owner"] == "alice"
        await client.close()
        code, _, _ = await asyncio.to_thread(
            run_cli, ["keys", "revoke", "alice", "--redis", redis_url]
        )
        assert code == 0
        status, _, _ = await refusal(f"{gw.url}?token={key}")
        assert status == 401  # revocation is immediate: Redis keys are read per handshake


async def test_an_unreachable_key_store_is_reported_as_unavailable() -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0", retry_window=0.2)
    keys = RedisKeys(store)
    with pytest.raises(KeyStoreUnavailable):
        await keys.lookup(hash_key("x"))
    await keys.close()
    await store.close()
