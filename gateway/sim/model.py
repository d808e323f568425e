"""The simulator's model, knobs and server plumbing, shared by both wire flavours.

The simulator exists so the adapters, the gateway and the official SDKs are tested
end to end over real sockets against a deterministic "model". It speaks two wire
protocols (OpenAI Realtime, ``gateway.sim.openai``; Gemini Live, ``gateway.sim.gemini``)
with ONE behaviour, defined here, so a scripted conversation gives the same text on
either provider and a conformance test can compare them:

- ``sim_reply``: what the model writes for the last user message;
- ``Pacer``: when each chunk of it goes out (tokens per second, first-token
  delay), computed from the response's start so it does not drift under load;
- ``SimConfig``: the knobs, including the faults (drop the TCP connection
  after N chunks, announce the end of the session);
- ``Sim``: the server's life (listen, count, snapshot, close), whatever the flavour.

The model (``sim_reply``) speaks the seed's text protocol, driven by the last
user message:

- ``/tool NAME {JSON args}`` → a think, then one call of NAME in an
  ``<execute>`` block, then (knob ``overrun``) text a real model might write
  past ``</execute>``, which the gateway must discard. Args are copied
  verbatim, so tests can make malformed calls.
- a message starting with ``<results>`` → a think, then ``The tool returned
  STATUS.`` quoting the first result's status (``The tool started in the
  background; …`` when it is a background call's word that it started), then
  ``<end>``.
- ``/raw TEXT`` → exactly TEXT (scripted output, markers and all).
- ``/instructions`` → ``Instructions: `` and the system instructions the
  session was opened with, every ``<`` written ``‹`` (so the protocol
  prompt's example markers stay text), then ``<end>``: tests see what
  reached the model.
- ``/help`` → these scripts (``SIM_HELP``); ``/long [N]`` → a think, then N Markdown sections (4).
- ``/error`` → a broken ``<execute>`` block: the gateway reports
  ``malformed_execute``, hands the failure back, and the model answers it.
- no user message yet (a ``reply``) → a greeting (``GREETING``).
- anything else → a think, then ``Echo: MESSAGE``, then ``<end>``.

Voice (``gateway.sim.vad`` hears, ``spoken_reply`` speaks):

- Audio in is PCM16 mono (OpenAI 24 kHz, Gemini at the rate its ``mimeType``
  names, 16 kHz normally). Server VAD is energy-based: speech is RMS above
  ``vad_threshold`` for ``vad_min_speech_ms``; it ends after ``vad_silence_ms``
  of silence. Speech starting while the model answers interrupts it (barge-in).
- What the model "hears" is deterministic: the transcript of a speech segment
  is ``(speech 1.2 s)`` — its duration (first to last loud 20 ms frame),
  rounded to 0.1 s (``speech_transcript``). It becomes a user turn, answered
  exactly as if that text had been typed.
- Text output answers as above. Audio output (OpenAI ``output_modalities``
  ``["audio"]``, Gemini ``responseModalities`` ``["AUDIO"]``) speaks a reply
  without protocol markers (``spoken_reply``): ``Echo: MESSAGE``, or ``/raw``
  TEXT; each chunk of it goes out as a transcript piece plus a 440 Hz tone of
  ``audio_ms_per_char`` ms per character (PCM16 24 kHz), paced like text.
- In audio output, ``/tool NAME {JSON args}`` is a native function call
  (``SimCall``) when the session declared a function NAME (otherwise the model
  says it has none); once the client returns the call's output the model says
  ``The tool NAME returned OUTPUT.`` (``tool_answer``).
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import ssl as ssl_module
from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.common.pcm import tone
from gateway.common.settings import Setting, check_ranges
from gateway.upstream.providers import FLAVOURS
from protocol.background import STARTED

__all__ = [
    "VOICE_RATE",
    "Pacer",
    "Sim",
    "SimCall",
    "SimConfig",
    "SimConnection",
    "SimConversation",
    "SimItem",
    "SimStats",
    "quote_instructions",
    "sim_reply",
    "simulated_usage_tokens",
    "speech_transcript",
    "spoken_reply",
    "tool_answer",
    "voice_audio",
]

log = logging.getLogger("gateway.sim.openai")


_MAX_FRAME: Final = 16 * 2**20
_BACKLOG: Final = 4096
_YIELD_EVERY: Final = 4  # a response sending unpaced (or behind) yields every N chunks

VOICE_RATE: Final = 24000  # the simulated voice's (both providers speak PCM16 at 24 kHz)


NonNegativeInt = Annotated[int, Meta(ge=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
SIM = "simulator (provider sim)"


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The simulator's knobs, declared once (``gateway.common.settings``).

    ``gateway sim`` takes them as flags (``--chunk-size``); ``gateway serve``
    as ``--sim-chunk-size`` and ``GATEWAY_SIM_CHUNK_SIZE`` (``Config.sim``).
    ``drop_after`` and ``go_away_after`` are faults to inject; ``api_key``
    makes the simulator refuse clients without it as the real APIs do (OpenAI
    with HTTP 401, Gemini by closing with 1007 after the setup message).
    """

    flavor: Annotated[
        str,
        Setting(
            "the provider whose API is served: its wire, path, key and session shape "
            "(openai: /v1/realtime and GPT-Live's /v1/live/sessions; gemini: Live's "
            "BidiGenerateContent; azure, xai)",
            SIM,
            choices=FLAVOURS,
        ),
    ] = "openai"
    tokens_per_second: Annotated[
        NonNegativeFloat,
        Setting("text chunks per second per response; 0 = as fast as possible", SIM),
    ] = 0.0
    chunk_size: Annotated[
        int, Meta(ge=1), Setting("characters per text chunk (delta or modelTurn part)", SIM)
    ] = 4
    first_token_delay: Annotated[
        NonNegativeFloat, Setting("seconds between a request and its first chunk", SIM)
    ] = 0.0
    drop_after: Annotated[
        NonNegativeInt | None,
        Setting("abort each connection's TCP socket after N chunks (fault injection)", SIM),
    ] = None
    overrun: Annotated[
        bool,
        Setting(
            "after a tool call, write past `</execute>` as real models do",
            SIM,
            flag="no-overrun",
        ),
    ] = True
    api_key: Annotated[
        str | None,
        Setting("API key the simulator requires (Bearer, ?key= or x-goog-api-key)", SIM),
    ] = None
    go_away_after: Annotated[
        NonNegativeInt | None,
        Setting(
            "gemini: send goAway after N chunks on a connection, close it when the turn ends",
            SIM,
        ),
    ] = None
    vad_threshold: Annotated[
        NonNegativeFloat,
        Setting(
            "server VAD: a 20 ms frame of input louder than this RMS (PCM16, 0-32767) is speech",
            SIM,
        ),
    ] = 500.0
    vad_min_speech_ms: Annotated[
        int, Meta(ge=1), Setting("server VAD: loud audio this long (ms) starts speech", SIM)
    ] = 100
    vad_silence_ms: Annotated[
        int, Meta(ge=1), Setting("server VAD: quiet audio this long (ms) ends speech", SIM)
    ] = 500
    audio_ms_per_char: Annotated[
        float,
        Meta(gt=0),
        Setting("audio output: milliseconds of spoken audio per character of a reply", SIM),
    ] = 60.0

    def __post_init__(self) -> None:
        check_ranges(self)


