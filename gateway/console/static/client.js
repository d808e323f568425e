// realtime-gateway JavaScript client: one ES module, no dependencies, browsers and Node >= 20.
//
//   import { Client } from "/client.js";          // served by every gateway node
//   const c = new Client("ws://127.0.0.1:8765/v1/realtime", { token });
//   await c.connect();
//   for await (const ev of c.send("hello")) console.log(ev.type, ev.content ?? "");
//
// The same rules as the Python client (gateway/client/stream.py), so every client
// behaves alike:
// - Seq: every logged event has seq (+1 per event). A frame with seq_from merges
//   seq_from..seq and counts as contiguous. An error at or below the last seq is
//   an unlogged reply to our own frame. Anything else at or below it is a
//   duplicate (dropped); a frame past last+1 is a gap, refilled by resuming.
// - Reconnect: on any drop a retry can fix, reconnect with session_id and
//   after=lastSeq (backoff with jitter). So send() yields each event of the
//   turn exactly once, in order, across dropped connections.
// - End of a turn: after the closing event (end, cancelled, or an error that
//   stops the turn) and the metric that follows it; at once after metric→end or
//   error→end; or when the next event is not a metric, or none comes within
//   metricGrace ms (older servers send no metric after cancelled).
// - Client tools: client.tool(name, handler) answers call events with
//   "runs_on": "client" with {type: "tool_result", id, status, content};
//   client.configure({tools: [{name, description, parameters}]}) declares them.
// - Approvals: approve(id, digest, "allow" | "deny") decides on a call that waits
//   (an approval_required event) and resolves with its logged approval event, or
//   rejects with ApprovalRefusedError (wrong_digest, unknown_call, forbidden).
//   onApproval(event) is told each approval_required as it is read (a resumed
//   client's replay too); returning "allow"/true or "deny"/false decides at once.
// - Configuration: configure(fields) resolves with the `configured` event that
//   answers it, or rejects with ConfigureRefusedError (the gateway's reply:
//   forbidden for a client token or a policy, bad_frame for a bad value).
// - Playback: played(seq, ms) tells the gateway how much of the model's speech
//   was heard; a gateway that does not know the message answers unknown_type
//   once, and the client stops sending it, silently.
//
// Refusals: Node sees the handshake's HTTP status (401/403/404/400 are final
// RefusedError with the server's text; 429/503 are retried). A browser cannot
// read it, so when a handshake fails before opening while the node answers
// (/healthz, fetched without CORS so any page can tell), twice in a row, the
// client works out which refusal it was and gives up with RefusedError: 403
// (reason "origin") when the node's CORS does not admit this page's origin,
// 404 ("session") when the same key opens a new session but not this one, 401
// ("key") otherwise. `status` is then inferred (`inferred: true`).

// malformed_execute is not one: the broken block is handed back and the turn goes on.
import {
  ApprovalRefusedError,
  ClientError,
  CommandRefusedError,
  ConfigureRefusedError,
  ConnectionLostError,
  ERROR_CODES,
  REFUSAL_CODES,
  RefusedError,
  TURN_ENDING_ERROR_CODES,
  UnreachableError,
} from "./errors.js";
import { isNode, openSocket, withQuery } from "./socket.js";

export {
  ApprovalRefusedError,
  ClientError,
  CommandRefusedError,
  ConfigureRefusedError,
  ConnectionLostError,
  ERROR_CODES,
  RefusedError,
  UnreachableError,
};

const FINAL_STATUSES = new Set([400, 401, 403, 404]);
const FINAL_CLOSE_CODES = new Set([1002, 1003, 1007, 1008, 1009, 1010, 4401, 4404]);
// The id of every played frame: a gateway that does not know the message
// answers unknown_type with this reply_to.
const PLAYED_ID = "played";
const CLOSE_RESYNC = 4000; // we closed to resync after a gap
const DEFAULT_PATH = "/v1/realtime";

