"""TCP ports where Redis should be but is not, for the store's start checks."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

__all__ = ["ASKED", "PROTECTED", "RESET", "NotRedis"]

RESET = "reset"
ASKED = "asked"
# What a Redis in protected mode says to a client from another host, unasked, then hangs up.
PROTECTED = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and "
    b"no password is set for the default user. In this mode connections are only "
    b"accepted from the loopback interface.\r\n"
)


class NotRedis:
    """A TCP port that is not Redis. ``greeting``: said at once, then it hangs up (``b""``:
    hangs up without a word); ``RESET``: resets each connection, as a proxy whose Redis is
    down does; ``ASKED``: says nothing until asked, then answers 400 and hangs up (HTTP).
    Closed when its ``with`` block ends."""

    def __init__(self, greeting: bytes | str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self._greeting = greeting
        threading.Thread(target=self._run, daemon=True).start()

    def __enter__(self) -> NotRedis:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                conn, _ = self.sock.accept()
                if self._greeting == RESET:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif self._greeting == ASKED:
                    conn.settimeout(2)
                    with contextlib.suppress(OSError):
                        conn.recv(1024)
                        conn.sendall(b"HTTP/1.0 400 Bad request syntax\r\n\r\n")
                else:
                    assert isinstance(self._greeting, bytes)
                    conn.sendall(self._greeting)
                conn.close()
