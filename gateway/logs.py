"""Logging setup: readable lines for a terminal, JSON lines for a log pipeline.

JSON lines carry the session id when the record has one (``extra={"sid": …}``
or a ``session_id``-bearing message argument is not parsed: pass it as extra).
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

from gateway.log_context import SessionFilter

__all__ = ["JsonFormatter", "setup_logging"]

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extras (sid, node, …), exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str = "INFO", *, json: bool = False, node: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    # sid (from the session task's name) and node on every record: gateway.log_context.
    handler.addFilter(SessionFilter(node))
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        fmt.converter = time.gmtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # websockets logs every failed handshake at INFO, and aiortc's ICE (aioice) every
    # candidate pair it checks, with the peers' addresses (half a node's log after a
    # score of WebRTC calls); keep them for DEBUG.
    for chatty in ("websockets", "aioice", "aiortc"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