/** http(s):// → ws(s)://, missing scheme → ws://, empty path → /v1/realtime. */
export function normalizeUrl(url) {
  let text = String(url).trim();
  if (!text.includes("://")) text = `ws://${text}`;
  let parts;
  try {
    parts = new URL(text);
  } catch {
    throw new ClientError(`${url} is not a gateway URL: use ws://HOST:PORT${DEFAULT_PATH}`);
  }
  const scheme = { "http:": "ws:", "https:": "wss:" }[parts.protocol] ?? parts.protocol;
  if (scheme !== "ws:" && scheme !== "wss:") {
    throw new ClientError(`${url} is not a gateway URL: use ws://HOST:PORT${DEFAULT_PATH}`);
  }
  parts.protocol = scheme;
  if (parts.pathname === "" || parts.pathname === "/") parts.pathname = DEFAULT_PATH;
  parts.hash = "";
  return parts.toString();
}

/** "new" | "reply" | "duplicate" | "gap" for one frame, given the last seq held. */
export function classifySeq(type, seq, last, seqFrom = -1) {
  const first = seqFrom < 0 ? seq : seqFrom;
  if (seqFrom > seq) return "duplicate";
  if (first === last + 1) return "new";
  if (seq <= last) return type === "error" && seqFrom < 0 ? "reply" : "duplicate";
  return "gap";
}

/** Decides, event by event, when one turn is over (see the header). */
export class TurnTracker {
  constructor() {
    this.closing = false;
    this.done = false;
    this.prev = "";
  }

  /** True if the turn is already over and an event of this type is not part of it. */
  endsBefore(type) {
    if (!this.done && this.closing && !["metric", "end", "error"].includes(type)) this.done = true;
    return this.done;
  }

  /** Account one event; true when the turn is over with it. */
  feed(type, code = "") {
    if (this.done) return true;
    const prev = this.prev;
    this.prev = type;
    if (type === "metric") {
      if (this.closing) this.done = true;
    } else if (type === "end" || type === "cancelled") {
      if (this.closing || prev === "metric") this.done = true;
      this.closing = true;
    } else if (type === "error" && TURN_ENDING_ERROR_CODES.has(code)) {
      this.closing = true;
    }
    return this.done;
  }
}

// ------------------------------------------------------------------ the client

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A FIFO whose get() waits; items are events or markers. */
class Inbox {
  constructor() {
    this.items = [];
    this.waiter = null;
  }
  put(item) {
    this.items.push(item);
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w();
    }
  }
  /** Next item, or undefined after `ms` (when given). */
  async get(ms) {
    while (this.items.length === 0) {
      let timer = null;
      const arrived = new Promise((r) => {
        this.waiter = r;
        if (ms !== undefined) timer = setTimeout(r, ms);
      });
      await arrived;
      clearTimeout(timer);
      if (this.items.length === 0 && ms !== undefined) return undefined;
    }
    return this.items.shift();
  }
  clear() {
    const failed = this.items.find((i) => i.kind === "failed");
    this.items = [];
    if (failed) throw failed.error;
  }
}

/** One gateway session, kept alive across connections. */
export class Client {
  constructor(url, options = {}) {
    this.url = normalizeUrl(url);
    this.token = options.token ?? null;
    this.metricGrace = options.metricGrace ?? 500;
    this.reconnectTimeout = options.reconnectTimeout ?? 60000;
    this.backoffInitial = options.backoffInitial ?? 100;
    this.backoffMax = options.backoffMax ?? 5000;
    this.openTimeout = options.openTimeout ?? 10000;
    this.onConnect = options.onConnect ?? null;
    this.onDisconnect = options.onDisconnect ?? null;
    this.onEvent = options.onEvent ?? null;
    this.onError = options.onError ?? null;
    this.onAudio = options.onAudio ?? null;
    this.onFrame = options.onFrame ?? null;
    this.onApproval = options.onApproval ?? null;
    this.WebSocketImpl = options.WebSocket ?? null;
    this.sessionId = options.sessionId ?? null;
    this.lastSeq = options.after ?? -1;
    this.session = null;
    this.reconnects = 0;
    this.connected = false;
    this._socket = null;
    this._generation = 0;
    this._inbox = new Inbox();
    this._tools = new Map();
    this._closing = false;
    this._failure = null;
    this._inTurn = false;
    this._connectedWaiters = [];
    this._configuring = []; // {id, answer, resolve, reject, timer} per configure or context sent
    this._commands = 0; // their ids: configure-1, context-2, ...
    this._approving = []; // {id, resolve, reject, timer} per approve sent, oldest first
    this._pings = []; // {resolve, at} per ping sent
    this._playedSupported = true;
  }

