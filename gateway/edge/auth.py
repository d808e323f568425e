"""Who is connecting: API keys, where they are kept, and the checks at the handshake.

A client proves it holds an API key; the gateway knows the key only by its
SHA-256 digest (hex), so a leaked keys file or Redis dump does not leak keys.
The key's *id* (``key_id``) is the principal: sessions are owned by it, limits
count per it, logs name it. The raw key lives only as long as one handshake.

Where keys are kept (either or both):

- a file (``--api-keys-file``), one ``key_id:sha256hex`` per line, ``#``
  comments, optionally followed by ``tools=read,calc.*`` (the key's allow-list
  of tools, ``tools.allowlist``); re-read when it changes (looked at every
  ``RIGHTS_CHECK`` s by the node's rights watch, ``gateway.edge.rights``) and
  on SIGHUP, so keys rotate without a restart, and a key removed from it is
  revoked at once; a large file is read off the loop, one over
  ``MAX_KEYS_FILE_BYTES`` not at all (``gateway.common.reloaded_file``);
- Redis (``--api-keys-redis``): the hash ``{key_prefix}:keys`` maps digest →
  key_id (or ``key_id tools=read,calc.*``), shared by every node; ``gateway keys add|list|revoke`` manage it.

How a client presents a key, in the order checked: ``Authorization: Bearer
KEY``; the subprotocol ``rtgw.bearer.KEY`` offered next to ``rtgw.v1`` (browsers
cannot set headers on a WebSocket, and the subprotocol header stays out of URLs
and access logs); ``?token=KEY`` (browsers, simplest; refused with
``--no-allow-keys-in-urls``). Each place also takes a *client token*
(``gateway.edge.tokens``), which is how browsers should connect: it opens
one session for a few minutes and is worth nothing else.

No key source configured means auth is off: every client is ``anonymous``.
That is allowed on a loopback address only (``check_exposure``), so the
embedded default keeps working with no setup but cannot be exposed by accident.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs

from websockets.datastructures import Headers, MultipleValuesError

from gateway.common.reloaded_file import MiB, ReloadedFile
from gateway.config import Config, ConfigError
from gateway.edge.http_requests import split_target
from gateway.store.base import Secrets, StoreError
from tools.allowlist import AllowList, parse_allow_list

__all__ = [
    "ANONYMOUS",
    "BEARER_PREFIX",
    "MAX_KEYS_FILE_BYTES",
    "SUBPROTOCOL",
    "Credentials",
    "KeyFile",
    "KeyId",
    "KeyStoreUnavailable",
    "RedisKeys",
    "auth_configured",
    "check_exposure",
    "credentials_from",
    "hash_key",
    "is_loopback",
    "parse_key_line",
    "parse_key_options",
    "split_key_value",
    "valid_key_id",
]

log = logging.getLogger("gateway.edge.auth")

ANONYMOUS: Final = "anonymous"
"""The principal of every client while auth is off."""

SUBPROTOCOL: Final = "rtgw.v1"
"""The subprotocol the server selects; browsers offer it next to the bearer one."""

BEARER_PREFIX: Final = "rtgw.bearer."
"""``Sec-WebSocket-Protocol: rtgw.v1, rtgw.bearer.KEY`` carries a key from a browser."""

_KEY_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")

HOW_TO_AUTHENTICATE: Final = (
    "send your API key as the header `Authorization: Bearer KEY`; browsers add `?token=KEY` "
    "to the URL or offer the subprotocols `rtgw.v1` and `rtgw.bearer.KEY`, with as KEY a "
    "client token their app's backend got from POST /v1/sessions. "
    "The gateway's operator issues keys (`gateway keys add KEY_ID`)"
)


def hash_key(key: str) -> str:
    """The SHA-256 hex digest of ``key``: the only form in which keys are stored."""
    return hashlib.sha256(key.encode()).hexdigest()


class KeyId(str):
    """A key id as an API key proved it, with that key's digest.

    Wherever the id travels (the HTTP API's handlers take it as a plain
    ``str``), a client token minted for it names the key that minted it
    (``ClientTokens.mint``), so revoking that key revokes the token.
    """

    digest: str

    def __new__(cls, key_id: str, digest: str) -> KeyId:
        made = super().__new__(cls, key_id)
        made.digest = digest
        return made


def valid_key_id(key_id: str) -> bool:
    """Key ids name principals in meta, Redis keys and logs: 1-64 of ``[A-Za-z0-9._-]``."""
    return _KEY_ID.fullmatch(key_id) is not None


def parse_key_line(line: str) -> tuple[str, str] | None:
    """``(key_id, digest)`` of one keys-file line, None for blanks and comments.

    Raises ``ValueError`` saying what a good line looks like.
    """
    parsed = _parse_key_entry(line)
    return None if parsed is None else (parsed[0], parsed[1])


def parse_key_options(text: str) -> AllowList | None:
    """The options after a key's digest (``tools=read,calc.*``): its allow-list, if any.

    Raises ``ValueError`` saying what a good option looks like.
    """
    allowed: AllowList | None = None
    for option in text.split():
        name, sep, value = option.partition("=")
        if name != "tools" or not sep:
            raise ValueError(
                f"unknown key option {option[:40]!r}; the only option is tools=NAME,NAME,… "
                "(the tools this key's sessions may call; globs like calc.* allowed)"
            )
        allowed = parse_allow_list(value)
    return allowed


def split_key_value(value: str) -> tuple[str, AllowList | None]:
    """A Redis keys-hash value, ``key_id`` or ``key_id tools=…``: the id and its allow-list.

    A value whose options do not parse allows no tool (logged): failing closed.
    """
    key_id, _, options = value.strip().partition(" ")
    try:
        return key_id, parse_key_options(options)
    except ValueError as exc:
        log.error("api key %s in Redis: %s; its sessions may call no tool", key_id, exc)
        return key_id, AllowList(())


def _parse_key_entry(line: str) -> tuple[str, str, AllowList | None] | None:
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    key_id, sep, rest = text.partition(":")
    digest, _, options = rest.strip().partition(" ")
    key_id, digest = key_id.strip(), digest.strip().lower()
    if not sep or not valid_key_id(key_id) or _DIGEST.fullmatch(digest) is None:
        raise ValueError(
            "expected `key_id:sha256hex` (key_id of 1-64 letters, digits, `._-`; the "
            "64-hex-digit SHA-256 of the key: `gateway keys hash KEY_ID` prints the line), "
            "optionally followed by tools=NAME,NAME,…"
        )
    return key_id, digest, parse_key_options(options)


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name: it may resolve to anything


def auth_configured(config: Config) -> bool:
    return bool(config.api_keys_file) or config.api_keys_redis


def check_exposure(config: Config) -> None:
    """Refuse to serve a non-loopback host without auth unless told to; warn when off.

    Raises ``ConfigError`` telling the operator how to configure keys.
    """
    if config.api_keys_redis and not config.store:
        raise ConfigError(
            "api_keys_redis needs a Redis store: set --store (GATEWAY_STORE, or REDIS_URL), "
            "or use --api-keys-file"
        )
    if auth_configured(config):
        return
    where = config.host or "every interface"
    if is_loopback(config.host):
        log.warning(
            "auth is OFF: no API keys are configured, so anyone who can reach %s uses this "
            "gateway (fine on this machine for development; configure --api-keys-file or "
            "--api-keys-redis before exposing it)",
            where,
        )
        return
    if config.insecure_no_auth:
        log.warning(
            "auth is OFF on %s (--insecure-no-auth): anyone who can reach this address can "
            "use this gateway and spend its upstream API key",
            where,
        )
        return
    raise ConfigError(
        f"refusing to listen on {config.host} without authentication: anyone who can reach "
        "it could use the gateway. Configure API keys with --api-keys-file PATH "
        "(`gateway keys add KEY_ID --file PATH` makes one) or --api-keys-redis, "
        "see docs/operations.md; or pass --insecure-no-auth "
        "(GATEWAY_INSECURE_NO_AUTH=true) if this network is trusted"
    )


# --------------------------------------------------------------------- credentials


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a handshake presented: a key (maybe) and how, or why it is unreadable."""

    key: str | None
    via: str = ""
    problem: str = ""


