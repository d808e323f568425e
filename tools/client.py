"""Client-side tools: tools a session's client declares and runs itself.

A client declares them with a ``configure`` frame (``protocol.configuration.
ClientToolSpec``: name, description, JSON Schema of the args). The model sees
them in the session's prompt next to the server tools; when it calls one, the
gateway checks the args against the schema (``tools.tenant_schema``, bounded
in time whatever the schema and args) and, if they fit, sends the call to the
client (``runs_on: "client"``) and waits for its ``tool_result``.
``ClientTools`` is the turn machine's ``ClientToolRouter``; the waiting itself
is the turn machine's job (``protocol.turn``), not this module's: there is no
``run`` here because nothing here runs.

Schemas are compiled once per content (``SchemaCache``, keyed by a digest of
their JSON), so a reconnect, a takeover or a client token's connect finds the
compiled schema instead of compiling it again; ``prepare`` compiles what is
missing in a worker thread, so the event loop never does a schema's compile.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import msgspec

from protocol.calls import ToolCall
from protocol.configuration import ClientToolSpec, schema_bytes
from protocol.prompt import ToolSpec

from .allowlist import AllowList
from .schema import describe_args
from .tenant_schema import TenantSchema

__all__ = ["ClientTools", "SchemaCache", "prepare", "schema_problem"]

_encoder: Final = msgspec.json.Encoder()


class SchemaCache:
    """Compiled schemas (or why they were refused) by the digest of their JSON, newest kept.

    Bounded by the JSON bytes of what it holds (a compiled schema takes ~27
    times its JSON: 0.8 MB for a 30 kB one), not by count. Touched on the
    event loop only: ``prepare`` compiles in its worker and stores the results
    when it is back on the loop.
    """

    def __init__(self, max_bytes: int = 4 << 20) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._entries: OrderedDict[bytes, tuple[TenantSchema | str, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> TenantSchema | str | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: bytes, compiled: TenantSchema | str, size: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.held -= old[1]
        self._entries[key] = (compiled, size)
        self.held += size
        while self.held > self.max_bytes and len(self._entries) > 1:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.held -= dropped


CACHE: Final = SchemaCache()
_worker: ThreadPoolExecutor | None = None


def _digest(spec: ClientToolSpec) -> tuple[bytes, int] | str:
    """The cache key of ``spec``'s schema and its size, or why it is past the limits."""
    size = schema_bytes(spec)
    if isinstance(size, str):
        return size
    return hashlib.blake2b(_encoder.encode(spec.parameters), digest_size=16).digest(), size


def _compile(spec: ClientToolSpec) -> TenantSchema | str:
    """The compiled schema, or why it is refused (without the tool's name: cached by content)."""
    try:
        return TenantSchema(spec.parameters)
    except ValueError as exc:
        return str(exc)


def _compiled(spec: ClientToolSpec, cache: SchemaCache) -> TenantSchema | str:
    digest = _digest(spec)
    if isinstance(digest, str):
        return digest
    found = cache.get(digest[0])
    if found is None:
        found = _compile(spec)  # not prepared (a direct caller): bounded by the limits
        cache.put(digest[0], found, digest[1])
    if isinstance(found, str):
        return f"tools: {spec.name!r} parameters: {found}"
    return found


async def prepare(specs: Sequence[ClientToolSpec], cache: SchemaCache = CACHE) -> str | None:
    """Compile ``specs``' schemas that ``cache`` lacks, in a worker thread; the first
    problem (naming the tool), or None.

    The size and depth limits are checked first, on the loop (linear, in C
    for the most part). The worker is one thread: compiling is pure Python and
    RE2 calls of ~2 ms at most, so the loop gets the GIL back within its
    switch interval, and one tenant's schemas queue behind another's instead of
    taking every core.
    """
    global _worker
    missing: list[tuple[tuple[bytes, int], ClientToolSpec]] = []
    for spec in specs:
        digest = _digest(spec)
        if isinstance(digest, str):
            return digest
        if cache.get(digest[0]) is None:
            missing.append((digest, spec))
    if missing:
        if _worker is None:
            _worker = ThreadPoolExecutor(1, thread_name_prefix="schemas")
        loop = asyncio.get_running_loop()
        done = await loop.run_in_executor(_worker, _compile_all, [s for _, s in missing])
        for ((key, size), _), compiled in zip(missing, done, strict=True):
            cache.put(key, compiled, size)
    for spec in specs:
        compiled = _compiled(spec, cache)
        if isinstance(compiled, str):
            return compiled
    return None


def _compile_all(specs: list[ClientToolSpec]) -> list[TenantSchema | str]:
    return [_compile(spec) for spec in specs]


class ClientTools:
    """The client tools of one session (only those its key's ``allowed`` list lets it call).

    Raises ``ValueError`` naming the tool when a declared schema is not a
    valid JSON Schema of an object, or when a tool takes the name of one of
    ``server_tools`` (the session's server tools: a client tool would silently
    shadow it): a ``configure`` that declares it is refused.
    """

    def __init__(
        self,
        specs: Sequence[ClientToolSpec],
        allowed: AllowList | None = None,
        server_tools: Iterable[str] = (),
        cache: SchemaCache = CACHE,
    ) -> None:
        self.declared = tuple(specs)
        self._schemas: dict[str, TenantSchema] = {}
        self._specs: list[ToolSpec] = []
        taken = frozenset(server_tools)
        for spec in specs:
            if spec.name in taken:
                raise ValueError(
                    f"tools: {spec.name!r} is the name of a server tool this session has; "
                    "give the client tool another name (or leave the server tool out with "
                    '"server_tools")'
                )
            compiled = _compiled(spec, cache)
            if isinstance(compiled, str):
                raise ValueError(compiled)
            if allowed is not None and not allowed.allows(spec.name):
                continue  # not listed, and a call to it is refused where calls run
            self._schemas[spec.name] = compiled
            self._specs.append(ToolSpec(spec.name, spec.description, compiled.schema))

    def __len__(self) -> int:
        return len(self._schemas)

    @property
    def background(self) -> frozenset[str]:
        """The client tools declared ``background``: the turn does not wait for them."""
        return frozenset(s.name for s in self.declared if s.background and s.name in self._schemas)

    def runs_on_client(self, name: str) -> bool:
        return name in self._schemas

    def check_args(self, call: ToolCall) -> str | None:
        """Bounded in time whatever the schema and args (``TenantSchema.explain``)."""
        schema = self._schemas.get(call.name)
        if schema is None:
            return f"{call.name!r} is not a client tool of this session"
        problem = schema.explain(call.args)
        if problem is None:
            return None
        return (
            f"invalid args for {call.name!r}: {problem}. "
            f"Send args as a JSON object with: {describe_args(schema.schema)}."
        )

    def specs(self) -> list[ToolSpec]:
        """What the prompt lists for them (after the server tools)."""
        return list(self._specs)


def schema_problem(specs: Sequence[ClientToolSpec]) -> str | None:
    """Why one of ``specs``' parameters is not a usable JSON Schema (naming the tool), or None.

    Synchronous: it compiles what the cache lacks on the caller's thread. On
    the event loop, ``await prepare(specs)`` instead.
    """
    try:
        ClientTools(specs)
    except ValueError as exc:
        return str(exc)
    return None