  /** Open the first connection (RefusedError / UnreachableError if that fails). */
  async connect() {
    if (this._socket) return;
    await this._dial(true);
  }

  /** Close and stop reconnecting. */
  close() {
    this._closing = true;
    this.connected = false;
    const s = this._socket;
    this._socket = null;
    if (s) s.close(1000, "closed by the client");
    this._wake();
  }

  /** Register a client tool: handler(args) returns the result's content (may be async). */
  tool(name, handler) {
    this._tools.set(name, handler);
    return this;
  }

  /** Ask the gateway to cancel the running turn. */
  async cancel() {
    await this._sendFrame({ type: "cancel" });
  }

  /** Answer a call with runs_on "client" yourself (instead of a tool() handler). */
  async toolResult(id, status, content) {
    await this._sendFrame({ type: "tool_result", id, status, content: content ?? null });
  }

  /**
   * Decide on call `id` that waits for approval (an approval_required event;
   * `digest` is that event's): "allow" runs it, "deny" answers the model that the
   * user denied it. Resolves with the logged `approval` event; rejects with
   * ApprovalRefusedError when the gateway refuses (the text says what to do).
   */
  approve(id, digest, decision = "allow", { timeout = 10000 } = {}) {
    if (decision !== "allow" && decision !== "deny") {
      return Promise.reject(new TypeError(`decision must be "allow" or "deny", not ${JSON.stringify(decision)}`));
    }
    return new Promise((resolve, reject) => {
      const waiter = { id, resolve, reject, timer: null };
      const drop = () => (this._approving = this._approving.filter((w) => w !== waiter));
      waiter.timer = setTimeout(() => {
        drop();
        reject(new ClientError(`the gateway did not answer approve within ${timeout} ms`));
      }, timeout);
      this._approving.push(waiter);
      this._sendFrame({ type: "approve", id, digest, decision }).catch((err) => {
        clearTimeout(waiter.timer);
        drop();
        reject(err);
      });
    });
  }

  /** Change the session's configuration (only the fields given), e.g.
   * {tools: [{name, description, parameters}]}, {input_audio: {format: "pcm16", rate: 24000}}
   * or {output: "audio"}. Resolves with the logged `configured` event that
   * answers it; rejects with ConfigureRefusedError when the gateway refuses. */
  configure(fields, { timeout = 10000 } = {}) {
    return this._confirmed({ ...fields, type: "configure" }, "configured", timeout);
  }

  /** Add a message to the conversation without a turn (`context`): the app's
   * instructions for what comes next (role "system"), or history it restores ("user",
   * "assistant"). Resolves with the logged `context`
   * event (sent while the model answers: once the answer is written); rejects with
   * CommandRefusedError (forbidden: system and assistant need the API key; rate_limited;
   * guardrail_blocked). */
  context(content, { role = "system", timeout = 60000 } = {}) {
    return this._confirmed({ type: "context", role, content }, "context", timeout);
  }

  /** Start a turn with no new message (`reply`): the model answers the conversation as
   * it is (a greeting, a follow-up to `context`). An async iterator of its events, as
   * `send`'s, from its `reply` event to its end (sent again after a reconnect that
   * lost it, as `send`'s message is). */
  reply() {
    return this._turn(null, true);
  }

  _confirmed(frame, answer, timeout) {
    return new Promise((resolve, reject) => {
      this._commands += 1;
      const waiter = { id: `${frame.type}-${this._commands}`, answer, resolve, reject, timer: null };
      waiter.timer = setTimeout(() => {
        this._configuring = this._configuring.filter((w) => w !== waiter);
        reject(new ClientError(`the gateway did not answer ${frame.type} within ${timeout} ms`));
      }, timeout);
      this._configuring.push(waiter);
      this._sendFrame({ ...frame, id: waiter.id }).catch((err) => {
        clearTimeout(waiter.timer);
        this._configuring = this._configuring.filter((w) => w !== waiter);
        reject(err);
      });
    });
  }

