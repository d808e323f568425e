"""The caller approves on the keypad: ``1`` allows a call waiting for approval, ``2`` denies it.

A tool that requires approval (the tools file, the key's policy,
or the numbers file's ``require_approval``) waits for an ``approve``. On a
phone call the app's other clients may send it (a console, a supervisor's
screen), as for any session; with the numbers file's ``keypad_approval =
true`` the caller may too, with a key: the model says what it is about to
do and asks for 1 or 2 (its instructions tell it to), the call reads the
session's ``approval_required`` and ``approval`` events, and the caller's
next ``1`` or ``2`` decides the oldest call still waiting. Other keys stay
ordinary key presses. Pure: the call (``gateway.phone.call``) feeds it the
log's events and the caller's keys, and sends the ``Approve`` it returns.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from protocol.events import Approve

__all__ = ["KEYS", "KeypadApprovals"]

KEYS: Final[dict[str, Literal["allow", "deny"]]] = {"1": "allow", "2": "deny"}


class _Waiting(msgspec.Struct):
    id: str = ""
    digest: str = ""


_waiting: Final = msgspec.json.Decoder(_Waiting).decode


class KeypadApprovals:
    """The calls of a phone call's session waiting for approval, oldest first."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: dict[str, str] = {}  # call id → digest, in the order asked

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def asked(self, event: bytes) -> None:
        """An ``approval_required`` event (its logged JSON): the call waits."""
        waiting = _waiting(event)
        if waiting.id:
            self._waiting[waiting.id] = waiting.digest

    def decided(self, event: bytes) -> None:
        """An ``approval`` event (its logged JSON): the call waits no more."""
        self._waiting.pop(_waiting(event).id, None)

    def press(self, digit: str) -> Approve | None:
        """The decision a key makes: on the oldest call waiting, if the key decides."""
        decision = KEYS.get(digit)
        if decision is None or not self._waiting:
            return None
        call_id, digest = next(iter(self._waiting.items()))
        del self._waiting[call_id]  # a second press must not decide it again
        return Approve(id=call_id, digest=digest, decision=decision)
