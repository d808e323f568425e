"""The simulated network of a bench: its flags and the proxies they put in each path.

``--client-rtt``, ``--provider-rtt``, ``--redis-rtt`` and ``--replica-rtt``
(milliseconds) place a ``tests.support.netem`` proxy on that link, in a
process of their own: clients ↔ server, server ↔ provider (the simulator),
gateway ↔ Redis (the primary), primary ↔ replica (the replica dials the
proxy). ``--jitter`` varies each chunk's one-way delay by up to ± that share
of its link's one-way delay. With any of them set, every link of every
target goes through a proxy, a 0 ms link too, so the passthrough peer and the
gateway cross the same kind of network; with none, everything stays on
loopback as before.

The sim floor (a client on the simulator's own wire) crosses one link whose
RTT is ``client + provider``: the path a passthrough's client has, minus the
passthrough.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: ``python tests/bench/…``
    sys.path.insert(0, str(ROOT))

from tests.support.netem import Link, NetemProcess, ProxyStats  # noqa: E402

__all__ = ["SimulatedNetwork", "add_network_flags"]


def add_network_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("simulated network (tests/support/netem.py)")
    for name, what in (
        ("client", "clients and the server they talk to"),
        ("provider", "a server and the provider (the simulator)"),
        ("redis", "a gateway and Redis (its primary)"),
        ("replica", "the Redis primary and its replica (--durability replicated)"),
    ):
        group.add_argument(
            f"--{name}-rtt",
            type=float,
            default=None,
            metavar="MS",
            help=f"round trip between {what}, in ms",
        )
    group.add_argument(
        "--jitter",
        type=float,
        default=0.1,
        metavar="SHARE",
        help="each chunk's one-way delay varies by up to ± this share of it (default 0.1)",
    )


@dataclass
class SimulatedNetwork:
    """The proxies of one bench run (none when no RTT flag was given)."""

    client: float = 0.0
    provider: float = 0.0
    redis: float = 0.0
    replica: float = 0.0
    jitter: float = 0.1
    enabled: bool = False
    netem: NetemProcess | None = None
    routes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimulatedNetwork:
        rtts = {
            name: getattr(args, f"{name}_rtt")
            for name in ("client", "provider", "redis", "replica")
        }
        enabled = any(v is not None for v in rtts.values())
        return cls(
            **{name: (v or 0.0) / 1000 for name, v in rtts.items()},
            jitter=args.jitter,
            enabled=enabled,
        )

    def describe(self) -> str:
        if not self.enabled:
            return "loopback (no simulated network)"
        return (
            f"simulated RTTs: client {self.client * 1e3:g} ms, provider "
            f"{self.provider * 1e3:g} ms, Redis {self.redis * 1e3:g} ms, replica "
            f"{self.replica * 1e3:g} ms; jitter ±{self.jitter:.0%} of each one-way delay"
        )

    def start(self) -> SimulatedNetwork:
        if self.enabled:
            self.netem = NetemProcess()
        return self

    def stop(self) -> None:
        if self.netem is not None:
            self.netem.stop()
            self.netem = None

    def __enter__(self) -> SimulatedNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def route(self, name: str, port: int, rtt: float) -> int:
        """The port that reaches ``port`` over a link of ``rtt`` seconds (itself if off)."""
        if self.netem is None:
            return port
        link = Link(rtt=rtt, jitter=rtt / 2 * self.jitter)
        self.routes[name] = rtt
        return self.netem.add(name, ("127.0.0.1", port), link)

    def url(self, name: str, url: str, rtt: float) -> str:
        """``url`` (``ws://``, ``http://``, ``redis://`` on 127.0.0.1) through a route."""
        if self.netem is None:
            return url
        scheme, _, rest = url.partition("://")
        hostport, slash, path = rest.partition("/")
        host, _, port = hostport.rpartition(":")
        via = self.route(name, int(port), rtt)
        return f"{scheme}://{host}:{via}{slash}{path}"

    def pid(self) -> int | None:
        return self.netem.pid if self.netem is not None else None

    def window(self, names: list[str]) -> dict[str, ProxyStats]:
        """Each route's stats since the last call (lateness: how faithful the links were)."""
        if self.netem is None:
            return {}
        return {n: self.netem.stats(n, reset=True) for n in names if n in self.routes}
