"""Sessions made on this node that are not stored yet, and who owns them."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping

__all__ = ["NewSessions"]


class NewSessions(MutableMapping[str, str]):
    """New sessions of this node that are not stored yet: sid → owner.

    Until its first turn a session exists only here (and in the runtime that
    drives it), so only this node can attach to it. When its last connection
    leaves, it stays attachable for ``grace`` seconds, long enough for a
    client that was disconnected (a bad frame's close, a network blip) to come
    back with ``session_id``; then it is forgotten. Memory stays bounded by
    the connections of the last ``grace`` seconds.
    """

    def __init__(self, grace: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self._clock = clock
        self._owners: dict[str, str] = {}
        self._left: OrderedDict[str, float] = OrderedDict()  # sid → when, oldest first

    def add(self, sid: str, owner: str) -> None:
        self._expire()
        self._owners[sid] = owner
        self._left.pop(sid, None)

    def owner(self, sid: str) -> str | None:
        self._expire()
        return self._owners.get(sid)

    def left(self, sid: str) -> None:
        """The session's last connection closed: forget it after ``grace``."""
        if sid in self._owners:
            self._left[sid] = self._clock()
            self._left.move_to_end(sid)

    def _expire(self) -> None:
        deadline = self._clock() - self.grace
        left = self._left
        while left:
            sid, when = next(iter(left.items()))
            if when > deadline:
                break
            del left[sid]
            self._owners.pop(sid, None)

    # The mapping interface (the connection reads and pops owners).
    def __getitem__(self, sid: str) -> str:
        return self._owners[sid]

    def __setitem__(self, sid: str, owner: str) -> None:
        self.add(sid, owner)

    def __delitem__(self, sid: str) -> None:
        del self._owners[sid]
        self._left.pop(sid, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._owners)

    def __len__(self) -> int:
        return len(self._owners)
