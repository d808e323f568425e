"""``gateway keys``: issue, list and revoke API keys, in a keys file or in Redis.

A key is shown once, when it is made; only its SHA-256 digest is stored, next
to its id. Running gateways pick changes up by themselves: a keys file is
re-read when it changes (or on SIGHUP), and Redis keys are read per handshake.
Revoking takes effect at once: within a second every node refuses the key and
the client tokens it minted, and closes their connections with 4401 (a
revocation in Redis is also announced on the nodes' control bus, so they act
on it in milliseconds; ``gateway.edge.rights``).

    gateway keys add alice --file /etc/rtgw/keys     # prints the new key once
    gateway keys add alice --store redis://r:6379/0  # the same, in Redis (the store's keys)
    gateway keys add bob --file /etc/rtgw/keys --tools read,calc.*  # bob's sessions: these tools only
    gateway keys list --file /etc/rtgw/keys
    gateway keys revoke alice --store redis://r:6379/0
    printf %s "$KEY" | gateway keys hash alice        # a line for a key you already have
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TextIO, TypeVar

from gateway.edge.auth import hash_key, parse_key_line, split_key_value, valid_key_id
from gateway.store.base import Store, StoreError
from tools.allowlist import parse_allow_list

__all__ = ["add_keys_arguments", "new_key", "run_keys"]

T = TypeVar("T")

KEY_PREFIX = "rtgw_"


def new_key() -> str:
    """A fresh API key: 256 random bits, URL- and subprotocol-safe characters only."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def add_keys_arguments(p: argparse.ArgumentParser) -> None:
    """The ``gateway keys`` subcommands (wired by ``gateway.cli``)."""
    sub = p.add_subparsers(dest="keys_command", required=True)
    for name, help_text in (
        ("add", "make a key for KEY_ID, store its hash, print the key once"),
        ("list", "list key ids"),
        ("revoke", "remove every key of KEY_ID"),
    ):
        sp = sub.add_parser(name, help=help_text)
        if name != "list":
            sp.add_argument(
                "key_id", metavar="KEY_ID", help="the key's name (1-64 of A-Za-z0-9._-)"
            )
        where = sp.add_mutually_exclusive_group()
        where.add_argument("--file", help="the keys file (--api-keys-file of gateway serve)")
        where.add_argument(
            "--store",
            "--redis",
            dest="store",
            help="the store's Redis URL, as --store of gateway serve (default $GATEWAY_STORE, "
            "else $REDIS_URL), holding the hash PREFIX:keys",
        )
        sp.add_argument(
            "--prefix",
            default=os.environ.get("GATEWAY_KEY_PREFIX", "rtgw"),
            help="Redis key prefix (default rtgw, as --key-prefix of gateway serve)",
        )
        if name == "add":
            sp.add_argument(
                "--tools",
                metavar="NAME,NAME,…",
                help="the only tools this key's sessions may call (globs like calc.* allowed; "
                "empty: none); default every tool",
            )
    hp = sub.add_parser("hash", help="read a key on stdin, print its keys-file line")
    hp.add_argument("key_id", metavar="KEY_ID")


def run_keys(args: argparse.Namespace, *, stdin: TextIO | None = None) -> int:
    """Run a ``gateway keys`` subcommand; the exit status."""
    out, err = sys.stdout, sys.stderr
    command: str = args.keys_command
    key_id: str | None = getattr(args, "key_id", None)
    if key_id is not None and not valid_key_id(key_id):
        print(f"gateway keys: {key_id!r} is not a key id: use 1-64 of A-Za-z0-9._-", file=err)
        return 2
    if command == "hash":
        assert key_id is not None
        key = (stdin or sys.stdin).read().strip()
        if not key:
            print("gateway keys hash: pass the key on stdin", file=err)
            return 2
        print(f"{key_id}:{hash_key(key)}", file=out)
        return 0
    options = ""
    tools: str | None = getattr(args, "tools", None)
    if tools is not None:
        try:
            parse_allow_list(tools)
        except ValueError as exc:
            print(f"gateway keys add: {exc}", file=err)
            return 2
        options = f" tools={','.join(p.strip() for p in tools.split(',') if p.strip())}"
    if args.file:
        backend: _Backend = _FileBackend(Path(args.file))
    else:
        url = args.store or os.environ.get("GATEWAY_STORE") or os.environ.get("REDIS_URL", "")
        if not url:
            print(
                "gateway keys: say where keys live: --file PATH, or --store URL of Redis "
                "($GATEWAY_STORE or $REDIS_URL)",
                file=err,
            )
            return 2
        backend = _StoreBackend(url, args.prefix)
    try:
        if command == "add":
            assert key_id is not None
            key = new_key()
            backend.add(key_id, hash_key(key), options)
            print(key, file=out)
            print(
                f"# key {key_id!r} added to {backend.where}; it is shown only now. Clients send "
                "it as `Authorization: Bearer KEY` (or ?token=KEY).",
                file=err,
            )
        elif command == "list":
            if isinstance(backend, _FileBackend) and not backend.path.exists():
                print(
                    f"gateway keys: there is no keys file at {backend.path} (yet): "
                    f"`gateway keys add KEY_ID --file {backend.path}` makes it",
                    file=err,
                )
                return 1
            listed = backend.list()
            for listed_id, digest in listed:
                print(f"{listed_id}\t{digest[:12]}…", file=out)
            if not listed:
                print(f"# no keys in {backend.where}", file=err)
        elif command == "revoke":
            assert key_id is not None
            removed = backend.revoke(key_id)
            if not removed:
                print(f"gateway keys: no key {key_id!r} in {backend.where}", file=err)
                return 1
            print(f"# revoked {removed} key(s) of {key_id!r} in {backend.where}", file=err)
    except (OSError, ValueError) as exc:
        print(f"gateway keys: {exc}", file=err)
        return 1
    return 0


