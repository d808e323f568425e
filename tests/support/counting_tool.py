"""An HTTP tool that counts its executions per ``Idempotency-Key`` (stdlib, in a thread).

``POST /count`` with ``{"args": {"label": str, "seconds": float}}``: the
first request of a key does the work (sleeps ``seconds``, then answers
``{"label", "run": N}``, N counting every execution of any key); a request
with a key already done, or still running, answers the stored result of
that key without doing the work again — the behaviour the README asks of a
tool that acts in the world. ``requests`` keeps every request's key and
args, ``executions`` how often each key's work ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class CountingTool(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Condition()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.executions: dict[str, int] = {}
        self.stored: dict[str, dict[str, Any]] = {}
        self.runs = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/count"

    def keys_of(self, label: str) -> set[str]:
        """The keys the requests for ``label`` carried."""
        with self.lock:
            return {key for key, args in self.requests if args.get("label") == label}

    def wait_requests(self, count: int, timeout: float = 30.0) -> None:
        """Block until ``count`` requests came in (call it in a thread from async code)."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{len(self.requests)} requests, not {count}")

    def tools_file(self) -> str:
        """A tools file offering this endpoint as ``count``."""
        return (
            "[builtin]\nenable = []\n\n[http.count]\n"
            f'url = "{self.url}"\n'
            'description = "Count one execution."\n'
            'parameters = { type = "object", properties = { label = { type = "string" }, '
            'seconds = { type = "number" } }, required = ["label"] }\n'
            "timeout = 30\n"
        )


class _Handler(BaseHTTPRequestHandler):
    server: CountingTool

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        key = self.headers.get("Idempotency-Key", "")
        args = body.get("args", {})
        server = self.server
        with server.lock:
            server.requests.append((key, args))
            server.lock.notify_all()
            first = key not in server.executions
            if first:
                server.executions[key] = 1
            else:
                # Done or running: wait for its stored result, do not run again.
                server.lock.wait_for(lambda: key in server.stored, 30)
        if first:
            time.sleep(float(args.get("seconds", 0)))
            with server.lock:
                server.runs += 1
                server.stored[key] = {"label": args.get("label"), "run": server.runs}
                server.lock.notify_all()
        with server.lock:
            answer = json.dumps(server.stored.get(key, {})).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except OSError:
            pass  # the node that asked is gone


@contextmanager
def counting_tool() -> Iterator[CountingTool]:
    server = CountingTool()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
