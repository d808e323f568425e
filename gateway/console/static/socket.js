// realtime-gateway JavaScript client: its transports (see client.js). A browser's
// WebSocket, or in Node >= 20 (which has no WebSocket client of its own before 22)
// NodeSocket: a minimal RFC 6455 client on node:http(s) that reads the handshake's
// HTTP status, so a refusal is told apart from a network failure.

import { ClientError } from "./errors.js";

export const isNode = typeof process !== "undefined" && !!process.versions?.node;

export function withQuery(url, params) {
  const u = new URL(url);
  for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v);
  return u.toString();
}

/**
 * Open a socket; resolves {socket, session, early} after the session frame (early:
 * frames that came before the caller could take over), rejects with
 * {status, body} (a refused handshake), {unreachable: message} or {closed: code}.
 */
export function openSocket(url, { token, WebSocketImpl, openTimeout }) {
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
