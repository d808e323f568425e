"""The simulator's knobs as command-line flags (``gateway sim`` and ``serve --sim-*``)."""

from __future__ import annotations

import argparse

from gateway.sim.model import SimConfig

__all__ = ["add_sim_arguments", "sim_config_from_args"]


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_sim_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """Define the simulator's knobs as flags (``--tokens-per-second`` …).

    ``prefix`` (e.g. ``"sim-"``) namespaces the flags when another command
    embeds the simulator; destinations are always ``sim_*``, so they never clash.
    """
    group = parser.add_argument_group("simulator")
    group.add_argument(
        f"--{prefix}flavor",
        dest="sim_flavor",
        choices=("openai", "gemini"),
        default="openai",
        help="wire protocol to serve: OpenAI Realtime or Gemini Live (default openai)",
    )
    group.add_argument(
        f"--{prefix}tokens-per-second",
        dest="sim_tokens_per_second",
        type=_non_negative_float,
        default=0.0,
        metavar="N",
        help="text deltas per second per response (0 = as fast as possible; default 0)",
    )
    group.add_argument(
        f"--{prefix}chunk-size",
        dest="sim_chunk_size",
        type=_positive_int,
        default=4,
        metavar="CHARS",
        help="characters per text delta (default 4)",
    )
    group.add_argument(
        f"--{prefix}first-token-delay",
        dest="sim_first_token_delay",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="delay before the first delta of each response (default 0)",
    )
    group.add_argument(
        f"--{prefix}drop-after",
        dest="sim_drop_after",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="abort each connection's TCP socket after N deltas (fault injection)",
    )
    group.add_argument(
        f"--{prefix}no-overrun",
        dest="sim_overrun",
        action="store_false",
        help="stop tool-call responses at </execute> (default: write past it, as models do)",
    )
    group.add_argument(
        f"--{prefix}api-key",
        dest="sim_api_key",
        default=None,
        metavar="KEY",
        help="require KEY: 'Authorization: Bearer KEY' (openai), '?key=KEY' or "
        "'x-goog-api-key: KEY' (gemini) (default: accept any)",
    )
    group.add_argument(
        f"--{prefix}go-away-after",
        dest="sim_go_away_after",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="gemini: send goAway after N deltas on a connection, close it when the turn ends",
    )


def sim_config_from_args(ns: argparse.Namespace) -> SimConfig:
    """The ``SimConfig`` of flags defined by ``add_sim_arguments``."""
    return SimConfig(
        flavor=ns.sim_flavor,
        tokens_per_second=ns.sim_tokens_per_second,
        chunk_size=ns.sim_chunk_size,
        first_token_delay=ns.sim_first_token_delay,
        drop_after=ns.sim_drop_after,
        overrun=ns.sim_overrun,
        api_key=ns.sim_api_key,
        go_away_after=ns.sim_go_away_after,
    )