def _header_values(headers: Headers, name: str) -> list[str]:
    return [v.strip() for raw in headers.get_all(name) for v in raw.split(",") if v.strip()]


def credentials_from(headers: Headers, path: str) -> Credentials:
    """The API key a handshake request carries (header, subprotocol or query).

    Several places carrying different keys are refused, not ranked: with one
    silently ignored, a valid ``?token=`` behind a stale header was refused with no
    hint why, and which credential a request ran under was left to our order."""
    found = _presented(headers, path)
    if found.problem or found.key is None:
        return found
    tokens = set(parse_qs(split_target(path)[1]).get("token", ()))
    if found.via != "query" and tokens - {found.key}:
        return Credentials(None, problem=_SEVERAL)
    return found


_SEVERAL = (
    "the request carries different keys in several places; send the key in one: "
    "the Authorization header, the subprotocol or ?token="
)


def _presented(headers: Headers, path: str) -> Credentials:
    try:
        authorization = headers.get("Authorization")
    except MultipleValuesError:
        return Credentials(None, problem="send one Authorization header, not several")
    offered = _header_values(headers, "Sec-WebSocket-Protocol")
    bearers = [p[len(BEARER_PREFIX) :] for p in offered if p.startswith(BEARER_PREFIX)]
    if authorization is not None:
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return Credentials(
                None, problem="the Authorization header must be `Bearer KEY` (an API key)"
            )
        if set(bearers) - {key.strip()}:
            return Credentials(None, problem=_SEVERAL)
        return Credentials(key.strip(), "header")
    if bearers:
        if SUBPROTOCOL not in offered:
            return Credentials(
                None,
                problem=f"offer the subprotocol `{SUBPROTOCOL}` together with "
                f"`{BEARER_PREFIX}KEY`; the server selects `{SUBPROTOCOL}`",
            )
        if len(set(bearers)) > 1:
            return Credentials(None, problem=_SEVERAL)
        return Credentials(bearers[0], "subprotocol")
    tokens = parse_qs(split_target(path)[1]).get("token")
    if tokens:
        if len(set(tokens)) > 1:
            return Credentials(None, problem=_SEVERAL)
        return Credentials(tokens[-1], "query")
    return Credentials(None)


