"""A hostile HTTP tool endpoint on 127.0.0.1 (stdlib ``http.server`` in a thread).

Paths, each answering HTTP 200 to any POST:

- ``/huge``: a 1 GiB body that starts like JSON, generated as it is sent;
- ``/bomb``: a gzip bomb, ~1 MB on the wire that inflates to 1 GiB of zeros;
- ``/drip``: headers at once, then one byte of body a second;
- ``/pretty``: a pretty-printed JSON body ``PRETTY_BYTES`` long whose compact
  form is shorter (what the margin over ``max_output`` is for);
- ``/gzip``: a small gzip-compressed JSON object;
- ``/brotli``: a body that claims ``Content-Encoding: br``.

``sent[path]`` counts the body bytes the server managed to write before the
client hung up, so a test can see that the gateway stopped reading.
"""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

GIB: Final = 1 << 30
_CHUNK: Final = b"x" * (1 << 20)
PRETTY_BYTES: Final = 100_000


def gzip_bomb(inflated: int = GIB) -> bytes:
    """A gzip stream of ``inflated`` zero bytes in about ``inflated / 1000`` bytes.

    Each MiB of zeros, flushed with ``Z_FULL_FLUSH``, compresses to the same
    ~1 KB block, so the block is repeated instead of compressing a GiB.
    The trailer is left off: a reader that gets that far has already failed.
    """
    mib = bytes(1 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(mib) + comp.flush(zlib.Z_FULL_FLUSH)
    return first + block * (inflated // len(mib) - 1)


BOMB: Final = gzip_bomb()


def _pretty(size: int) -> bytes:
    """A JSON object, indented, about ``size`` bytes; its compact form is much shorter."""
    rows, body = 0, b""
    while len(body) < size:
        rows += 200
        body = json.dumps({"rows": list(range(rows))}, indent=16).encode()
    return body


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stop = threading.Event()
        self.sent: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        self.pretty = _pretty(PRETTY_BYTES)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: HostileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.server.requests.append(json.loads(self.rfile.read(length) or b"{}"))
        self.close_connection = True
        self.server.sent[self.path] = 0
        try:
            if self.path == "/huge":
                self._head(GIB + 10)
                self._write(b'{"data": "')
                for _ in range(GIB // len(_CHUNK)):
                    self._write(_CHUNK)
            elif self.path == "/bomb":
                self._head(len(BOMB), encoding="gzip")
                for start in range(0, len(BOMB), 65536):
                    self._write(BOMB[start : start + 65536])
            elif self.path == "/drip":
                self._head(120)
                for _ in range(120):
                    self._write(b" ")
                    if self.server.stop.wait(1.0):
                        return
            elif self.path == "/pretty":
                self._head(len(self.server.pretty))
                self._write(self.server.pretty)
            elif self.path == "/gzip":
                body = gzip.compress(json.dumps({"ok": True, "via": "gzip"}).encode())
                self._head(len(body), encoding="gzip")
                self._write(body)
            elif self.path == "/brotli":
                self._head(4, encoding="br")
                self._write(b"\x0b\x01\x80\x00")
            else:
                self.send_error(404)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what a bounded reader does

    def _head(self, length: int, *, encoding: str = "") -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        self.wfile.flush()

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        self.server.sent[self.path] += len(data)


@contextmanager
def hostile_server() -> Iterator[HostileServer]:
    server = HostileServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