# --- the model ----------------------------------------------------------------------


GREETING: Final = "Hello! How can I help?"  # its answer before anyone spoke (a ``reply``)


def sim_reply(message: str, *, overrun: bool = True, instructions: str = "", items: int = 0) -> str:
    """The simulated model's whole output for the last user ``message``.

    ``instructions`` are the system instructions the session was opened with
    (quoted by ``/instructions``). ``/context`` answers with ``items``, the
    number of conversation items the connection holds (the probe message
    itself included): how a test sees what history a provider was given. The
    probe is its message's last line (a gateway's note that earlier
    conversation was cut may lead it).
    """
    command = message.strip()
    if not command:  # no user message yet: the model speaks first (a greeting)
        return f"<think>Nobody has spoken yet.</think>{GREETING}<end>"
    if command == "/help":
        return f"{SIM_HELP}<end>"
    if command == "/error":
        return '<think>Let me break a tool call.</think><execute>[{"name": </execute>'
    if command == "/long" or command.startswith("/long "):
        return f"<think>A long answer, then.</think>{_long_answer(command[5:].strip())}<end>"
    if message.strip() == "/instructions":
        return f"Instructions: {quote_instructions(instructions)}<end>"
    if message.rsplit("\n", 1)[-1].strip() == "/context":
        return f"<think>Counting.</think>Context: {items} items<end>"
    if message.startswith("/raw"):
        rest = message[4:]
        if not rest or rest[0] == " ":
            return rest[1:]
    if message.startswith("/tool"):
        parts = message[5:].split(None, 1)
        if parts and message[5:6].isspace():
            return _tool_reply(parts[0], parts[1].strip() if len(parts) > 1 else "{}", overrun)
    if message.lstrip().startswith("<results>"):
        return f"<think>The tool answered.</think>{_results_reply(message)}<end>"
    return f"<think>The user said something.</think>Echo: {message}<end>"


