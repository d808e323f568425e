"""One ``Config`` for a gateway node, built from defaults, environment and flags.

Every setting is declared once, here: its field's type (with its range as
``msgspec.Meta``), default and ``Setting`` (help, group, flag, variable,
secret) give its ``gateway serve`` flag, its ``GATEWAY_<NAME>`` variable, its
row in docs/configuration.md's table and its check; ``gateway.common.settings`` derives them.
The simulator's knobs are ``SimConfig``'s, lent to ``Config.sim`` as ``sim_*`` settings.

Precedence: flag > environment (``GATEWAY_<NAME>``, then the conventional
``REDIS_URL`` and each provider's key variable, ``OPENAI_API_KEY``…) > default.
The providers' settings come from their rows (``gateway.upstream.providers``). The defaults
run a complete gateway on one machine with nothing else installed: the
built-in simulator upstream and the in-process store.

To add a setting: add a field next to related ones, with its range in the type
and a ``Setting`` saying what it does and its unit; then run
``gateway settings --markdown --write docs/configuration.md`` (tests/house/test_settings.py
fails until the doc's table matches).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gateway.common.settings import ConfigError, Nested, Setting, check_ranges, load
from gateway.phone_settings import PhoneSettings
from gateway.sim.model import SimConfig
from gateway.store.base import Durability
from gateway.upstream import providers
from gateway.upstream.provider import ProviderSettings
from gateway.webrtc_settings import WebRTCSettings

__all__ = ["Config", "ConfigError", "load_config"]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]

# Ranges shared by several settings.
Port = Annotated[int, Meta(ge=0, le=65535)]
Count = Annotated[int, Meta(ge=0)]  # 0 usually means "no limit"
AtLeastOne = Annotated[int, Meta(ge=1)]
Seconds = Annotated[float, Meta(ge=0)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
Dollars = Annotated[float, Meta(ge=0)]

NETWORK = "network"
UPSTREAM = "upstream"
STORE = "store"
TOOLS = "tools"
EDGES = "auth and limits (docs/operations.md)"
BACKPRESSURE = "slow clients (docs/operations.md)"
LOGS = "logs"
RECORDING = "recording (docs/recording.md)"


class Config(msgspec.Struct, kw_only=True):
    """A node's settings; build it with ``load_config`` (or in code: it checks itself)."""

    # --- network ---
    host: Annotated[str, Setting("address to listen on (0.0.0.0 in containers)", NETWORK)] = (
        "127.0.0.1"
    )
    port: Annotated[Port, Setting("port to listen on (0 picks a free one)", NETWORK)] = 8765
    max_frame: Annotated[
        int,
        Meta(ge=1024),
        Setting("largest client frame in bytes; a larger one closes with 1009", NETWORK),
    ] = 1 << 20
    door_max_frame: Annotated[
        int,
        Meta(ge=1024),
        Setting(
            "largest frame from a client of the OpenAI door, in bytes (OpenAI takes appends "
            "of 15 MiB of audio, 20 MiB as base64); a larger one closes with 1009",
            NETWORK,
        ),
    ] = 21 << 20
    compression: Annotated[
        bool,
        Setting(
            "compress client frames (permessage-deflate): costs CPU on every tiny token frame",
            NETWORK,
        ),
    ] = False
    ping_interval: Annotated[
        PositiveSeconds, Setting("seconds between WebSocket pings to each client", NETWORK)
    ] = 20.0
    ping_timeout: Annotated[
        PositiveSeconds,
        Setting("seconds a client may take to answer a ping before it is closed", NETWORK),
    ] = 20.0
    workers: Annotated[
        AtLeastOne,
        Setting(
            "worker processes sharing the port (SO_REUSEPORT), one node each; needs a Redis --store",
            NETWORK,
        ),
    ] = 1
    event_loop: Annotated[
        Literal["auto", "asyncio", "uvloop"],
        Setting(
            "event loop of `gateway serve`: uvloop (install the uvloop extra) cuts the server "
            "CPU per event; auto uses it when installed, else asyncio's own",
            NETWORK,
        ),
    ] = "auto"
    reuse_port: Annotated[
        bool,
        Setting(
            "bind with SO_REUSEPORT (set by --workers; for several nodes on one port)", NETWORK
        ),
    ] = False
    drain_timeout: Annotated[
        Seconds, Setting("seconds SIGTERM waits for running turns before closing clients", NETWORK)
    ] = 30.0
    drain_phone_timeout: Annotated[
        Seconds,
        Setting(
            "seconds SIGTERM lets phone calls go on (a carrier cannot move a call's media "
            "stream to another node) before closing them",
            NETWORK,
        ),
    ] = 600.0
    header_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds a connection may take to send its request: a WebSocket handshake, or an "
            "HTTP API request's headers (also how long an idle HTTP API connection is kept); "
            "the connection is closed beyond",
            NETWORK,
        ),
    ] = 10.0
    body_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds an HTTP API request's body may take to arrive, and an answer to be taken "
            "by the client; HTTP 408 or a closed connection beyond",
            NETWORK,
        ),
    ] = 10.0

    # --- upstream ---
    provider: Annotated[
        providers.ProviderList,
        Setting(
            f"upstream API: {', '.join(providers.NAMES)} (sim: the built-in simulator); a comma "
            "list (openai,gemini) falls back in that order when one fails in a way a retry won't fix",
            UPSTREAM,
            example="openai,gemini",
        ),
    ] = "sim"
    fallback_cooldown: Annotated[
        PositiveSeconds,
        Setting("seconds a failed provider is avoided before it is tried again", UPSTREAM),
    ] = 60.0
    model: Annotated[
        str,
        Setting(
            "upstream model name; with several providers, one per provider in the same "
            "order (an empty entry: that provider's default)",
            UPSTREAM,
            shown_default=providers.default_models(),
        ),
    ] = ""
    # Each provider's base URL and key (--openai-base-url, OPENAI_API_KEY, …): from its row.
    upstreams: Annotated[Any, Nested("", providers.UpstreamSettings)] = msgspec.field(
        default_factory=providers.UpstreamSettings
    )
    instructions: Annotated[
        str, Setting("operator instructions appended to the protocol system prompt", UPSTREAM)
    ] = ""
    context_tokens: Annotated[
        Count,
        Setting(
            "token budget of the history a provider is given when a connection opens "
            "(reconnect, takeover): older tool results shortened, then old turns cut; 0: all",
            UPSTREAM,
        ),
    ] = 28_000
    upstream_retries: Annotated[
        Count, Setting("upstream (re)connect attempts for one step before the turn fails", UPSTREAM)
    ] = 3
    upstream_stall_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds a running response may go without a message from the provider (the "
            "first included) before the step is rerun once on a new connection; a second "
            "silence ends the turn with error upstream_timeout",
            UPSTREAM,
        ),
    ] = 30.0
    # phone calls: carriers' media streams (--phone-*, GATEWAY_PHONE_*; docs/phone.md).
    phone: Annotated[PhoneSettings, Nested("phone")] = msgspec.field(default_factory=PhoneSettings)
    # WebRTC calls on the OpenAI door (--webrtc-*, GATEWAY_WEBRTC_*; docs/webrtc.md).
    webrtc: Annotated[WebRTCSettings, Nested("webrtc")] = msgspec.field(
        default_factory=WebRTCSettings
    )
    # provider "sim" runs the simulator in-process with these knobs (--sim-*, GATEWAY_SIM_*).
    sim: Annotated[SimConfig, Nested("sim")] = msgspec.field(default_factory=SimConfig)

    # --- store ---
    store: Annotated[
        str,
        Setting(
            "URL of the session store: memory://, redis://HOST:PORT/DB, rediss://…, "
            "unix:///path, redis+sentinel://H:P[,…]/MASTER or redis+cluster://H:P[,…]",
            STORE,
            env="REDIS_URL",
            aliases=("--redis", "GATEWAY_REDIS_URL", "redis_url"),
            shown_default="in-process memory (one node)",
        ),
    ] = ""
    key_prefix: Annotated[str, Setting("prefix of every Redis key", STORE)] = "rtgw"
    session_ttl: Annotated[
        PositiveSeconds,
        Setting(
            "seconds an idle session is kept after its last event (Redis renews it once a "
            "tenth of this, at most 60 s, has run down: one write fewer per event)",
            STORE,
        ),
    ] = 24 * 3600.0
    unused_session_ttl: Annotated[
        PositiveSeconds,
        Setting(
            "seconds a session made by POST /v1/sessions is kept while no client has "
            "connected to it; its first connection gives it session_ttl",
            STORE,
        ),
    ] = 600.0
    max_log: Annotated[
        AtLeastOne, Setting("events kept per session log (older ones are trimmed)", STORE)
    ] = 10_000
    memory_store_mb: Annotated[
        AtLeastOne, Setting("MiB the in-process store keeps (logs, history, recordings)", STORE)
    ] = 512
    node_id: Annotated[
        str, Setting("this node's name in leases and logs", STORE, shown_default="host-pid-random")
    ] = ""
    lease_ttl: Annotated[
        float,
        Meta(gt=0.5),
        Setting("seconds a dead node's sessions wait before another node takes them", STORE),
    ] = 10.0
    log_linger: Annotated[
        Seconds,
        Setting(
            "at most, seconds a log append waits for more events to share its round trip: "
            "and at most half the time since its session's previous event, only "
            "while events come faster than that; only a response's streamed chunks after its "
            "first wait, nothing a client or a tool acts on; 0: never",
            STORE,
        ),
    ] = 0.02
    durability: Annotated[
        Durability,
        Setting(
            "replicated: an event is sent to clients only once a Redis replica has it too "
            "(WAIT 1), so a failover loses nothing a client saw; while no replica confirms, "
            "sessions hold their events and /readyz says 503; replicated-or-local: the same "
            "while a replica confirms, else events are sent once the primary has them, and a "
            "failover then may lose what no replica had (rtgw_store_unconfirmed_masters "
            "shows it); local: once the primary has it (a failover may lose the last events)",
            STORE,
        ),
    ] = "local"
    replica_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds durability replicated waits for a replica before an append's events are "
            "held and the replica asked again",
            STORE,
        ),
    ] = 1.0
    store_retry_window: Annotated[
        Seconds,
        Setting(
            "seconds the store's commands (appends, a client's message on its way) are retried "
            "through Redis Cluster redirects or a failover before the store counts as unavailable",
            STORE,
        ),
    ] = 2.0

    # --- tools ---
    workspace_root: Annotated[
        str,
        Setting(
            "directory holding one tool workspace per session",
            TOOLS,
            shown_default="$TMPDIR/rtgw-workspaces",
        ),
    ] = ""
    workspace_sweep_every: Annotated[
        PositiveSeconds,
        Setting(
            "seconds between two sweeps of workspace_root for the workspaces of sessions "
            "that ended (the first runs at start)",
            TOOLS,
        ),
    ] = 600.0
    enable_shell: Annotated[
        bool, Setting("offer the shell tool (not sandboxed beyond the workspace cwd)", TOOLS)
    ] = False
    tools_file: Annotated[
        str,
        Setting(
            "TOML file of app tools: MCP servers, HTTP tools, which built-ins (docs/tools.md)",
            TOOLS,
            flag="tools",
            env="GATEWAY_TOOLS",
            shown_default="the built-ins only",
        ),
    ] = ""
    tool_timeout: Annotated[PositiveSeconds, Setting("seconds one tool call may run", TOOLS)] = 30.0
    client_tool_timeout: Annotated[
        PositiveSeconds,
        Setting("seconds the gateway waits for a client to answer a client-side tool call", TOOLS),
    ] = 60.0
    approval_timeout: Annotated[
        PositiveSeconds,
        Setting(
            "seconds a call that needs approval waits for an approve before it is denied",
            TOOLS,
        ),
    ] = 120.0
    cancel_background: Annotated[
        bool,
        Setting(
            "a cancel or the user's speech also cancels the session's background tool calls",
            TOOLS,
        ),
    ] = True
    background_max_running: Annotated[
        AtLeastOne,
        Setting(
            "background tool calls one session may have running at once; a call past it is "
            "not started and its result says so",
            TOOLS,
        ),
    ] = 64
    tool_max_output: Annotated[
        AtLeastOne, Setting("characters of one tool result kept (the rest is cut)", TOOLS)
    ] = 64_000
    max_steps: Annotated[
        AtLeastOne, Setting("model steps (tool round trips) per turn before it is stopped", TOOLS)
    ] = 25

    # --- production edges (gateway.edge.admission; see docs/operations.md) ---
    api_keys_file: Annotated[
        str,
        Setting(
            "file of `key_id:sha256hex` lines, reloaded on change and on SIGHUP (`gateway keys`)",
            EDGES,
        ),
    ] = ""
    api_keys_redis: Annotated[
        bool,
        Setting("also accept the API keys kept in Redis (hash {key_prefix}:keys)", EDGES),
    ] = False
    insecure_no_auth: Annotated[
        bool,
        Setting("run without API keys on a non-loopback host (refused otherwise)", EDGES),
    ] = False
    allowed_origins: Annotated[
        str,
        Setting(
            "comma-separated origins browsers may connect from, or * for any; unset: the "
            "node's own page, plus loopback pages without API keys or any page with keys",
            EDGES,
            shown_default="own page, loopback pages (no keys) or any (keys)",
        ),
    ] = ""
    max_connections: Annotated[
        Count, Setting("open client connections per node, HTTP 503 beyond; 0 = no limit", EDGES)
    ] = 10_000
    max_connections_per_key: Annotated[
        Count,
        Setting("open connections per API key across nodes, HTTP 429 beyond; 0 = no limit", EDGES),
    ] = 0
    unauthenticated_per_address: Annotated[
        Count,
        Setting(
            "connections one client address may hold before they authenticate (a WebSocket "
            "handshake, or an HTTP API request with a key); beyond, its oldest such connection "
            "is closed; behind a load balancer every client has its address; 0 = no limit",
            EDGES,
        ),
    ] = 256
    turns_per_minute: Annotated[
        Count, Setting("turns per API key per minute; 0 = no limit", EDGES)
    ] = 0
    tokens_per_day: Annotated[
        Count, Setting("model tokens per API key per UTC day; 0 = no limit", EDGES)
    ] = 0
    usd_per_day: Annotated[
        Dollars,
        Setting(
            "US dollars of model cost per API key per UTC day (gateway/pricing.py); 0 = no limit",
            EDGES,
        ),
    ] = 0.0
    prices_file: Annotated[
        str,
        Setting(
            "TOML file of model prices (USD per million tokens) on top of the built-in table",
            EDGES,
        ),
    ] = ""

    # --- the HTTP API and client tokens (gateway.edge.api, gateway.edge.tokens) ---
    api_port: Annotated[
        Port | None,
        Setting(
            "an extra port of the HTTP API (POST/GET/DELETE /v1/sessions…) on host, which is "
            "always served on --port too; 0 picks a free one; none = --port only",
            EDGES,
        ),
    ] = None
    config_bytes_per_key: Annotated[
        Count,
        Setting(
            "bytes of configuration the sessions one API key made with POST /v1/sessions may "
            "store (each counted until it expires unused, for session_ttl after its first "
            "connection, or until deleted); HTTP 429 beyond; 0 = no limit",
            EDGES,
        ),
    ] = 64 << 20
    token_ttl: Annotated[
        Annotated[float, Meta(ge=1, le=86400)],
        Setting("seconds a client token minted by the HTTP API opens its session", EDGES),
    ] = 600.0
    token_secret: Annotated[
        str,
        Setting(
            "secret(s) signing client tokens, comma-separated (the first signs, all verify); "
            "unset: shared through Redis, or random per process with the memory store",
            EDGES,
            secret=True,
        ),
    ] = ""
    allow_keys_in_urls: Annotated[
        bool,
        Setting(
            "accept API keys in WebSocket URLs (?token=KEY); client tokens are always accepted",
            EDGES,
            flag="no-allow-keys-in-urls",
        ),
    ] = True
    guardrails: Annotated[
        str,
        Setting(
            "TOML file of guardrail rules ([[rule]] name, on, action, pattern/detect/"
            "max_chars) on what reaches the model and the clients, reloaded on change "
            "(docs/guardrails.md)",
            EDGES,
        ),
    ] = ""
    key_policy_file: Annotated[
        str,
        Setting(
            "TOML file of per-key policies ([key_id] providers, models, server_tools, "
            "instructions, require_approval), reloaded on change",
            EDGES,
        ),
    ] = ""

    # --- slow clients (gateway.edge.backpressure, gateway.edge.reaper) ---
    send_queue_frames: Annotated[
        int,
        Meta(ge=16),
        Setting(
            "frames queued for one client before it is switched to catch-up from the log",
            BACKPRESSURE,
        ),
    ] = 4096
    coalesce_after: Annotated[
        Count,
        Setting(
            "queued frames above which a client's think/respond chunks are merged; 0 = never",
            BACKPRESSURE,
        ),
    ] = 1024
    write_limit: Annotated[
        int,
        Meta(ge=1024),
        Setting("bytes the socket buffers per client before sends wait", BACKPRESSURE),
    ] = 32_768
    slow_client_timeout: Annotated[
        Seconds,
        Setting(
            "seconds a client may stop reading before it is closed with 4008; 0 = never",
            BACKPRESSURE,
        ),
    ] = 15.0
    client_frames_per_second: Annotated[
        Annotated[float, Meta(ge=0)],
        Setting(
            "frames one connection may send per second, sustained (one more per 64 KiB "
            "a frame holds); over it they are dropped with rate_limited; 0 = no limit",
            EDGES,
        ),
    ] = 50.0
    client_frame_burst: Annotated[
        AtLeastOne,
        Setting(
            "frames one connection may send at once; another burst's worth sent over the "
            "limit closes the connection with 4029",
            EDGES,
        ),
    ] = 200

    # --- the flight recorder (gateway.sessions.recorder) ---
    record: Annotated[
        bool,
        Setting(
            "record every session (upstream frames, client messages, tools, events) for "
            "export and replay; a key policy's record, or a session's own, records fewer",
            RECORDING,
        ),
    ] = False
    record_max_bytes: Annotated[
        Annotated[int, Meta(ge=4096)],
        Setting(
            "bytes one session's recording may take; a `cut` record marks where it stopped",
            RECORDING,
        ),
    ] = 16 << 20
    record_audio: Annotated[
        Literal["user", "all", "none"],
        Setting(
            "audio in recordings: user (the user's audio, which replay sends again; the "
            "model's by size only), all (every audio frame whole), none (sizes only)",
            RECORDING,
        ),
    ] = "user"

    # --- logs ---
    log_level: Annotated[LogLevel, Setting("lowest level logged", LOGS)] = "INFO"
    log_json: Annotated[
        bool, Setting("JSON log lines (with sid and node) instead of text", LOGS)
    ] = False

    def __post_init__(self) -> None:
        check_ranges(self)
        self.provider = self.provider.lower()
        if len(set(self.providers)) != len(self.providers):
            raise ConfigError(
                f"provider {self.provider!r} names a provider twice: list each once, "
                "in order of preference (e.g. openai,gemini)"
            )
        models, providers = self.models, self.providers
        if models and len(models) != len(providers):
            raise ConfigError(
                f"model {self.model!r} names {len(models)} model(s) for {len(providers)} "
                f"providers ({self.provider}): give one per provider in the same order, "
                "empty for a provider's default (e.g. --model gpt-realtime, for openai,gemini)"
            )
        if self.api_port and self.api_port == self.port:
            self.api_port = None  # the API is served on --port anyway: no second listener
        if not self.node_id:
            self.node_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if not self.workspace_root:
            self.workspace_root = str(Path(os.environ.get("TMPDIR", "/tmp")) / "rtgw-workspaces")

    def upstream(self, provider: str) -> ProviderSettings:
        """The settings of ``provider`` (its base URL, key and own settings)."""
        return providers.settings_of(self.upstreams, provider)

    @property
    def redis_url(self) -> str:
        """``store``, by its former name (``--redis``, ``REDIS_URL`` still set it)."""
        return self.store

    @property
    def providers(self) -> tuple[str, ...]:
        """The upstream providers in order of preference (the first is the primary)."""
        return tuple(self.provider.split(","))

    @property
    def models(self) -> tuple[str, ...]:
        """The model of each provider, in the order of ``providers`` ("": its default);
        empty when no model is set."""
        return tuple(m.strip() for m in self.model.split(",")) if self.model.strip() else ()


def load_config(
    overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Defaults, then environment (``os.environ`` unless given), then ``overrides`` (flags).

    ``overrides`` are keyed by setting name (``port``, ``sim_chunk_size``).
    Raises ``ConfigError`` naming the variable, flag or setting and the fix.
    """
    return load(Config, overrides, os.environ if env is None else env)