# --------------------------------------------------------------------- key sources


class KeyStoreUnavailable(Exception):
    """Keys kept in Redis cannot be read right now: refuse with 503, not 401."""


MAX_KEYS_FILE_BYTES: Final = 8 * MiB
"""A keys file larger than this is refused before it is read: ~110,000 keys of 72-byte
lines, parsed in ~0.4 s (in a worker thread). A fleet with more keeps them in Redis."""


@dataclass(frozen=True, slots=True)
class _Keys:
    """What a keys file holds: ``(digest, key_id)`` per line, and the allow-lists."""

    entries: list[tuple[str, str]]
    issued: dict[str, str]  # digest → key_id, built in the worker thread too
    tools: dict[str, AllowList]
    key_ids: frozenset[str]  # the rights watch asks per connection and tick


class KeyFile(ReloadedFile[_Keys]):
    """API keys from a file of ``key_id:sha256hex`` lines, re-read when it changes.

    A presented key is looked up by its SHA-256 digest, as in Redis (``lookup``).
    """

    what = "api keys file"
    setting = "api_keys_file"
    max_bytes = MAX_KEYS_FILE_BYTES
    # ~1 ms of parsing (~220 keys): a SIGHUP or an edit of a usual file acts at once.
    inline_bytes = 16 * 1024
    too_large_hint = (
        "remove the keys of former clients (`gateway keys revoke`), or keep keys in Redis "
        "(--api-keys-redis)"
    )
    keep_when_empty = False  # an emptied keys file revokes every key: fail closed
    _log = log

    def __init__(self, path: str | Path, *, check_interval: float = 0.25) -> None:
        self._entries: list[tuple[str, str]] = []  # (digest, key_id)
        self._issued: dict[str, str] = {}  # digest → key_id
        self._key_ids: frozenset[str] = frozenset()
        self._tools: dict[str, AllowList] = {}  # key_id → allow-list (keys that have one)
        super().__init__(path, check_interval=check_interval)

    def __len__(self) -> int:
        return len(self._entries)

    def key_ids(self) -> list[str]:
        return sorted({key_id for _, key_id in self._entries})

    def tools_for(self, key_id: str) -> AllowList | None:
        """The tools ``key_id``'s sessions may call (None: every tool)."""
        return self._tools.get(key_id)

    def issued(self, digest: str) -> str | None:
        """The key id of ``digest`` if the file holds it, as loaded now.

        For digests the gateway recorded itself (a live connection's key, a
        client token's signed ``kd``); ``lookup`` for a presented key.
        """
        return self._issued.get(digest)

    def has_key_id(self, key_id: str) -> bool:
        """Whether ``key_id`` holds a key in the file, as loaded now."""
        return key_id in self._key_ids

    def _parse(self, text: str) -> _Keys:
        entries: list[tuple[str, str]] = []
        tools: dict[str, AllowList] = {}
        for number, line in enumerate(text.splitlines(), 1):
            try:
                parsed = _parse_key_entry(line)
            except ValueError as exc:
                raise ValueError(f"{self.path} line {number}: {exc}") from None
            if parsed is not None:
                entries.append((parsed[1], parsed[0]))
                if parsed[2] is not None:
                    tools[parsed[0]] = parsed[2]
        issued = {digest: key_id for digest, key_id in entries}
        return _Keys(entries, issued, tools, frozenset(issued.values()))

    def _apply(self, value: _Keys) -> bool:
        changed = value.entries != self._entries
        self._entries = value.entries
        self._tools = value.tools
        self._issued = value.issued
        self._key_ids = value.key_ids
        assert self.path is not None
        warning = file_mode_warning(self.path)
        if warning is not None:
            log.warning("api keys file: %s", warning)
        if not self._entries:
            log.warning(
                "api keys file %s holds no keys: every client is refused until one is added",
                self.path,
            )
        return changed

    def _loaded(self) -> str:
        return f"{len(self._entries)} keys"

    def _kept(self) -> str:
        return f"the {len(self._entries)} keys loaded"

    def _missing(self) -> str:
        return f"create it with `gateway keys add KEY_ID --file {self.path}`"

    def lookup(self, digest: str) -> str | None:
        """The key id whose stored digest equals ``digest``.

        A dict lookup by digest, as ``RedisKeys`` does: what its timing could reveal
        is at most about the SHA-256 digest of a guess, which says nothing about a
        real key. The constant-time scan of every stored digest it replaced cost a
        handshake ~27 ms of the loop with a keys file at its 8 MiB cap (110,000
        keys), and anyone may attempt a handshake.
        """
        self.poll()
        return self._issued.get(digest)


