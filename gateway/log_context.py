"""``sid`` and ``node`` on every log record, without threading them through calls.

Each session's work runs in tasks named ``KIND:SID`` (``turn:…``, ``flush:…``,
``writer:…``, ``follow:…``, ``release:…``); ``SessionFilter`` reads the running
task's name and adds ``sid`` to records that do not carry one (an explicit
``extra={"sid": …}`` wins), and adds this process's ``node``. So a log pipeline
can select one session's lines across nodes, and new session code gets the
field by naming its tasks like the rest, not by remembering an ``extra=``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Final

__all__ = ["SessionFilter", "sid_of_current_task"]

# KIND:SID with a session id as Node.new_session_id makes them (token_urlsafe).
_TASK_NAME: Final = re.compile(r"[a-z][a-z-]*:([A-Za-z0-9_-]{8,64})")


def sid_of_current_task() -> str | None:
    """The session id in the running task's name, if it follows ``KIND:SID``."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop (a thread, or at import)
        return None
    if task is None:
        return None
    match = _TASK_NAME.fullmatch(task.get_name())
    return match.group(1) if match else None


class SessionFilter(logging.Filter):
    """Adds ``sid`` (from the task) and ``node`` to records; never drops one."""

    def __init__(self, node: str = "") -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "sid", None) is None:
            sid = sid_of_current_task()
            if sid is not None:
                record.sid = sid
        if self.node and getattr(record, "node", None) is None:
            record.node = self.node
        return True