  /** End a spoken turn yourself (input_audio.turn_detection "none"). */
  async commit() {
    await this._sendFrame({ type: "commit" });
  }

  /** The round trip of an application-level ping, in ms (the gateway's pong). */
  async ping() {
    const at = performance.now();
    const answered = new Promise((resolve) => this._pings.push({ resolve, at }));
    await this._sendFrame({ type: "ping" });
    return answered;
  }

  /**
   * How much of the model's spoken answer was heard: `ms` milliseconds of it,
   * up to the audio tagged `seq` (the newest audio actually played). A gateway
   * that does not know the message answers unknown_type once; the client then
   * stops sending it, silently.
   */
  played(seq, ms) {
    if (!this._playedSupported || !this.connected) return false;
    this._sendFrame({ type: "played", seq, ms: Math.round(ms), id: PLAYED_ID }).catch(() => {});
    return true;
  }

  /**
   * User audio: PCM16 little-endian mono at input_audio.rate (an Int16Array
   * or ArrayBuffer, 20–100 ms), sent as one binary frame. Audio is live: while
   * the connection is down it is dropped (returns false), not queued.
   */
  sendAudio(pcm16) {
    if (!this.connected || !this._socket) return false;
    try {
      this._socket.send(pcm16);
      this.onFrame?.({ dir: "out", binary: true, bytes: pcm16.byteLength });
      return true;
    } catch {
      return false;
    }
  }

  /** Start a turn; an async iterator of its events, from its user echo to its end. */
  send(text) {
    return this._turn(text, false);
  }

  /** The events of a turn this client starts: with `text`, or none (`reply`). */
  async *_turn(text, reply) {
    if (this._inTurn) throw new ClientError("a turn is running: finish iterating it (or cancel()) first");
    this._inTurn = true;
    try {
      this._raiseIfFailed();
      this._inbox.clear();
      this._commands += 1;
      const ref = `reply-${this._commands}`;
      const frame = reply ? { type: "reply", id: ref } : { type: "user", content: text };
      let sentOn = await this._sendFrame(frame);
      const sentAfter = this.lastSeq;
      let started = false;
      const tracker = new TurnTracker();
      for (;;) {
        const item = await this._inbox.get(tracker.closing ? this.metricGrace : undefined);
        if (item === undefined) return; // no metric within the grace
        if (item.kind === "failed") throw item.error;
        if (item.kind === "reconnected") {
          const lost = item.session.seq === item.after && item.generation > sentOn;
          if (!started && lost) sentOn = await this._sendFrame(frame);
          continue;
        }
        const ev = item.event;
        if (!started) {
          if (ev.type === "guardrail" && ev.on === "input" && ev.seq > sentAfter) {
            yield ev; // blocked (no turn: the model never got it), or redacted
            if (ev.action !== "redact") return;
            text = ""; // its echo is the redacted text
          } else if (
            ev.seq > sentAfter &&
            (reply
              ? ev.type === "reply" && ev.reply_to === ref
              : ev.type === "user" && (text === "" || ev.content === text))
          ) {
            started = true;
            tracker.feed("user");
            yield ev;
          } else if (ev.type === "error" && REFUSAL_CODES.has(ev.code) && ev.seq <= this.lastSeq) {
            yield ev;
            return;
          }
          continue;
        }
        if (tracker.endsBefore(ev.type)) return;
        yield ev;
        if (tracker.feed(ev.type, ev.code ?? "")) return;
      }
    } finally {
      this._inTurn = false;
    }
  }

  // ---------------------------------------------------------------- internals

  _raiseIfFailed() {
    if (this._failure) throw this._failure;
    if (this._closing) throw new ClientError("the client is closed");
  }

  _wake() {
    const waiters = this._connectedWaiters;
    this._connectedWaiters = [];
    for (const w of waiters) w();
  }

