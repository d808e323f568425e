"""The test MCP server over streamable HTTP, as a subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.redis_server import free_port

SERVER = Path(__file__).with_name("mcp_test_server.py")


class McpHttpProcess:
    """``mcp_test_server.py PORT``; ``start()`` returns once uvicorn says it is listening."""

    def __init__(
        self, script: Path = SERVER, port: int | None = None, *, json_response: bool = False
    ) -> None:
        self.script = script
        self.json_response = json_response
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def start(self, timeout: float = 30.0) -> McpHttpProcess:
        self.proc = subprocess.Popen(
            [sys.executable, str(self.script), str(self.port)],
            env={**os.environ, "MCP_JSON_RESPONSE": "1" if self.json_response else "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.output.append(line)
                if "Uvicorn running on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("MCP HTTP server did not start:\n" + "".join(self.output))
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextmanager
def mcp_http_server(
    port: int | None = None, *, json_response: bool = False
) -> Iterator[McpHttpProcess]:
    server = McpHttpProcess(port=port, json_response=json_response).start()
    try:
        yield server
    finally:
        server.stop()
