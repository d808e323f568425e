"""A Redis that refuses for good stops the start in one line; one that is down does not
(issue 38): waiting never fixes a wrong password, a database past ``databases`` or a
port that is not Redis, so the node must not say "listening" and retry forever."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.not_redis import NotRedis
from tests.support.procs import NodeProcess
from tests.support.redis_server import RedisServer, free_port

PASSWORD = "s3cret-for-tests"


@pytest.fixture(scope="module")
def guarded_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server with a password and four databases."""
    server = RedisServer(
        Path(tmp_path_factory.mktemp("guarded")),
        extra=["--requirepass", PASSWORD, "--databases", "4"],
    )
    server.start()
    yield server
    server.stop()


def _serve(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--redis", url],
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "REDIS_URL": ""},
    )


def _refused(url: str) -> str:
    """The start's one line (exit 2, nothing listening), with the password nowhere in it."""
    done = _serve(url)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "listening" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    lines = [line for line in lines if "auth is OFF" not in line]
    assert len(lines) == 1, lines
    assert PASSWORD not in lines[0] and "wrong-one" not in lines[0]
    return lines[0]


def test_a_wrong_password(guarded_redis: RedisServer) -> None:
    line = _refused(f"redis://:wrong-one@127.0.0.1:{guarded_redis.port}/0")
    assert line.startswith(f"gateway: Redis at 127.0.0.1:{guarded_redis.port} refused")
    assert "password" in line and "--store" in line


def test_no_password_for_a_redis_that_needs_one(guarded_redis: RedisServer) -> None:
    line = _refused(f"redis://127.0.0.1:{guarded_redis.port}/0")
    assert "needs a password" in line and "redis://[USER]:PASSWORD@HOST:PORT/DB" in line


def test_a_database_past_the_servers_databases(guarded_redis: RedisServer) -> None:
    line = _refused(f"redis://:{PASSWORD}@127.0.0.1:{guarded_redis.port}/9")
    assert "no such database" in line and "`databases`" in line


@pytest.mark.parametrize("greeting", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b""])
def test_a_port_that_is_not_redis(greeting: bytes) -> None:
    with NotRedis(greeting) as port:
        line = _refused(f"redis://127.0.0.1:{port.port}/0")
    assert line.startswith(f"gateway: 127.0.0.1:{port.port} answers, but not as Redis does")
    assert "Redis's port" in line


def test_an_http_server_is_refused() -> None:
    """A real HTTP server says nothing until asked, then answers 400 and hangs up."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        line = _refused(f"redis://127.0.0.1:{port}/0")
    finally:
        server.shutdown()
        server.server_close()
    assert line.startswith(f"gateway: 127.0.0.1:{port} answers, but not as Redis does")


def test_a_redis_that_is_down_is_still_waited_for() -> None:
    with NodeProcess(
        ["serve", "--port", "0", "--redis", f"redis://127.0.0.1:{free_port()}/0"]
    ) as node:
        node.wait_for_lines(r"the session store does not answer")
        assert node.proc.poll() is None  # listening, and waiting for Redis to start


def test_keys_on_a_redis_that_refuses_the_password_say_what_to_change(
    guarded_redis: RedisServer,
) -> None:
    url = f"redis://:wrong-one@127.0.0.1:{guarded_redis.port}/0"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "list", "--store", url],
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert "refused the store URL's user or password" in line and "(while listing API keys)" in line
    assert "is Redis running" not in line and "that Redis is running" not in line
