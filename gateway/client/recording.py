"""``gateway recording get ID -o FILE``: a session's recording, from the HTTP API, to a file.

The API serves a recording in pages of whole lines (``GET
/v1/sessions/ID/recording?offset=BYTES``; ``X-Next-Offset`` and
``X-Has-More`` say where the next one starts): this reads them all, in order,
into one JSON Lines file that ``gateway replay`` and ``gateway eval`` read.
A live session's recording is written on the node's log rounds, so it may be
up to a second behind the session.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Final

import aiohttp
import msgspec

from gateway.client.dial import TOKEN_ENV, token_from_env

__all__ = ["DEFAULT_API", "RecordingError", "add_recording_arguments", "fetch_recording", "run"]

DEFAULT_API: Final = os.environ.get("GATEWAY_API_URL", "http://127.0.0.1:8765")
MAX_PAGES: Final = 100_000


class RecordingError(Exception):
    """The recording could not be read; the message says why and what to do."""


async def fetch_recording(
    api: str, session_id: str, *, token: str | None = None, timeout: float = 30.0
) -> bytes:
    """Every page of ``session_id``'s recording, joined. Raises ``RecordingError``."""
    base = api.rstrip("/")
    url = f"{base}/v1/sessions/{session_id}/recording"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    parts: list[bytes] = []
    offset = 0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            for _ in range(MAX_PAGES):
                async with http.get(url, params={"offset": str(offset)}, headers=headers) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RecordingError(_refusal(r.status, body, base))
                    parts.append(body)
                    following = int(r.headers.get("X-Next-Offset", offset + len(body)))
                    if r.headers.get("X-Has-More") != "true" or following <= offset:
                        return b"".join(parts)
                    offset = following
    except aiohttp.ClientError as exc:
        raise RecordingError(
            f"cannot reach the gateway's HTTP API at {base} ({exc}); is it serving, and "
            "is --api (GATEWAY_API_URL) its http:// URL (its --port, or its --api-port)?"
        ) from None
    except TimeoutError:
        raise RecordingError(f"the HTTP API at {base} did not answer within {timeout:g}s") from None
    raise RecordingError(f"the recording took more than {MAX_PAGES} pages; stopped")


def _refusal(status: int, body: bytes, base: str) -> str:
    try:
        message = str(msgspec.json.decode(body)["error"]["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")[:300] or "no reason given"
    if status == 401:
        return f"the API refused the key (401): {message}; pass --token API_KEY"
    return f"the API at {base} answered {status}: {message}"


def add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    """``gateway recording get ID -o FILE [--api URL] [--token KEY]``."""
    sub = parser.add_subparsers(dest="recording_command", required=True)
    get = sub.add_parser("get", help="write a session's recording to a JSON Lines file")
    get.add_argument(
        "session_id",
        metavar="ID",
        help="the session (its session_id); one that starts with '-' goes last, after --",
    )
    get.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="where to write it ('-': stdout)"
    )
    get.add_argument(
        "--api",
        default=DEFAULT_API,
        metavar="URL",
        help=f"the gateway's HTTP API (its --port or --api-port; GATEWAY_API_URL; default {DEFAULT_API})",
    )
    get.add_argument(
        "--token",
        help=f"API key of the session's owner (Bearer; default: ${TOKEN_ENV}, unseen by other "
        "processes)",
    )


async def run(ns: argparse.Namespace) -> int:
    """``gateway recording get``: 0 written, 1 the API refused or failed, 2 cannot write."""
    try:
        data = await fetch_recording(ns.api, ns.session_id, token=ns.token or token_from_env())
    except RecordingError as exc:
        print(f"gateway recording: {exc}", file=sys.stderr)
        return 1
    if ns.output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        await asyncio.to_thread(Path(ns.output).write_bytes, data)
    except OSError as exc:
        print(
            f"gateway recording: cannot write {ns.output}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2
    lines = data.count(b"\n")
    print(f"gateway recording: {lines} records ({len(data):,} bytes) written to {ns.output}")
    return 0
