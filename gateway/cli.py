"""The ``gateway`` command: ``serve``, ``sim``, ``settings``, ``chat``, ``loadtest``, ``keys``,
``recording``, ``replay``, ``eval``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import importlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, NoReturn
from urllib.parse import urlsplit

from gateway.common.settings import (
    add_flags,
    declared,
    flag_values,
    load,
    markdown_table,
    with_table,
)
from gateway.config import Config, ConfigError, load_config
from gateway.logs import setup_logging
from gateway.sim.model import SimConfig
from gateway.store.base import Health

__all__ = ["main"]

log = logging.getLogger("gateway")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line that says what to do, not a usage dump and an error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message.removeprefix('argument ')}; see {self.prog} --help\n")


async def _serve(config: Config) -> int:
    from gateway.app import running_gateway

    _import_audio_libraries()
    _raise_descriptor_limit()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if config.providers[0] == "sim":
        log.info("upstream: built-in simulator (set --provider openai for the real API)")
    _log_repeats_once()
    async with running_gateway(config) as gateway:
        with contextlib.suppress(NotImplementedError):  # SIGHUP: re-read the API keys file
            loop.add_signal_handler(signal.SIGHUP, gateway.edges.reload_keys)
        _tune_gc()
        # One write: the line tools and tests wait for, then what to do next.
        _announce(_next_steps(gateway.url, gateway.api_url))
        await _check_store(gateway.node.store, config.redis_url)
        await stop.wait()
        log.info("signal received: draining (up to %.0fs)", config.drain_timeout)
        await gateway.drain()
    log.info("stopped")
    return 0


AUDIO_LIBRARIES: Final = ("numpy", "soxr")


def _import_audio_libraries() -> None:
    """Import numpy and soxr on a thread as the node starts, not on the event loop when
    the first audio arrives: every module that uses them imports them on first use
    (gateway.common.pcm: a client or test process that never touches audio is spared
    ~0.3 s), and in a node that first use was a session's frame. A fresh node's first
    700 KB door append held ``/healthz`` 133-183 ms while numpy imported (the
    simulator's VAD, a μ-law call, a resampled microphone all need it); later ones,
    8-11 ms. On a thread the import shares the interpreter with the loop instead of
    holding it, and it is over before most nodes see their first client."""

    def load() -> None:
        started = time.perf_counter()
        for name in AUDIO_LIBRARIES:
            importlib.import_module(name)
        took = (time.perf_counter() - started) * 1000
        log.info("audio libraries (%s) imported in %.0f ms", ", ".join(AUDIO_LIBRARIES), took)

    threading.Thread(target=load, name="import-audio", daemon=True).start()


async def _check_store(store: Health, url: str) -> None:
    """Say at once, in one line, that the store does not answer (the node waits for it)."""
    if not url or url == "memory://":
        return
    try:
        async with asyncio.timeout(3.0):
            answers = await store.ping()
    except TimeoutError:
        answers = False
    if not answers:
        parts = urlsplit(url)
        where = f"{parts.hostname or '?'}:{parts.port or 6379}" if parts.hostname else url
        log.warning(
            "the session store does not answer (Redis at %s): start Redis (redis-server), or "
            "unset --store (and REDIS_URL) to keep sessions in this process; until it answers "
            "this node refuses clients (503) and /readyz answers 503",
            where,
        )


class _RepeatsOnce(logging.Filter):
    """A warning repeated word for word is logged once (again after ``quiet`` seconds).

    An outage makes every retry loop say the same line each second; one line
    says it, and the next different line says what changed.
    """

    def __init__(self, quiet: float = 300.0) -> None:
        super().__init__()
        self.quiet = quiet
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        text = f"{record.name}:{record.getMessage()}"
        now = record.created
        last = self._seen.get(text)
        if last is not None and now - last < self.quiet:
            return False
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[text] = now
        return True


def _log_repeats_once() -> None:
    repeats = _RepeatsOnce()
    for handler in logging.getLogger().handlers:
        handler.addFilter(repeats)


def _check_store_url(url: str) -> None:
    """A store URL ``serve`` cannot use stops it now, in one line (``ConfigError``)."""
    from gateway.store import open_store
    from gateway.store.redis import REDIS_SCHEMES

    if not url or url == "memory://" or url.startswith(REDIS_SCHEMES):
        return
    try:
        open_store(url)
    except ValueError as exc:
        raise ConfigError(f"--store (or --redis, REDIS_URL): {exc}") from None


def _raise_descriptor_limit() -> None:
    """Every connection is a file descriptor: take all the process may have, and say so."""
    from gateway.edge.health import raise_descriptor_limit

    before, now = raise_descriptor_limit()
    if now != before:
        log.info(
            "file descriptors: nofile limit raised from %d to %d (the hard limit)", before, now
        )
    else:
        log.info("file descriptors: nofile limit %d", now)


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``serve`` runs on (None: asyncio's own).

    uvloop's loop and transports are C: measured with
    ``tests/bench/side_by_side_bench.py`` it cuts the node's CPU per event
    (docs/performance.md), where epoll, scheduling and socket writes are a
    third of the cost on the paced path.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "event_loop=uvloop but uvloop is not installed: pip install "
                "'realtime-gateway[uvloop]', or set GATEWAY_EVENT_LOOP=auto"
            ) from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _next_steps(ws_url: str, api_url: str) -> str:
    """The listening line, then where a person goes from here."""
    page = ws_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    page = page.removesuffix("/v1/realtime") + "/"
    lines = [
        f"gateway listening on {ws_url}",
        f"  web page:  {page}",
        f"  terminal:  gateway chat {ws_url}",
    ]
    if api_url:
        lines.append(f"  HTTP API:  {api_url}/v1/sessions")
    return "\n".join(lines)


def _listen_error(exc: OSError, command: str, host: str, port: int, flag: str = "--port") -> str:
    """A failure to listen on ``host:port`` (set by ``flag``), as one line that says what to do."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"gateway {command}: {where} is already in use (another gateway?); stop it, or "
            f"choose another port with {flag} (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"gateway {command}: not allowed to listen on {where}; use a port above 1023 ({flag})"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"gateway {command}: {host} is not an address of this machine; check --host"
    return f"gateway {command}: cannot listen on {where} ({flag}): {exc.strerror or exc}"


_LISTEN_ERRNOS = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)


