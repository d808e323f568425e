"""The ``gateway`` command: ``serve``, ``sim``, ``chat``, ``loadtest``, ``keys``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gateway.config import Config, ConfigError, load_config
from gateway.logs import setup_logging

__all__ = ["main"]

log = logging.getLogger("gateway")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--provider", choices=["sim", "openai", "gemini"], help="upstream API (default sim)"
    )
    p.add_argument("--model", help="upstream model name")
    p.add_argument(
        "--openai-base-url", help="OpenAI Realtime base URL (default wss://api.openai.com/v1)"
    )
    p.add_argument(
        "--gemini-base-url",
        help="Gemini Live base URL (default wss://generativelanguage.googleapis.com)",
    )
    p.add_argument(
        "--sim-flavor",
        choices=["openai", "gemini"],
        help="wire protocol of the built-in simulator (default openai)",
    )
    p.add_argument("--redis", dest="redis_url", help="Redis URL (default: $REDIS_URL, else memory)")
    p.add_argument("--node-id", help="this node's id in leases and logs (default host-pid-random)")
    p.add_argument("--workspace-root", help="directory holding one tool workspace per session")
    p.add_argument(
        "--enable-shell",
        action="store_const",
        const=True,
        help="offer the shell tool (off by default)",
    )
    p.add_argument("--instructions", help="extra instructions appended to the system prompt")
    p.add_argument("--lease-ttl", type=float, help="seconds a node's session lease lasts unrenewed")
    p.add_argument("--drain-timeout", type=float, help="seconds SIGTERM waits for running turns")
    p.add_argument("--max-frame", type=int, help="largest client frame in bytes (default 1 MiB)")
    p.add_argument("--sim-tokens-per-second", type=float, help="simulator pacing (0 = unpaced)")
    p.add_argument("--sim-chunk-size", type=int, help="simulator characters per delta")
    p.add_argument(
        "--sim-first-token-delay", type=float, help="simulator delay before the first delta"
    )
    p.add_argument(
        "--sim-drop-after", type=int, help="simulator drops its connection after N deltas"
    )
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes sharing the port, one node each (needs REDIS_URL)",
    )
    p.add_argument(
        "--reuse-port",
        action="store_const",
        const=True,
        help="bind with SO_REUSEPORT (set for --workers; for several nodes on one port)",
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument("--log-json", action="store_const", const=True, help="JSON log lines")
    from gateway.edge.admission import add_serve_arguments

    add_serve_arguments(p)  # auth, limits, backpressure


async def _serve(config: Config) -> int:
    from gateway.app import running_gateway

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if config.provider == "sim":
        log.info("upstream: built-in simulator (set --provider openai for the real API)")
    async with running_gateway(config) as gateway:
        with contextlib.suppress(NotImplementedError):  # SIGHUP: re-read the API keys file
            loop.add_signal_handler(signal.SIGHUP, gateway.edges.reload_keys)
        _tune_gc()
        # One line tools and tests can wait for.
        _announce(f"gateway listening on {gateway.url}")
        await stop.wait()
        log.info("signal received: draining (up to %.0fs)", config.drain_timeout)
        await gateway.drain()
    log.info("stopped")
    return 0


def _announce(line: str) -> None:
    """One stdout line in one write: workers share the supervisor's stdout, and
    print() writes the text and its newline separately, so lines interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gateway", description="WebSocket gateway for realtime LLM APIs"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve_p = sub.add_parser("serve", help="run a gateway node")
    _serve_args(serve_p)

    from gateway.sim.cli import add_sim_arguments

    sim_p = sub.add_parser(
        "sim", help="run the upstream simulator (OpenAI Realtime or Gemini Live wire protocol)"
    )
    sim_p.add_argument("--host", default="127.0.0.1")
    sim_p.add_argument("--port", type=int, default=8800)
    add_sim_arguments(sim_p)

    from gateway.client.loadtest import add_loadtest_arguments

    lt_p = sub.add_parser("loadtest", help="many concurrent client sessions against a gateway")
    add_loadtest_arguments(lt_p)

    chat_p = sub.add_parser("chat", help="chat with a gateway from the terminal")
    chat_p.add_argument("url", nargs="?", default="ws://127.0.0.1:8765/v1/realtime")
    chat_p.add_argument("--token", help="API key (Bearer)")
    chat_p.add_argument("--no-color", action="store_true")

    from gateway.keys import add_keys_arguments

    keys_p = sub.add_parser("keys", help="issue, list and revoke API keys (file or Redis)")
    add_keys_arguments(keys_p)

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            overrides: dict[str, Any] = {
                k: v for k, v in vars(args).items() if k != "command" and v is not None
            }
            config = load_config(overrides)
            setup_logging(config.log_level, json=config.log_json, node=config.node_id)
            from gateway.workers import check_workers, supervise

            check_workers(config)
            if config.workers > 1:
                return supervise(config, list(argv if argv is not None else sys.argv[1:]))
            return asyncio.run(_serve(config))
        if args.command == "sim":
            from gateway.sim.cli import sim_config_from_args
            from gateway.sim.server import run_sim

            setup_logging("WARNING")
            asyncio.run(
                run_sim(
                    sim_config_from_args(args),
                    args.host,
                    args.port,
                    # The actual URL (with --port 0) for people and test harnesses.
                    on_ready=lambda sim: _announce(f"simulator listening on {sim.endpoint}"),
                )
            )
            return 0
        if args.command == "loadtest":
            from gateway.client.loadtest import run_loadtest_cli

            return asyncio.run(run_loadtest_cli(args))
        if args.command == "chat":
            from gateway.client.chat import run_chat

            return asyncio.run(run_chat(args.url, token=args.token, color=not args.no_color))
        if args.command == "keys":
            from gateway.keys import run_keys

            return run_keys(args)
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