class _Backend:
    where = ""

    def add(self, key_id: str, digest: str, options: str = "") -> None:
        """Store ``digest`` for ``key_id``; ``options`` (`` tools=…``) follow it."""
        raise NotImplementedError

    def list(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def revoke(self, key_id: str) -> int:
        raise NotImplementedError


class _FileBackend(_Backend):
    """Lines ``key_id:sha256hex``; rewritten atomically, created mode 0600."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def _text(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise OSError(self._problem("read", exc)) from None

    def _write(self, text: str) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        except OSError as exc:
            raise OSError(self._problem("write", exc)) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)  # readers see the old file or the new one
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):  # a full disk, a directory at the path, …
                raise OSError(self._problem("write", exc)) from None
            raise

    def _problem(self, doing: str, exc: OSError) -> str:
        """One line for a keys file that cannot be read or written: which, why, what to do."""
        why = exc.strerror or str(exc)
        if exc.filename and str(exc.filename) != str(self.path):
            why += f": {exc.filename}"
        return (
            f"cannot {doing} the keys file {self.path} ({why}); pass --file a path in a "
            "folder you may write (it is made if missing; the file gets mode 0600), "
            "e.g. --file ./api-keys"
        )

    def add(self, key_id: str, digest: str, options: str = "") -> None:
        text = self._text()
        if text and not text.endswith("\n"):
            text += "\n"
        self._write(text + f"{key_id}:{digest}{options}\n")

    def list(self) -> list[tuple[str, str]]:
        out = []
        for number, line in enumerate(self._text().splitlines(), 1):
            try:
                parsed = parse_key_line(line)
            except ValueError as exc:
                raise ValueError(f"{self.path} line {number}: {exc}") from None
            if parsed is not None:
                out.append(parsed)
        return out

    def revoke(self, key_id: str) -> int:
        kept, removed = [], 0
        for line in self._text().splitlines():
            try:
                parsed = parse_key_line(line)
            except ValueError:
                parsed = None  # keep lines we do not understand; the gateway reports them
            if parsed is not None and parsed[0] == key_id:
                removed += 1
            else:
                kept.append(line)
        if removed:
            self._write("".join(f"{line}\n" for line in kept))
        return removed


class _StoreBackend(_Backend):
    """The store's keys hash (``Secrets``): digest → ``key_id [tools=…]``."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.where = f"Redis {prefix}:keys"

    def _run(self, work: Callable[[Store], Awaitable[T]]) -> T:
        from gateway.store import open_store  # Redis' client, only for this command

        async def main() -> T:
            store = open_store(self.url, prefix=self.prefix)
            try:
                return await work(store)
            except StoreError as exc:
                raise OSError(str(exc)) from exc
            finally:
                await store.close()

        return asyncio.run(main())

    def add(self, key_id: str, digest: str, options: str = "") -> None:
        async def work(store: Store) -> None:
            await store.put_api_key(digest, key_id + options)

        self._run(work)

    def list(self) -> list[tuple[str, str]]:
        async def work(store: Store) -> list[tuple[str, str]]:
            issued = await store.all_api_keys()
            return sorted((split_key_value(v)[0], d) for d, v in issued.items())

        return self._run(work)

    def revoke(self, key_id: str) -> int:
        async def work(store: Store) -> int:
            issued = await store.all_api_keys()
            digests = [d for d, v in issued.items() if split_key_value(v)[0] == key_id]
            removed = await store.remove_api_keys(digests)
            if removed:
                await _announce(store, tuple(digests))
            return removed

        return self._run(work)


async def _announce(store: Store, digests: tuple[str, ...]) -> None:
    """Tell every node to look at these keys now (``control.KeysChanged``).

    Only a hint: nodes also look by themselves every half second, so a
    failure here delays the effect a little and is not an error.
    """
    from gateway.sessions.control import RIGHTS_CHANNEL, KeysChanged, encode_control

    try:
        await store.publish(RIGHTS_CHANNEL, encode_control(KeysChanged(digests)))
    except StoreError as exc:
        print(
            f"# could not tell the nodes at once ({exc}); they notice within a second",
            file=sys.stderr,
        )
