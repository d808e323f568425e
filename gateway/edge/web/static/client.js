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
//   metricGrace ms (servers before issue 19 send no metric after cancelled).
// - Client tools: client.tool(name, handler) answers call events with
//   "runs_on": "client" with {type: "tool_result", id, status, content};
//   client.configure({tools: [{name, description, parameters}]}) declares them.
//
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
const TURN_ENDING_ERROR_CODES = new Set(["upstream", "internal"]);
const REFUSAL_CODES = new Set([
  "turn_active",
  "rate_limited",
  "quota_exceeded",
  "draining",
  "bad_frame",
  "internal",
]);
const FINAL_STATUSES = new Set([400, 401, 403, 404]);
const FINAL_CLOSE_CODES = new Set([1002, 1003, 1007, 1008, 1009, 1010, 4401, 4404]);
// Unlogged replies that refuse a configure (audio refusals answer audio frames).
const CONFIGURE_REFUSALS = new Set(["forbidden", "bad_frame", "turn_active", "store"]);
const CLOSE_RESYNC = 4000; // we closed to resync after a gap
const DEFAULT_PATH = "/v1/realtime";

/** A gateway client cannot go on; the message says why and what to do. */
export class ClientError extends Error {
  constructor(message) {
    super(message);
    this.name = "ClientError";
  }
}

/** The gateway refused the handshake: its HTTP status (in a browser, inferred). */
export class RefusedError extends ClientError {
  constructor(status, message, { reason = "", inferred = false } = {}) {
    super(`the gateway refused the connection: ${status ? `HTTP ${status} ` : ""}${message}`);
    this.name = "RefusedError";
    this.status = status;
    this.serverMessage = message;
    /** "origin" | "key" | "session" | "" (Node: read the status). */
    this.reason = reason || { 401: "key", 403: "forbidden", 404: "session" }[status] || "";
    this.inferred = inferred;
  }
}

/** The gateway refused a configure: its error reply's code and text. */
export class ConfigureRefusedError extends ClientError {
  constructor(code, content) {
    super(`the gateway refused the configuration (${code}): ${content}`);
    this.name = "ConfigureRefusedError";
    this.code = code;
    this.content = content;
  }
}

/** Nothing answered at the URL. */
export class UnreachableError extends ClientError {
  constructor(message) {
    super(message);
    this.name = "UnreachableError";
  }
}

/** Reconnecting failed for longer than reconnectTimeout. */
export class ConnectionLostError extends ClientError {
  constructor(message) {
    super(message);
    this.name = "ConnectionLostError";
  }
}

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

// ------------------------------------------------------------------ transports

const isNode = typeof process !== "undefined" && !!process.versions?.node;

function withQuery(url, params) {
  const u = new URL(url);
  for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v);
  return u.toString();
}

/**
 * Open a socket; resolves {socket, session, early} after the session frame (early:
 * frames that came before the caller could take over), rejects with
 * {status, body} (a refused handshake), {unreachable: message} or {closed: code}.
 */
function openSocket(url, { token, WebSocketImpl, openTimeout }) {
  return new Promise((resolve, reject) => {
    let settled = false;
    const socket = isNode && !WebSocketImpl
      ? new NodeSocket(url, token)
      : new (WebSocketImpl ?? globalThis.WebSocket)(
          token ? withQuery(url, { token }) : url,
        );
    socket.binaryType = "arraybuffer"; // the model's speech (protocol/audio.py)
    const timer = setTimeout(() => {
      fail({ unreachable: `no session frame from ${url} within ${openTimeout} ms` });
      socket.close();
    }, openTimeout);
    let opened = false;
    function fail(reason) {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      reject(reason);
    }
    socket.onopen = () => {
      opened = true;
    };
    const early = []; // frames after the session frame, before the client takes over
    socket.onmessage = (msg) => {
      if (settled) {
        early.push(msg);
        return;
      }
      let ev;
      try {
        ev = JSON.parse(msg.data);
      } catch {
        ev = null;
      }
      if (!ev || ev.type !== "session") {
        fail({ unreachable: `${url} is not a gateway: its first frame is not a session frame` });
        socket.close();
        return;
      }
      settled = true;
      clearTimeout(timer);
      resolve({ socket, session: ev, early });
    };
    socket.onclose = (ev) => {
      if (ev.status) fail({ status: ev.status, body: ev.body ?? "" });
      else if (ev.unreachable) fail({ unreachable: ev.unreachable });
      else fail({ closed: ev.code ?? 1006, opened });
    };
    socket.onerror = () => {};
  });
}

