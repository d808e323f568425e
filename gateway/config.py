"""One ``Config`` for a gateway node, built from defaults, environment and flags.

Precedence: command-line flag > environment variable (``GATEWAY_<FIELD>``, plus
the conventional ``REDIS_URL``, ``OPENAI_API_KEY``, ``GEMINI_API_KEY``) > default.
The defaults run a complete gateway on one machine with nothing else installed:
the built-in simulator upstream and the in-process store.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = ["Config", "ConfigError", "load_config"]

Provider = Literal["sim", "openai", "gemini"]


class ConfigError(ValueError):
    """A setting has a value the gateway cannot use; the message names it and the fix."""


class Config(msgspec.Struct, kw_only=True):
    # --- network ---
    host: str = "127.0.0.1"
    port: int = 8765
    # Largest client frame accepted; larger closes the connection with 1009.
    max_frame: int = 1 << 20
    # Compress client frames (permessage-deflate). Off by default: it costs CPU
    # on every token frame and token frames are tiny.
    compression: bool = False
    # Close a connection whose client sends nothing (not even a WebSocket pong) for this long.
    ping_interval: float = 20.0
    ping_timeout: float = 20.0

    # Worker processes sharing the port (SO_REUSEPORT), each one node.
    workers: int = 1
    reuse_port: bool = False

    # --- upstream ---
    provider: Provider = "sim"
    model: str = ""
    openai_base_url: str = "wss://api.openai.com/v1"
    openai_api_key: str = ""
    gemini_base_url: str = "wss://generativelanguage.googleapis.com"
    gemini_api_key: str = ""
    # Extra operator instructions appended to the protocol system prompt.
    instructions: str = ""
    # Upstream (re)connect attempts for one step before the turn fails.
    upstream_retries: int = 3
    # Simulator knobs (provider "sim" runs the simulator in-process).
    sim_tokens_per_second: float = 0.0
    sim_chunk_size: int = 4
    sim_first_token_delay: float = 0.0
    sim_drop_after: int | None = None
    # The wire protocol the in-process simulator speaks (and so the adapter that drives it).
    sim_flavor: Literal["openai", "gemini"] = "openai"

    # --- store ---
    redis_url: str = ""
    key_prefix: str = "rtgw"
    session_ttl: float = 24 * 3600.0
    max_log: int = 10_000
    node_id: str = ""
    lease_ttl: float = 10.0
    # Seconds a log append waits for more events to join its round trip.
    log_linger: float = 0.0

    # --- tools ---
    workspace_root: str = ""
    enable_shell: bool = False
    tool_timeout: float = 30.0
    tool_max_output: int = 64_000
    # A turn is stopped after this many model steps (tool round trips).
    max_steps: int = 25

    # --- connections ---
    # Frames queued for one client before it is switched to catch-up from the log.
    send_queue_frames: int = 4096
    drain_timeout: float = 30.0

    # --- production edges (gateway.edge.admission; checked there, see docs/operations.md) ---
    # API keys as `key_id:sha256hex` lines; reloaded on change and on SIGHUP.
    api_keys_file: str = ""
    # Also accept the keys in Redis (hash {key_prefix}:keys, sha256hex → key_id).
    api_keys_redis: bool = False
    # Run without API keys on a non-loopback host (refused otherwise).
    insecure_no_auth: bool = False
    # Comma-separated Origin values browsers may connect from ("" = any).
    allowed_origins: str = ""
    # Open client connections per node (HTTP 503 beyond) and per API key across
    # nodes (HTTP 429 beyond); turns per minute and tokens per day per key. 0 = no limit.
    max_connections: int = 10_000
    max_connections_per_key: int = 0
    turns_per_minute: int = 0
    tokens_per_day: int = 0
    # Dollars per key per UTC day (the model steps' cost, see gateway/pricing.py); 0 = no limit.
    usd_per_day: float = 0.0
    # TOML file of model prices (USD per million tokens) on top of the built-in table.
    prices_file: str = ""
    # Queued frames above which a client's consecutive think/respond chunks are
    # merged into one frame (0 = never); bytes the socket buffers before sends
    # wait; seconds a client may stop reading before it is closed with 4008 (0 = never).
    coalesce_after: int = 1024
    write_limit: int = 32_768
    slow_client_timeout: float = 15.0

    # --- logs ---
    log_level: str = "INFO"
    log_json: bool = False

    def __post_init__(self) -> None:
        if not self.node_id:
            self.node_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if not self.workspace_root:
            self.workspace_root = str(Path(os.environ.get("TMPDIR", "/tmp")) / "rtgw-workspaces")
        if self.port < 0 or self.port > 65535:
            raise ConfigError(
                f"port {self.port} is out of range: use 0-65535 (0 picks a free port)"
            )
        if self.max_frame < 1024:
            raise ConfigError(f"max_frame {self.max_frame} is too small: use at least 1024 bytes")
        if self.lease_ttl <= 0.5:
            raise ConfigError(f"lease_ttl {self.lease_ttl} is too short: use more than 0.5 s")


# Environment variables read besides GATEWAY_<FIELD>.
_CONVENTIONAL_ENV = {
    "REDIS_URL": "redis_url",
    "OPENAI_API_KEY": "openai_api_key",
    "GEMINI_API_KEY": "gemini_api_key",
}


def load_config(
    overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Defaults, then environment, then ``overrides`` (flags); validated by msgspec.

    Raises ``ConfigError`` naming the setting when a value has the wrong type.
    """
    environ = os.environ if env is None else env
    fields = {f.name for f in msgspec.structs.fields(Config)}
    raw: dict[str, Any] = {}
    for var, name in _CONVENTIONAL_ENV.items():
        if environ.get(var):
            raw[name] = environ[var]
    for name in fields:
        value = environ.get(f"GATEWAY_{name.upper()}")
        if value is not None and value != "":
            raw[name] = value
    for name, value in (overrides or {}).items():
        if name not in fields:
            raise ConfigError(f"unknown setting {name!r}")
        if value is not None:
            raw[name] = value
    try:
        # str_values: environment values are strings; msgspec parses "8765" as int etc.
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad setting: {exc}") from exc
