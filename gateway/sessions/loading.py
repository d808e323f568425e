"""What a node reads of a stored session before it drives it (``Node._load``).

A stored session is its meta (configuration, owner, usage), its log's head and
its history; these read them without holding the loop: the history a page at a
time, the client tools' schemas compiled off the loop before the synchronous
setup needs them.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.sessions.port import CONFIG_QUOTA, UNUSED, config_bytes
from gateway.store.base import Store, StoreError
from protocol.assembly import HistoryItem, decode_history_item
from protocol.configuration import decode_config
from tools.client import prepare

__all__ = ["first_use", "meta_float", "prepare_tools", "read_history"]

log = logging.getLogger("gateway.sessions.node")

_HISTORY_PAGE = 32
"""History items read (and decoded) at a time when a session is loaded: an item is at
most a client frame or a capped tool result, so a page is tens of MB at worst."""


async def read_history(store: Store, sid: str) -> list[HistoryItem]:
    """The session's history, read and decoded a page at a time: a long history of
    large items is never held twice (its bytes and its items), and decoding it
    does not hold the loop (it yields between pages)."""
    history: list[HistoryItem] = []
    while True:
        page = await store.read_history(sid, len(history), _HISTORY_PAGE)
        history += [decode_history_item(b) for b in page]
        if len(page) < _HISTORY_PAGE:
            return history
        del page
        await asyncio.sleep(0)


async def prepare_tools(meta: dict[str, str]) -> None:
    """Compile a stored session's client tool schemas off the loop, before the
    synchronous ``setup`` needs them (cached by content: a reconnect costs nothing)."""
    try:
        config = decode_config(meta.get("config", ""))
    except (ValueError, TypeError):
        return  # stored_setup logs it
    await prepare(config.tools)


async def first_use(store: Store, sid: str, meta: dict[str, str], session_ttl: float) -> None:
    """A session made by the HTTP API has its first client: keep it ``session_ttl``.

    It was stored for ``unused_session_ttl`` only; any meta write restarts
    the normal idle TTL, and its configuration counts against its key's
    quota for as long. A failure is not fatal: the session's first append
    restarts its TTL too.
    """
    try:
        await store.set_meta(sid, {UNUSED: "0"})
        key = CONFIG_QUOTA.format(key=meta.get("owner", ""))
        await store.hold_bytes(key, sid, config_bytes(meta), 0, session_ttl)
    except StoreError as exc:
        log.warning("session %s: first use not recorded: %s", sid, exc, extra={"sid": sid})


def meta_float(text: str) -> float:
    """A meta number ("" or garbage: 0, so a bad field never stops a session loading)."""
    try:
        return float(text or 0)
    except ValueError:
        return 0.0