def _announce(line: str) -> None:
    """One stdout line in one write: workers share the supervisor's stdout, and
    print() writes the text and its newline separately, so lines interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _refuse(line: str) -> int:
    """The one stderr line a start that cannot go on ends with, in one write, and
    exit code 2. The audio import thread logs as the node starts; with print()'s two
    writes its line could land between the text and the newline."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    return 2


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections on the token path.

    Every token allocates a few short-lived objects; at the default threshold
    (700) the collector runs hundreds of times a second under load and its
    pauses show up as latency spikes. Objects from startup (modules, config,
    compiled code) are frozen so collections do not walk them again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)


def build_parser() -> argparse.ArgumentParser:
    """Every command and its flags; the settings' flags come from their declarations."""
    parser = _Parser(prog="gateway", description="WebSocket gateway for realtime LLM APIs")
    sub = parser.add_subparsers(dest="command", required=True)

    serve_p = sub.add_parser(
        "serve",
        help="run a gateway node",
        description="Run a gateway node. Every setting is also a GATEWAY_<NAME> variable "
        "(flags win); API keys of the upstream are variables only (see `gateway settings`).",
    )
    add_flags(serve_p, Config)

    sim_p = sub.add_parser(
        "sim", help="run the upstream simulator (OpenAI Realtime or Gemini Live wire protocol)"
    )
    sim_p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sim_p.add_argument("--port", type=int, default=8800, help="port (0 picks a free one)")
    add_flags(sim_p, SimConfig)

    settings_p = sub.add_parser(
        "settings", help="the settings serve would use now, or the docs' table of them"
    )
    settings_p.add_argument(
        "--markdown", action="store_true", help="print docs/configuration.md's settings table"
    )
    settings_p.add_argument(
        "--write",
        metavar="FILE",
        help="with --markdown: replace the table in FILE (docs/configuration.md)",
    )

    from gateway.client.loadtest_cli import add_loadtest_arguments

    lt_p = sub.add_parser("loadtest", help="many concurrent client sessions against a gateway")
    add_loadtest_arguments(lt_p)

    chat_p = sub.add_parser("chat", help="chat with a gateway from the terminal")
    chat_p.add_argument("url", nargs="?", default="ws://127.0.0.1:8765/v1/realtime")
    chat_p.add_argument(
        "--token", help="API key (Bearer); default: $GATEWAY_TOKEN (unseen by other processes)"
    )
    chat_p.add_argument("--no-color", action="store_true")
    chat_p.add_argument(
        "--audio",
        type=Path,
        metavar="FILE.wav",
        help="speak this 16-bit PCM WAV file first (streamed at real-time pace)",
    )
    chat_p.add_argument(
        "--session", metavar="ID", help="go on in this session (a fork gateway replay left open)"
    )

    from gateway.keys import add_keys_arguments

    keys_p = sub.add_parser("keys", help="issue, list and revoke API keys (file or Redis)")
    add_keys_arguments(keys_p)

    from gateway.client.recording import add_recording_arguments

    recording_p = sub.add_parser(
        "recording", help="a session's recording (flight recorder), from the HTTP API"
    )
    add_recording_arguments(recording_p)

    from gateway.client.replay_cli import add_replay_arguments

    replay_p = sub.add_parser(
        "replay", help="replay a recording's user side against a gateway and compare the turns"
    )
    add_replay_arguments(replay_p)

    from gateway.client.eval_cli import add_eval_arguments

    eval_p = sub.add_parser(
        "eval", help="run scenario files against a gateway: a table, JUnit XML, an exit status"
    )
    add_eval_arguments(eval_p)
    return parser