  async _sendFrame(frame) {
    for (;;) {
      this._raiseIfFailed();
      if (!this.connected) {
        await new Promise((r) => this._connectedWaiters.push(r));
        continue;
      }
      try {
        const text = JSON.stringify(frame);
        this._socket.send(text);
        this.onFrame?.({ dir: "out", binary: false, bytes: text.length, data: frame });
        return this._generation;
      } catch {
        this.connected = false;
      }
    }
  }

  _backoff(attempt, closeCode) {
    const floor = closeCode === 1013 && attempt === 0 ? 1000 : 0;
    const delay = Math.min(this.backoffMax, this.backoffInitial * 2 ** attempt);
    return Math.max(floor, delay * (0.5 + Math.random() * 0.5));
  }

  _healthz() {
    const u = new URL(this.url);
    u.protocol = u.protocol === "wss:" ? "https:" : "http:";
    u.pathname = "/healthz";
    u.search = "";
    return u;
  }

  /** Whether the node answers at all (an opaque no-cors answer counts: any page can ask). */
  async _browserRefused() {
    if (isNode || typeof fetch === "undefined") return false;
    try {
      await fetch(this._healthz(), { cache: "no-store", mode: "no-cors" });
      return true;
    } catch {
      return false;
    }
  }

  /**
   * A browser's refused handshake, told apart: the node's CORS answers the
   * pages that may open a WebSocket, a new session tells a refused session
   * from a refused key.
   */
  async _browserRefusal() {
    try {
      await fetch(this._healthz(), { cache: "no-store", mode: "cors" });
    } catch {
      return new RefusedError(
        403,
        `this page's origin (${globalThis.location?.origin ?? "?"}) may not connect to the gateway: ` +
          "the operator can allow it with --allowed-origins",
        { reason: "origin", inferred: true },
      );
    }
    if (this.sessionId !== null) {
      try {
        const { socket } = await openSocket(this.url, {
          token: this.token,
          WebSocketImpl: this.WebSocketImpl,
          openTimeout: this.openTimeout,
        });
        socket.close(1000, "probe");
        return new RefusedError(
          404,
          `session ${this.sessionId} does not exist, has expired or belongs to another key: ` +
            "start a new session",
          { reason: "session", inferred: true },
        );
      } catch {
        // the key (or token) itself is refused
      }
    }
    const text = this.token
      ? "the API key (or client token) is not accepted: check it, or ask for a new token"
      : "API key required";
    return new RefusedError(401, text, { reason: "key", inferred: true });
  }

  async _dial(first, closeCode = null) {
    const deadline = Date.now() + this.reconnectTimeout;
    let attempt = 0;
    let refusedInBrowser = 0;
    for (;;) {
      if (this._closing) throw new ClientError("the client is closed");
      const resume = this.sessionId !== null && this.lastSeq >= 0;
      const after = this.lastSeq;
      const params = {};
      if (this.sessionId !== null) params.session_id = this.sessionId;
      if (resume) params.after = String(after);
      const target = Object.keys(params).length ? withQuery(this.url, params) : this.url;
      let problem;
      try {
        const { socket, session, early } = await openSocket(target, {
          token: this.token,
          WebSocketImpl: this.WebSocketImpl,
          openTimeout: this.openTimeout,
        });
        this._attach(socket, session, after, first, early);
        return;
      } catch (failure) {
        if (failure.status) {
          const err = new RefusedError(failure.status, failure.body);
          if (FINAL_STATUSES.has(failure.status)) throw err;
          problem = err;
        } else if (failure.unreachable) {
          const err = new UnreachableError(failure.unreachable);
          if (first) throw err;
          problem = err;
        } else {
          if (!failure.opened && (await this._browserRefused())) {
            refusedInBrowser += 1;
            if (refusedInBrowser >= 2) throw await this._browserRefusal();
          } else if (first && !failure.opened) {
            throw new UnreachableError(`cannot reach ${this.url}: is the gateway running?`);
          }
          problem = new ConnectionLostError(`connection closed (${failure.closed})`);
        }
      }
      if (Date.now() >= deadline) {
        throw new ConnectionLostError(`could not reconnect for ${this.reconnectTimeout} ms: ${problem.message}`);
      }
      await sleep(this._backoff(attempt, closeCode));
      attempt += 1;
    }
  }

