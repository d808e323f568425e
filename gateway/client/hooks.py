"""What a ``Client`` tells its application as it goes, and how it is told.

A hook is set either way a Python user expects: as a constructor argument
(``Client(url, on_audio=play)``) or as an attribute (``c.on_audio = play``,
before or after connecting). ``Hook`` is the attribute: it reads and writes
the one place the client calls the hook from, so neither way is ignored.

Hooks run on the client's reader, as each frame is read: a hook that needs to
wait starts a task. A hook that raises is logged and the client goes on: an
application's bug never ends its session's connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from gateway.client.dial import ClientError
from protocol.events import Event, Session

__all__ = ["Hook", "Hooks", "call_hook"]

log = logging.getLogger("gateway.client")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True)
class Hooks:
    """The hooks a ``Client`` calls: each connection, each disconnect, each audio frame
    of the model's speech, each retried failure, each event no turn's iterator yields."""

    on_connect: Callable[[Session], None] | None = None
    on_disconnect: Callable[[str], None] | None = None
    on_audio: Callable[[int, bytes], None] | None = None
    on_retry: Callable[[ClientError], None] | None = None
    on_event: Callable[[Event], None] | None = None


class Hook(Generic[F]):
    """A hook attribute: kept on the client's ``holder`` attribute (its ``Hooks``, or
    whatever calls the hook), under the attribute's own name."""

    __slots__ = ("_holder", "_name")

    def __init__(self, holder: str) -> None:
        self._holder = holder
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Hook[F]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> F | None: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Hook[F] | F | None:
        if obj is None:
            return self
        hook: F | None = getattr(getattr(obj, self._holder), self._name)
        return hook

    def __set__(self, obj: object, value: F | None) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"{self._name} takes a function (or None), not {type(value).__name__}")
        setattr(getattr(obj, self._holder), self._name, value)


def call_hook(hook: Callable[..., Any] | None, *args: Any) -> None:
    """Call an application's hook; what it raises is logged, never the client's end."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        log.exception("gateway client: the application's %s raised", _name(hook))


def _name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__
