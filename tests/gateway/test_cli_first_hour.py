"""Bad input in the first hour: one line each, no traceback (issue 30)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import NodeProcess
from tests.support.redis_server import free_port


def _gateway(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "REDIS_URL": "", **(env or {})},
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    lines = [line for line in lines if "auth is OFF" not in line]
    assert len(lines) == 1, lines
    return lines[0]


@contextmanager
def _taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def test_a_store_url_of_no_known_scheme() -> None:
    line = _one_line(_gateway("serve", "--port", "0", "--redis", "foo://x"), 2)
    assert line.startswith(
        "gateway: --store (or --redis, REDIS_URL): unsupported store URL 'foo://x'"
    )
    assert "redis://HOST:PORT" in line


def test_an_unknown_provider_lists_the_choices() -> None:
    line = _one_line(_gateway("serve", "--provider", "foo"), 2)
    assert "'foo' is not valid: use one of sim, openai, gemini" in line


def test_a_busy_api_port_names_api_port() -> None:
    with _taken_port() as port:
        line = _one_line(_gateway("serve", "--port", "0", "--api-port", str(port)), 2)
    assert line == (
        f"gateway serve: 127.0.0.1:{port} is already in use (another gateway?); stop it, "
        "or choose another port with --api-port (0 picks a free one)"
    )


def test_the_simulator_on_a_busy_port() -> None:
    with _taken_port() as port:
        line = _one_line(_gateway("sim", "--port", str(port)), 2)
    assert line == (
        f"gateway sim: 127.0.0.1:{port} is already in use (another gateway?); stop it, "
        "or choose another port with --port (0 picks a free one)"
    )


def test_keys_list_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "keys"
    line = _one_line(_gateway("keys", "list", "--file", str(missing)), 1)
    assert line == (
        f"gateway keys: there is no keys file at {missing} (yet): "
        f"`gateway keys add KEY_ID --file {missing}` makes it"
    )


def test_chat_checks_its_audio_file_before_any_session(tmp_path: Path) -> None:
    # Nothing listens at the URL: the file is checked first, so that is not what is said.
    url = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    missing = tmp_path / "nope.wav"
    line = _one_line(_gateway("chat", url, "--audio", str(missing)), 2)
    assert line == f"gateway chat: --audio {missing}: no such file"
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all")
    line = _one_line(_gateway("chat", url, "--audio", str(text)), 2)
    assert line.startswith(f"gateway chat: --audio {text}: not a WAV file")
    eight_bit = tmp_path / "eight.wav"
    with wave.open(str(eight_bit), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(8000)
        out.writeframes(b"\x80" * 800)
    line = _one_line(_gateway("chat", url, "--audio", str(eight_bit)), 2)
    assert "only 16-bit PCM WAV files" in line


class _HangsUp:
    """A port where Redis should be that resets each connection and counts them: the
    node's retries, which it logs once, are seen here."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.attempts = 0
        self._changed = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                conn, _ = self.sock.accept()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                with self._changed:
                    self.attempts += 1
                    self._changed.notify_all()

    def close(self) -> None:
        self.sock.close()

    def wait_for_attempts(self, count: int, timeout: float = 30.0) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.attempts >= count, timeout), self.attempts


def test_a_missing_redis_is_said_at_once_and_each_warning_once() -> None:
    hangs_up = _HangsUp()
    dead = f"redis://127.0.0.1:{hangs_up.port}/0"
    with (
        contextlib.closing(hangs_up),
        NodeProcess(["serve", "--port", "0", "--redis", dead]) as node,
    ):
        node.wait_for_lines(r"the session store does not answer")
        # The retry loops keep failing meanwhile, each every second: 20 more attempts are
        # about three rounds of them (some 7 a second here).
        hangs_up.wait_for_attempts(hangs_up.attempts + 20)
        warnings = [line for line in node.log.splitlines() if " WARNING " in line]
        assert len(warnings) == len(set(w.split(" WARNING ", 1)[1] for w in warnings)), warnings
        # A chat says the node's 503 at once, not after a minute of retries.
        started = time.monotonic()
        chat = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "chat", node.url, "--no-color"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert chat.stderr is not None
            first = chat.stderr.readline()
        finally:
            chat.kill()
            chat.wait()
        assert "HTTP 503" in first and "retrying" in first, first
        assert time.monotonic() - started < 10
