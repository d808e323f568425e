"""A real HTTP tool endpoint on 127.0.0.1 (stdlib ``http.server`` in a thread).

Paths: ``/weather`` answers ``{"city", "forecast", "session_id", "auth"}``,
``/fail`` answers 500 with a text body, ``/slow`` answers after 5 s,
``/text`` answers 200 with a body that is not JSON, ``/lone`` the JSON string
``"\ud800 and more"`` (a lone surrogate: valid JSON, no character), ``/echo500``
(500) and ``/echo`` (200, a JSON string) 290 characters and then the request's
``Authorization`` header. Every request body is
kept in ``requests`` so tests can check what the gateway sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ToolServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ToolServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append(body)
        self.server.headers_seen.append(dict(self.headers))
        if self.path == "/weather":
            city = body["args"]["city"]
            self._send(
                200,
                "application/json",
                json.dumps(
                    {
                        "city": city,
                        "forecast": f"rain in {city}",
                        "session_id": body.get("session_id"),
                        "auth": self.headers.get("Authorization"),
                    }
                ),
            )
        elif self.path == "/fail":
            self._send(500, "text/plain", "database on fire")
        elif self.path == "/slow":
            time.sleep(5)
            self._send(200, "application/json", "{}")
        elif self.path == "/text":
            self._send(200, "text/plain", "just words")
        elif self.path == "/lone":
            self._send(200, "application/json", '"\\ud800 and more"')
        elif self.path == "/echo500":
            self._send(500, "text/plain", "x" * 290 + str(self.headers.get("Authorization")))
        elif self.path == "/echo":
            echo = "x" * 290 + str(self.headers.get("Authorization"))
            self._send(200, "application/json", json.dumps(echo))
        else:
            self._send(404, "text/plain", "no such tool")

    def _send(self, status: int, kind: str, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def tool_server() -> Iterator[ToolServer]:
    server = ToolServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