SIM_HELP: Final = """The simulator answers these scripts (anything else is echoed):

- `hello`, or any text: a short think, then `Echo: hello`
- `/tool list {"path": "."}`: calls a gateway tool (`/tool NAME {JSON args}`)
- `/tool confirm {"question": "Ship it?"}`: calls the web console's own yes/no tool
- `/long 6`: a long Markdown answer in 6 sections, to watch it stream
- `/error`: writes a broken tool call; the gateway reports `malformed_execute`
- `/raw TEXT`: writes TEXT exactly, protocol markers and all
- `/instructions`: quotes the system instructions it was given
- `/help`: this list

With the microphone on, any speech is heard as `(speech 1.2 s)` and answered."""


_LONG_TOPICS: Final = (
    ("Streaming", "Every chunk the model writes reaches you as a `respond` event."),
    ("Resuming", "A dropped connection resumes with `session_id` and `after`: nothing lost."),
    ("Tools", "Calls run in parallel and their results come back in call order."),
    ("Voice", "Audio in and out rides the same session, tagged with `seq`."),
    ("Many nodes", "Any node serves any session; the log lives in Redis."),
    ("Costs", "Every turn ends with a `metric` event: tokens and dollars."),
)


def _long_answer(count: str) -> str:
    """``/long N``: N Markdown sections (1-50, default 4), a list and a code block."""
    sections = min(50, max(1, int(count))) if count.isdecimal() else 4
    parts = ["Here is a **long answer**, written in Markdown.\n"]
    for n in range(sections):
        title, line = _LONG_TOPICS[n % len(_LONG_TOPICS)]
        parts.append(
            f"\n## {n + 1}. {title}\n\n{line} This paragraph is here so you can watch the "
            "text arrive chunk by chunk, and scroll while it does.\n\n"
            f"- point one of section {n + 1}\n- point two, with `code`\n"
        )
    parts.append('\n```json\n{"type": "respond", "content": "…"}\n```\n\nThat is all.')
    return "".join(parts)


def quote_instructions(instructions: str) -> str:
    """``instructions`` as the simulator quotes them: every ``<`` written ``‹``.

    The instructions hold the protocol prompt, whose example markers
    (``<execute>``, ``<end>``) would otherwise be parsed as the model's own.
    """
    return instructions.replace("<", "\u2039")


def _tool_reply(name: str, args: str, overrun: bool) -> str:
    quoted = msgspec.json.encode(name).decode()
    text = (
        f"<think>I should call {name}.</think>\n"
        f'<execute>\n[{{"name": {quoted}, "args": {args}}}]\n</execute>'
    )
    if overrun:
        text += (
            f'\n\n<results>\n[{{"tool": {quoted}, "status": "success", '
            f'"content": "hallucinated"}}]\n</results>\n\nThe tool succeeded (I made that up).'
        )
    return text


def _results_reply(message: str) -> str:
    start = message.find("<results>") + len("<results>")
    end = message.rfind("</results>")
    body = message[start:end] if end >= start else message[start:]
    try:
        results = msgspec.json.decode(body.strip())
    except msgspec.DecodeError:
        return "The results were unreadable."
    if isinstance(results, list) and results and isinstance(results[0], dict):
        status = results[0].get("status")
        if results[0].get("content") == STARTED:  # a background call: no result yet
            return "The tool started in the background; its result comes later."
        if isinstance(status, str):
            return f"The tool returned {status}."
    return "The results were unreadable."


class SimCall(msgspec.Struct, frozen=True):
    """A native function call the model makes in audio output (``arguments``: JSON text)."""

    name: str
    arguments: str


