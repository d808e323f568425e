"""HTTP tools: a call is one POST of ``{"args", "session_id", "call_id", "idempotency_key"}``.

The key is also the ``Idempotency-Key`` header: it is the same for every run of
one call, on any node (a takeover reruns a call whose outcome was not logged),
so a service that acts in the world does it once per key, and may answer a
repeated key with the result it stored (docs/tools.md, "Your own tools").

The client is ``httpx2``, the fork of httpx the ``mcp`` SDK itself depends on:
one well-kept async client (connection pooling, HTTP/1.1 keep-alive, per-request
timeouts) is already in the dependency tree, so HTTP tools add nothing to it,
and aiohttp would be a second HTTP stack doing the same job. One client is
shared by every HTTP tool of a node, so calls reuse connections.

A 2xx answer with a JSON body is the tool's output; any other status, a body
that is not JSON, a refused connection or a timeout is a ``failure`` result
that says which, with the status and the start of the body, so the model (and
whoever reads the log) sees what the endpoint said.

An endpoint is someone else's server, so a call is bounded in bytes and in
time. Reading whole bodies, a 1 GB answer or a ~1 MB gzip bomb held the
node's loop for 10–19 s and grew its RSS by 2.5–4.1 GB, and a body dripped a
byte a second ran 30 s past a ``timeout = 3`` (httpx's timeouts are per read).
So:

- the body is streamed and counted *after* decompression; at most
  ``body_limit(max_output)`` bytes are kept (the executor's cap on one result,
  plus a margin for whitespace and escapes its re-encoding drops) and a body
  past that fails the call. httpx2 inflates gzip and deflate in pieces of at
  most 1 MiB, so a bomb is cut after its first piece (the gzip-bomb test in
  ``tests/tools/test_http_bounds.py`` is the canary for that). Encodings are
  pinned to those two, which are the ones inflated in bounded pieces;
- the section's ``timeout`` is a deadline for the whole call: connect, send,
  headers and body;
- the body is decoded as JSON once, when it is whole and capped. JSON nested
  deeper than the decoder recurses (about ``sys.getrecursionlimit()`` levels)
  fails the call as a fault of the service, not of the gateway. No tighter
  depth is imposed: walking a result in Python to measure it (``json_depth``)
  costs 2-6 times its decoding (77-194 ms for 0.4-0.6 MB), and what decodes
  passes on whole.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any, Final

import httpx2

from tools.base import ToolContext, ToolFailure
from tools.described import DescribedTool
from tools.output import valid_text
from tools.providers.specs import HttpToolSpec
from tools.secrets import Secrets

__all__ = ["HttpTool", "HttpToolSpec", "body_limit", "http_client"]

_BODY_SHOWN: Final = 300
_ERROR_BODY: Final = 4 * _BODY_SHOWN
"""Bytes read of a non-2xx body: enough for the start shown in the failure."""
_MIN_MARGIN: Final = 16 * 1024
_ENCODINGS: Final = ("gzip", "deflate")
"""What the gateway accepts: httpx2 inflates these in bounded pieces. With
``brotli`` or ``zstandard`` installed it would offer those too, unbounded."""


def body_limit(max_output: int) -> int:
    """Bytes of a 2xx body read when a result is cut to ``max_output``.

    The margin is as much again (at least 16 KiB): a pretty-printed or
    ``\\u``-escaped JSON body is longer than the compact JSON the executor
    measures, and should still arrive whole when its value fits.
    """
    return max_output + max(max_output, _MIN_MARGIN)


_CONNECTIONS: Final = 1024
"""Connections the shared client opens at once, for every session of the node. httpx's
default (100) made the 101st background call of a node wait, unstarted, for a free
connection while the model was told it had started; the calls are bounded before
they get here (per batch, per session's background calls, per node's sessions)."""


def http_client() -> httpx2.AsyncClient:
    """The shared client: no redirects (a tool URL is configured, not discovered), no proxies from the environment."""
    return httpx2.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        headers={"Accept-Encoding": ", ".join(_ENCODINGS)},
        limits=httpx2.Limits(max_connections=_CONNECTIONS, max_keepalive_connections=100),
    )


class HttpTool(DescribedTool):
    """A tool served by an HTTP endpoint."""

    def __init__(self, spec: HttpToolSpec, client: httpx2.AsyncClient) -> None:
        super().__init__(spec.name, spec.description, spec.parameters)
        self.spec = spec
        self.require_approval = spec.require_approval
        self.background = spec.background
        self.secrets = Secrets(spec.secrets)
        self._client = client

    def _scrub(self, text: str) -> str:
        if not self.secrets:
            return text
        scrubbed = self.secrets.scrub(valid_text(text))
        return scrubbed if isinstance(scrubbed, str) else text

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        spec = self.spec
        key = ctx.idempotency_key or uuid.uuid4().hex
        body = {
            "args": args,
            "session_id": ctx.session_id,
            "call_id": ctx.call_id or key,
            "idempotency_key": key,
        }
        headers = {**spec.headers, "Idempotency-Key": key}
        limit = body_limit(ctx.max_output)
        read = _Read()
        try:
            async with asyncio.timeout(spec.timeout):
                async with self._client.stream(
                    "POST", spec.url, json=body, headers=headers, timeout=spec.timeout
                ) as response:
                    await read.body(response, limit)
        except (TimeoutError, httpx2.TimeoutException):
            got = f" (it had sent {read.size:,} bytes of its body by then)" if read.status else ""
            raise ToolFailure(
                f"{spec.name!r} did not answer within {spec.timeout:g}s{got}; "
                "try again later or ask for less at once"
            ) from None
        except httpx2.DecodingError as exc:
            raise ToolFailure(
                f"{spec.name!r} answered a body that could not be decompressed ({exc}). "
                "This is a fault in the tool's service, not in your call"
            ) from None
        except httpx2.HTTPError as exc:
            what = "broke off its answer" if read.status else "could not be reached"
            raise ToolFailure(
                f"{spec.name!r} {what} ({type(exc).__name__}: {exc or 'no detail'}); "
                "the service may be down: try again later or do without it"
            ) from None
        if read.refused:
            raise ToolFailure(f"{spec.name!r} {read.refused}")
        status = read.status
        text = read.data.decode(read.charset, errors="replace")
        if not read.ok:  # scrubbed whole: a secret cut through at the start is not found
            raise ToolFailure(f"{spec.name!r} answered HTTP {status}: {_start(self._scrub(text))}")
        if read.over:
            raise ToolFailure(f"{spec.name!r} {_too_large(read, limit, ctx.max_output)}")
        try:
            return json.loads(text)
        except RecursionError:  # the decoder recurses per level of arrays and objects
            raise ToolFailure(
                f"{spec.name!r} answered HTTP {status} with JSON nested more than about "
                f"{sys.getrecursionlimit():,} levels deep, too deep to read. This is a fault "
                "in the tool's service, not in your call: it should answer flatter JSON"
            ) from None
        except ValueError:
            raise ToolFailure(
                f"{spec.name!r} answered HTTP {status} but its body is not JSON: "
                f"{_start(self._scrub(text))}. This is a fault in the tool's service, not in "
                "your call"
            ) from None


class _Read:
    """What was read of one answer: the kept bytes, and whether more was left behind."""

    def __init__(self) -> None:
        self.status = 0
        """The answer's HTTP status; 0 until its headers arrived."""
        self.charset = "utf-8"
        self.data = b""
        self.size = 0
        """Decoded bytes read (only those up to the limit are kept)."""
        self.over = False
        self.raw = 0
        """Bytes as they came over the wire (compressed)."""
        self.encoding = ""
        self.refused = ""
        """Why the body was not read at all ("" if it was)."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    async def body(self, response: httpx2.Response, limit: int) -> None:
        """Read at most ``limit`` decoded bytes of a 2xx ``response`` (of another, its start)."""
        self.status = response.status_code
        if not self.ok:
            limit = _ERROR_BODY
        self.charset = response.encoding or "utf-8"
        self.encoding = response.headers.get("Content-Encoding", "").strip().lower()
        if self.encoding not in ("", "identity", *_ENCODINGS):
            self.refused = (
                f"answered with Content-Encoding {self.encoding!r}, which the gateway did not "
                f"ask for (it accepts {', '.join(_ENCODINGS)}). This is a fault in the tool's "
                "service, not in your call"
            )
            return
        kept = bytearray()
        async for piece in response.aiter_bytes():
            self.size += len(piece)
            room = limit - len(kept)
            if len(piece) > room:
                kept += piece[:room]
                self.over = True
                break
            kept += piece
        self.raw = response.num_bytes_downloaded
        self.data = bytes(kept)


def _too_large(read: _Read, limit: int, max_output: int) -> str:
    if read.encoding in _ENCODINGS and read.size > read.raw:
        what = (
            f"answered a {read.encoding}-compressed body that expands past {limit:,} bytes "
            f"(from its first {read.raw:,} compressed bytes)"
        )
    else:
        what = f"answered more than {limit:,} bytes"
    return (
        f"{what}, more than one tool result keeps ({max_output:,} bytes); the gateway "
        "stopped reading it. Ask for less at once (narrower arguments, a smaller page), "
        "or have the service answer with less"
    )


def _start(text: str) -> str:
    text = text.strip()
    if not text:
        return "(empty body)"
    return text if len(text) <= _BODY_SHOWN else text[:_BODY_SHOWN] + "…"