class RedisKeys:
    """API keys in the store's keys hash (digest → key_id), shared by nodes (``--api-keys-redis``).

    Read through the store's ``Secrets`` interface, so every store URL works
    (one server, Sentinel, Cluster) on the store's own connections and
    failover handling. The lookup is by digest, so the raw key never leaves
    the node and what a timing difference could reveal is at most about a
    SHA-256 digest of a guess, which says nothing about a real key.
    """

    def __init__(self, store: Secrets) -> None:
        self._store = store

    async def lookup(self, digest: str) -> tuple[str, AllowList | None] | None:
        """The key id of ``digest`` and its allow-list of tools (None: every tool)."""
        try:
            raw = await self._store.api_key(digest)
        except StoreError as exc:
            raise KeyStoreUnavailable(str(exc)) from exc
        return split_key_value(raw) if raw is not None else None

    async def issued(self, digests: Sequence[str]) -> dict[str, str]:
        """digest → key id of those of ``digests`` that are issued now (one round trip)."""
        if not digests:
            return {}
        try:
            raw = await self._store.api_keys(digests)
        except StoreError as exc:
            raise KeyStoreUnavailable(str(exc)) from exc
        return {digest: value.strip().partition(" ")[0] for digest, value in raw.items()}

    async def key_ids(self) -> set[str]:
        """Every key id a key is issued for (for tokens that name no key, minted
        before tokens did)."""
        try:
            raw = await self._store.all_api_keys()
        except StoreError as exc:
            raise KeyStoreUnavailable(str(exc)) from exc
        return {value.strip().partition(" ")[0] for value in raw.values()}

    async def close(self) -> None:
        """Nothing to release: the connections are the store's."""


def file_mode_warning(path: Path) -> str | None:
    """A warning when others may write the keys file (whoever writes it lets anyone in).

    Digests are not secrets, so a world-readable file is fine.
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if mode & 0o022:
        return (
            f"{path} is writable by group or others: anyone who can write it can add a key "
            f"(chmod 600 {path})"
        )
    return None