def speech_transcript(speech_ms: int) -> str:
    """What the model hears for ``speech_ms`` of speech: ``(speech 1.2 s)``."""
    return f"(speech {round(speech_ms / 100) / 10:.1f} s)"


def spoken_reply(
    message: str, functions: frozenset[str] = frozenset(), *, items: int = 0, instructions: str = ""
) -> str | SimCall:
    """The model's answer in audio output: words without markers, or a function call.

    ``functions`` are the names the session declared; ``/tool NAME`` calls NAME
    only if it is one of them. ``/context`` says ``items`` and ``/instructions``
    quotes ``instructions``, as ``sim_reply`` does.
    """
    if not message.strip():  # no user message yet: the model speaks first
        return GREETING
    if message.strip() == "/context":
        return f"Context: {items} items"
        return f"Context: {items} items"
    if message.strip() == "/instructions":
        return f"Instructions: {quote_instructions(instructions)}"
    if message.startswith("/raw"):
        rest = message[4:]
        if not rest or rest[0] == " ":
            return rest[1:]
    if message.startswith("/tool") and message[5:6].isspace():
        parts = message[5:].split(None, 1)
        if parts:
            name = parts[0]
            if name not in functions:
                return f"I have no tool named {name}."
            return SimCall(name, parts[1].strip() if len(parts) > 1 else "{}")
    return f"Echo: {message}"


def tool_answer(name: str, output: str) -> str:
    """The model's answer once a function call's ``output`` came back (or, for a
    background call, the word that it started)."""
    if output == STARTED:
        return f"The tool {name} started in the background; its result comes later."
    return f"The tool {name} returned {output}."


def voice_audio(chars: int, config: SimConfig, speed: float = 1.0) -> bytes:
    """The spoken audio of ``chars`` characters, said at ``speed`` (1.0 the normal
    pace): a tone, PCM16 at ``VOICE_RATE``."""
    return tone(chars * config.audio_ms_per_char / speed / 1000.0, VOICE_RATE)