  _attach(socket, session, after, first, early) {
    if (this.sessionId === null || this.lastSeq < 0) this.lastSeq = session.seq;
    this.sessionId = session.session_id;
    this.session = session;
    this._socket = socket;
    this._generation += 1;
    if (!first) this.reconnects += 1;
    this._inbox.put({ kind: "reconnected", session, after, generation: this._generation });
    socket.onmessage = (msg) => {
      if (socket === this._socket) this._receive(socket, msg.data);
    };
    socket.onclose = (ev) => {
      if (socket === this._socket) this._lost(ev);
    };
    this.connected = true;
    this.onFrame?.({ dir: "in", binary: false, bytes: 0, data: session });
    for (const msg of early) if (socket === this._socket) this._receive(socket, msg.data);
    this._wake();
    this.onConnect?.(session);
  }

  _receive(socket, data) {
    if (typeof data !== "string") {
      // The model's speech: an 8-byte little-endian seq, then PCM16 at 24 kHz.
      if (data.byteLength < 8) return;
      const seq = Number(new DataView(data).getBigUint64(0, true));
      this.onFrame?.({ dir: "in", binary: true, bytes: data.byteLength, seq });
      this.onAudio?.(new Int16Array(data.slice(8)), seq);
      return;
    }
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return;
    }
    if (typeof ev?.seq !== "number") return;
    const verdict = ev.type === "pong" ? "reply" : classifySeq(ev.type, ev.seq, this.lastSeq, ev.seq_from ?? -1);
    this.onFrame?.({ dir: "in", binary: false, bytes: data.length, data: ev, verdict });
    if (ev.type === "pong") {
      const ping = this._pings.shift();
      ping?.resolve(performance.now() - ping.at);
      return;
    }
    if (verdict === "duplicate") return;
    if (verdict === "gap") {
      socket.close(CLOSE_RESYNC, "seq gap: resuming"); // the close handler reconnects
      this._socket = null;
      this._lost({ code: CLOSE_RESYNC, reason: "seq gap" });
      return;
    }
    if (verdict === "new") this.lastSeq = ev.seq;
    const own = verdict === "reply" && ev.type === "error" ? this._answersOwnFrame(ev) : "";
    if (own) {
      if (own !== "played") this.onEvent?.(ev, false);
      return; // configure() or approve() rejects with it; played() goes quiet
    }
    const blocked = ev.type === "guardrail" && ev.on === "input" && ev.action !== "redact";
    const refused = blocked ? this._configuring.find((w) => w.id === ev.reply_to) : null;
    if (refused) { // a context a guardrail blocked: it never reaches the model
      this._configuring = this._configuring.filter((w) => w !== refused);
      clearTimeout(refused.timer);
      refused.reject(new CommandRefusedError("guardrail_blocked", `blocked by the guardrail ${ev.rule}`));
    }
    const configured = this._configuring.find((w) => w.answer === ev.type && w.id === ev.reply_to);
    if (configured) {
      this._configuring = this._configuring.filter((w) => w !== configured);
      clearTimeout(configured.timer);
      configured.resolve(ev);
    }
    if (ev.type === "call" && this._tools.size) this._maybeRunTool(ev);
    if (ev.type === "approval_required" && this.onApproval) this._ask(ev);
    if (ev.type === "approval") {
      for (const waiter of this._approving.filter((w) => w.id === ev.id)) {
        clearTimeout(waiter.timer);
        waiter.resolve(ev);
      }
      this._approving = this._approving.filter((w) => w.id !== ev.id);
    }
    this._inbox.put({ kind: "event", event: ev });
    this.onEvent?.(ev, verdict === "new");
  }

  /** "played", "approve" or "configure" when an error reply answers one of those
   * frames, else "": matched by its reply_to (the frame's id; an approve's is the call's). */
  _answersOwnFrame(ev) {
    const ref = ev.reply_to;
    // A gateway older than played names no command either: played is the only
    // type this client sends that some gateway may not know.
    if (ev.code === "unknown_type" && (ref === PLAYED_ID || ref === undefined)) {
      this._playedSupported = false;
      return "played";
    }
    if (ref === undefined) return "";
    const approving = this._approving.filter((w) => w.id === ref);
    if (approving.length) {
      this._approving = this._approving.filter((w) => w.id !== ref);
      for (const waiter of approving) {
        clearTimeout(waiter.timer);
        waiter.reject(new ApprovalRefusedError(ev.code, ev.content));
      }
      return "approve";
    }
    const configuring = this._configuring.find((w) => w.id === ref);
    if (configuring) {
      this._configuring = this._configuring.filter((w) => w !== configuring);
      clearTimeout(configuring.timer);
      const Refused = configuring.answer === "configured" ? ConfigureRefusedError : CommandRefusedError;
      configuring.reject(new Refused(ev.code, ev.content));
      return "configure";
    }
    return "";
  }

  async _lost(ev) {
    this._socket = null;
    this.connected = false;
    if (this._closing) return;
    if (FINAL_CLOSE_CODES.has(ev.code)) {
      this._fail(new ConnectionLostError(`the gateway closed the connection (${ev.code} ${ev.reason || ""})`));
      return;
    }
    this.onDisconnect?.(ev.code === 1006 ? "connection lost" : `closed ${ev.code} ${ev.reason ?? ""}`);
    try {
      if (ev.code !== 1012 && ev.code !== 4008 && ev.code !== CLOSE_RESYNC) {
        await sleep(this._backoff(0, ev.code));
      }
      await this._dial(false, ev.code);
    } catch (err) {
      this._fail(err);
    }
  }

  _fail(err) {
    if (this._closing) return;
    for (const waiter of [...this._configuring.splice(0), ...this._approving.splice(0)]) {
      clearTimeout(waiter.timer);
      waiter.reject(err);
    }
    this._failure = err;
    this._inbox.put({ kind: "failed", error: err });
    this._wake();
    this.onError?.(err);
  }

  async _ask(ev) {
    let answer;
    try {
      answer = await this.onApproval(ev);
    } catch (err) {
      console.warn(`realtime-gateway: onApproval threw for call ${ev.id}:`, err);
      return;
    }
    if (answer === null || answer === undefined) return; // decided later with approve()
    const decision = answer === true || answer === "allow" ? "allow" : answer === false || answer === "deny" ? "deny" : null;
    if (decision === null) {
      console.warn(`realtime-gateway: onApproval returned ${JSON.stringify(answer)}; return "allow", "deny" or nothing`);
      return;
    }
    try {
      await this.approve(ev.id, ev.digest, decision);
    } catch (err) {
      // unknown_call: a replayed approval_required that was decided already.
      if (!(err instanceof ApprovalRefusedError && err.code === "unknown_call")) {
        console.warn(`realtime-gateway: could not approve call ${ev.id}: ${err?.message ?? err}`);
      }
    }
  }

  _maybeRunTool(ev) {
    if (ev.runs_on !== "client") return;
    let spec;
    try {
      spec = JSON.parse(ev.content);
    } catch {
      return;
    }
    if (!spec || typeof spec !== "object") return;
    this._runTool({ ...spec, id: ev.id });
  }

  async _runTool(spec) {
    const id = String(spec.id ?? "");
    const handler = this._tools.get(spec.name);
    let answer;
    if (!handler) {
      const known = [...this._tools.keys()].sort().join(", ") || "none";
      answer = { type: "tool_result", id, status: "failure", content: `this client has no tool ${JSON.stringify(spec.name)} (it has: ${known})` };
    } else {
      try {
        const content = await handler(spec.args && typeof spec.args === "object" ? spec.args : {});
        answer = { type: "tool_result", id, status: "success", content: content ?? null };
      } catch (err) {
        answer = { type: "tool_result", id, status: "failure", content: `${err?.name ?? "Error"}: ${err?.message ?? err}` };
      }
    }
    try {
      await this._sendFrame(answer);
    } catch {
      // the client failed or closed: nobody to answer
    }
  }

  /** Test hook: drop the connection as a network failure would. */
  dropConnection() {
    const s = this._socket;
    if (!s) return;
    if (typeof s.abort === "function") s.abort();
    else s.close(CLOSE_RESYNC, "dropped by the test hook");
  }
}