/**
 * A minimal WebSocket client over node:http (Node 20 has no global WebSocket
 * without a flag, and no WebSocket API reports a refused handshake's status).
 * Same surface as the browser's: onopen, onmessage({data}), onclose({code,
 * reason}), send(text), close(code, reason); onclose also carries status/body
 * of a refused handshake.
 */
class NodeSocket {
  constructor(url, token) {
    this.onopen = null;
    this.onmessage = null;
    this.onclose = null;
    this.onerror = null;
    this.readyState = 0;
    this._closed = false;
    this._socket = null;
    this._start(url, token).catch((err) => this._finish({ code: 1006, unreachable: String(err) }));
  }

  async _start(url, token) {
    const u = new URL(url);
    const secure = u.protocol === "wss:";
    const http = await import(secure ? "node:https" : "node:http");
    const { randomBytes } = await import("node:crypto");
    const headers = {
      Connection: "Upgrade",
      Upgrade: "websocket",
      "Sec-WebSocket-Version": "13",
      "Sec-WebSocket-Key": randomBytes(16).toString("base64"),
      "User-Agent": "realtime-gateway-client-js",
    };
    if (token) headers.Authorization = `Bearer ${token}`;
    this._randomBytes = randomBytes;
    const req = http.request({
      host: u.hostname,
      port: u.port || (secure ? 443 : 80),
      path: u.pathname + u.search,
      headers,
    });
    req.on("upgrade", (res, socket, head) => {
      this._socket = socket;
      socket.setNoDelay(true);
      this.readyState = 1;
      this._buf = head && head.length ? Buffer.from(head) : Buffer.alloc(0);
      this._fragments = [];
      socket.on("data", (chunk) => this._data(chunk));
      socket.on("close", () => this._finish({ code: this._closeCode ?? 1006, reason: this._closeReason ?? "" }));
      socket.on("error", () => {});
      this.onopen?.({});
      if (this._buf.length) this._data(Buffer.alloc(0));
    });
    req.on("response", (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () =>
        this._finish({ code: 1006, status: res.statusCode, body: Buffer.concat(chunks).toString().trim() }),
      );
    });
    req.on("error", (err) => {
      const text = err.code === "ECONNREFUSED"
        ? `nothing is listening at ${url}: is the gateway running? (start it: gateway serve)`
        : `cannot reach ${url}: ${err.message}`;
      this._finish({ code: 1006, unreachable: text });
    });
    req.end();
  }

  _finish(ev) {
    if (this._closed) return;
    this._closed = true;
    this.readyState = 3;
    this.onclose?.(ev);
  }

  _data(chunk) {
    this._buf = Buffer.concat([this._buf, chunk]);
    for (;;) {
      const b = this._buf;
      if (b.length < 2) return;
      const fin = (b[0] & 0x80) !== 0;
      const opcode = b[0] & 0x0f;
      let len = b[1] & 0x7f;
      let off = 2;
      if (len === 126) {
        if (b.length < 4) return;
        len = b.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (b.length < 10) return;
        len = Number(b.readBigUInt64BE(2));
        off = 10;
      }
      if (b.length < off + len) return;
      const payload = b.subarray(off, off + len);
      this._buf = b.subarray(off + len);
      if (opcode === 0x8) {
        this._closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        this._closeReason = payload.subarray(2).toString();
        this._frame(0x8, payload.subarray(0, 2));
        this._socket.end();
        return;
      }
      if (opcode === 0x9) {
        this._frame(0xa, payload);
        continue;
      }
      if (opcode === 0xa) continue;
      if (opcode !== 0x0) this._opcode = opcode;
      this._fragments.push(Buffer.from(payload));
      if (fin) {
        const whole = Buffer.concat(this._fragments);
        const data = this._opcode === 0x2
          ? whole.buffer.slice(whole.byteOffset, whole.byteOffset + whole.length)
          : whole.toString("utf8");
        this._fragments = [];
        this.onmessage?.({ data });
      }
    }
  }

  _frame(opcode, payload) {
    if (!this._socket || this._socket.destroyed) return;
    const len = payload.length;
    const head = len < 126 ? Buffer.alloc(2) : len < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
    head[0] = 0x80 | opcode;
    if (len < 126) head[1] = 0x80 | len;
    else if (len < 65536) {
      head[1] = 0x80 | 126;
      head.writeUInt16BE(len, 2);
    } else {
      head[1] = 0x80 | 127;
      head.writeBigUInt64BE(BigInt(len), 2);
    }
    const mask = this._randomBytes(4);
    const masked = Buffer.alloc(len);
    for (let i = 0; i < len; i++) masked[i] = payload[i] ^ mask[i & 3];
    this._socket.write(Buffer.concat([head, mask, masked]));
  }

  send(data) {
    if (this.readyState !== 1) throw new ClientError("the connection is closed");
    if (typeof data === "string") this._frame(0x1, Buffer.from(data, "utf8"));
    else this._frame(0x2, Buffer.from(data.buffer ?? data, data.byteOffset ?? 0, data.byteLength));
  }

  close(code = 1000, reason = "") {
    if (this.readyState === 1) {
      const body = Buffer.alloc(2 + Buffer.byteLength(reason));
      body.writeUInt16BE(code, 0);
      body.write(reason, 2);
      this._frame(0x8, body);
      this.readyState = 2;
      this._closeCode = code;
      this._socket.end();
      setTimeout(() => this._socket?.destroy(), 1000).unref?.();
    } else if (this.readyState === 0) {
      this._finish({ code: 1006 });
    }
  }

  /** Drop the TCP connection as a network failure would (tests). */
  abort() {
    this._socket?.destroy();
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
    this._configuring = []; // {resolve, reject, timer} per configure sent, oldest first
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

  /** Change the session's configuration (only the fields given), e.g.
   * {tools: [{name, description, parameters}]}, {input_audio: {format: "pcm16", rate: 24000}}
   * or {output: "audio"}. Resolves with the logged `configured` event that
   * answers it; rejects with ConfigureRefusedError when the gateway refuses. */
  configure(fields, { timeout = 10000 } = {}) {
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject, timer: null };
      waiter.timer = setTimeout(() => {
        this._configuring = this._configuring.filter((w) => w !== waiter);
        reject(new ClientError(`the gateway did not answer configure within ${timeout} ms`));
      }, timeout);
      this._configuring.push(waiter);
      this._sendFrame({ ...fields, type: "configure" }).catch((err) => {
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
    this._sendFrame({ type: "played", seq, ms: Math.round(ms) }).catch(() => {});
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
  async *send(text) {
    if (this._inTurn) throw new ClientError("a turn is running: finish iterating it (or cancel()) first");
    this._inTurn = true;
    try {
      this._raiseIfFailed();
      this._inbox.clear();
      const frame = { type: "user", content: text };
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
          if (ev.type === "user" && ev.seq > sentAfter && ev.content === text) {
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
      if (own === "configure") this.onEvent?.(ev, false);
      return; // configure() rejects with it; played() goes quiet
    }
    if (ev.type === "configured" && this._configuring.length) {
      const waiter = this._configuring.shift();
      clearTimeout(waiter.timer);
      waiter.resolve(ev);
    }
    if (ev.type === "call" && this._tools.size) this._maybeRunTool(ev);
    this._inbox.put({ kind: "event", event: ev });
    this.onEvent?.(ev, verdict === "new");
  }

  /** "played" or "configure" when an error reply answers one of those frames, else "". */
  _answersOwnFrame(ev) {
    const content = String(ev.content);
    if (ev.code === "unknown_type" && content.includes("'played'")) {
      this._playedSupported = false;
      return "played";
    }
    if (this._configuring.length && CONFIGURE_REFUSALS.has(ev.code) && !content.startsWith("audio needs")) {
      const waiter = this._configuring.shift();
      clearTimeout(waiter.timer);
      waiter.reject(new ConfigureRefusedError(ev.code, ev.content));
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
    for (const waiter of this._configuring.splice(0)) {
      clearTimeout(waiter.timer);
      waiter.reject(err);
    }
    this._failure = err;
    this._inbox.put({ kind: "failed", error: err });
    this._wake();
    this.onError?.(err);
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