def simulated_usage_tokens(chars: int) -> int:
    """The simulated token count of ``chars`` characters of context (at least 1).

    Both flavours report input usage with it, so a conversation costs the
    same on either.
    """
    return max(1, chars // 4)


class Pacer:
    """When each chunk of one response is due.

    Due times count from the first chunk's, so a late wake-up does not push
    every later chunk back; a response running behind (or unpaced) still
    yields to the loop every few chunks, so no response starves the others.
    """

    __slots__ = ("_delay", "_interval", "_loop", "_start")

    def __init__(self, config: SimConfig) -> None:
        self._interval = 1.0 / config.tokens_per_second if config.tokens_per_second > 0 else 0.0
        self._delay = config.first_token_delay
        self._loop = asyncio.get_running_loop()
        self._start = 0.0

    async def begin(self) -> None:
        """Wait out the first-token delay; chunk 0 is due right after."""
        if self._delay > 0:
            await asyncio.sleep(self._delay)
        self._start = self._loop.time()

    async def wait(self, index: int) -> None:
        """Wait until chunk number ``index`` (from 0) is due."""
        if self._interval:
            delay = self._start + index * self._interval - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                return
        if index % _YIELD_EVERY == _YIELD_EVERY - 1:
            await asyncio.sleep(0)


# --- state and snapshots --------------------------------------------------------------


class SimItem(msgspec.Struct, frozen=True):
    """One conversation item (a turn) as the simulator holds it (for tests). ``role``
    is the flavour's own: ``user``/``assistant``/``system`` (OpenAI), ``user``/``model``."""

    id: str
    role: str
    text: str
    status: str = "completed"


class SimConversation(msgspec.Struct, frozen=True):
    """A snapshot of one connection's conversation (for tests)."""

    instructions: str
    items: list[SimItem]

    def messages(self) -> list[tuple[str, str]]:
        """``(role, text)`` of every item, in conversation order."""
        return [(item.role, item.text) for item in self.items]


class SimStats(msgspec.Struct):
    """Counters over the simulator's lifetime (cheap; for load tests and logs)."""

    connections: int = 0
    connections_total: int = 0
    responses_total: int = 0
    deltas_total: int = 0
    resumed_total: int = 0  # connections that continued a session by its resumption handle
    turns_received: int = 0  # conversation turns clients sent (Gemini clientContent)
    # audio_end_ms of every assistant item cut by a client (OpenAI conversation.item.truncate)
    truncations: list[int] = msgspec.field(default_factory=list)


# --- the server -----------------------------------------------------------------------


class SimConnection(abc.ABC):
    """One client connection of a flavour's server: a greeting, then one frame at a time."""

    ws: ServerConnection

    async def run(self) -> None:
        """Serve the connection until it closes."""
        try:
            await self.greet()
            while True:
                await self._dispatch(await self.ws.recv(decode=False))
        except ConnectionClosed:
            self.forget()

    def forget(self) -> None:  # noqa: B027 - a closed connection's conversation, dropped
        """As the service does; its cycles kept it to a (rare) full collection before."""

    async def greet(self) -> None:  # noqa: B027 - optional hook
        """What the server sends first, before any client frame (nothing by default)."""

    @abc.abstractmethod
    async def _dispatch(self, data: bytes) -> None:
        """Handle one client frame."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop any running response (the connection is gone)."""

    @abc.abstractmethod
    def snapshot(self) -> SimConversation: ...


class Sim(abc.ABC):
    """A running simulator (from ``serve_sim``): its address, state and counters.

    The flavours (``gateway.sim.openai.OpenAISim``, ``gateway.sim.gemini.GeminiSim``)
    supply the handshake check and the per-connection protocol.
    """

    flavor: str = ""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = SimStats()
        # Sessions a resumption handle continues (Gemini flavour): handle → what it holds.
        self.handles: dict[str, Any] = {}
        self.host = ""
        self.port = 0
        self.scheme = "ws"
        self._server: Server | None = None
        self._live: dict[int, SimConnection] = {}
        self._numbers = itertools.count(1)

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The base URL a client of this flavour is configured with."""

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """The WebSocket endpoint's full URL (for logs and humans)."""

    @property
    def address(self) -> str:
        """``scheme://host:port`` (IPv6 hosts bracketed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def conversations(self) -> list[SimConversation]:
        """Snapshots of the open connections' conversations, oldest connection first."""
        return [conn.snapshot() for conn in self._live.values()]

    def live(self) -> list[SimConnection]:
        """The open connections, oldest first (tests look at what a session asked for)."""
        return list(self._live.values())

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl: ssl_module.SSLContext | None = None
    ) -> None:
        """Listen (``port=0``: any free port); with ``ssl`` the URLs are ``wss://``."""
        self._server = await serve(
            self._handler,
            host,
            port,
            compression=None,
            process_request=self._process_request,
            max_size=_MAX_FRAME,
            backlog=_BACKLOG,
            ssl=ssl,
            logger=_SIM_SERVER_LOG,
        )
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = str(sockname[0]), int(sockname[1])
        self.scheme = "wss" if ssl is not None else "ws"

    async def close(self) -> None:
        """Stop accepting, close every connection (1001) and wait for them (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def drop_due(self, conn_no: int, ws: ServerConnection, chunks_sent: int) -> bool:
        """Abort ``ws``'s TCP connection if ``drop_after`` chunks were sent on it."""
        drop_after = self.config.drop_after
        if drop_after is None or chunks_sent < drop_after:
            return False
        log.info("sim connection %d: dropping after %d chunks", conn_no, chunks_sent)
        ws.transport.abort()
        return True

    @abc.abstractmethod
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Refuse a handshake (wrong path, key) with an HTTP response, or ``None``."""

    @abc.abstractmethod
    def _connection(self, ws: ServerConnection, no: int) -> SimConnection: ...

    async def _handler(self, ws: ServerConnection) -> None:
        no = next(self._numbers)
        conn = self._connection(ws, no)
        self._live[no] = conn
        self.stats.connections += 1
        self.stats.connections_total += 1
        try:
            await conn.run()
        finally:
            del self._live[no]
            self.stats.connections -= 1
            await conn.stop()


class _DialAbandoned(logging.Filter):
    """Drops websockets' "opening handshake failed" for a connection that closed before
    sending a request: a gateway whose session was cancelled or closed mid-dial hangs
    up so, and the real services say nothing of it either."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "opening handshake failed" or record.exc_info is None:
            return True
        exc: BaseException | None = record.exc_info[1]
        while exc is not None:
            if isinstance(exc, EOFError) and "0 bytes" in str(exc):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


_SIM_SERVER_LOG = logging.getLogger("gateway.sim.server")
_SIM_SERVER_LOG.addFilter(_DialAbandoned())