def _settings(args: argparse.Namespace) -> int:
    """``gateway settings``: the docs' table, or what each setting is here and now."""
    if args.markdown:
        table = markdown_table(Config)
        if args.write is None:
            sys.stdout.write(table)
            return 0
        path = Path(args.write)
        path.write_text(with_table(path.read_text(), table))
        return 0
    config = load_config()
    for d in declared(Config):
        value: object = config
        for part in d.path:
            value = getattr(value, part)
        shown = ("(set)" if value else "(unset)") if d.setting.secret else repr(value)
        print(f"{d.name} = {shown}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            config = load_config(flag_values(args, Config))
            _check_store_url(config.redis_url)
            setup_logging(config.log_level, json=config.log_json, node=config.node_id)
            from gateway.workers import check_workers, supervise

            check_workers(config)
            if config.workers > 1:
                return supervise(config, list(argv if argv is not None else sys.argv[1:]))
            with asyncio.Runner(loop_factory=_loop_factory(config.event_loop)) as runner:
                try:
                    return runner.run(_serve(config))
                except OSError as exc:
                    if exc.errno not in _LISTEN_ERRNOS:
                        raise
                    from gateway.edge.server import ListenFailed

                    if isinstance(exc, ListenFailed):
                        line = _listen_error(exc, "serve", exc.host, exc.port, exc.flag)
                    else:
                        line = _listen_error(exc, "serve", config.host, config.port)
                    return _refuse(line)
        if args.command == "sim":
            from gateway.sim.server import run_sim

            setup_logging("WARNING")
            try:
                asyncio.run(
                    run_sim(
                        load(SimConfig, flag_values(args, SimConfig)),
                        args.host,
                        args.port,
                        # The actual URL (with --port 0) for people and test harnesses.
                        on_ready=lambda sim: _announce(f"simulator listening on {sim.endpoint}"),
                    )
                )
            except OSError as exc:
                if exc.errno not in _LISTEN_ERRNOS:
                    raise
                return _refuse(_listen_error(exc, "sim", args.host, args.port))
            return 0
        if args.command == "settings":
            return _settings(args)
        if args.command == "loadtest":
            from gateway.client.loadtest_cli import run_loadtest_cli

            return asyncio.run(run_loadtest_cli(args))
        if args.command == "chat":
            from gateway.client.chat import run_chat
            from gateway.client.dial import token_from_env

            return asyncio.run(
                run_chat(
                    args.url,
                    token=args.token or token_from_env(),
                    color=not args.no_color,
                    audio=args.audio,
                    session_id=args.session,
                )
            )
        if args.command == "keys":
            from gateway.keys import run_keys

            return run_keys(args)
        if args.command == "recording":
            from gateway.client import recording

            return asyncio.run(recording.run(args))
        if args.command == "replay":
            from gateway.client.replay_cli import run_replay_cli

            return asyncio.run(run_replay_cli(args))
        if args.command == "eval":
            from gateway.client.eval_cli import run_eval_cli

            return asyncio.run(run_eval_cli(args))
    except ConfigError as exc:
        return _refuse(f"gateway: {exc}")
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
