// The console through the OpenAI door (Settings → "OpenAI door"): a session opened at
// /openai/v1/realtime?model=… speaking OpenAI's Realtime protocol, as an app written for
// OpenAI's service does (docs/openai-door.md). The inspector shows its frames as they
// are on the wire; the conversation is drawn from them as the page draws the gateway's
// own events (user, respond, end, metric, configured, error), numbered here in order.
//
// The same surface as client.js's Client where the page uses it; what the door does not
// carry (voice from this page, approvals, resume of the door's session) says so.
import { ClientError } from "/errors.js";

export const DOOR_PATH = "/openai/v1/realtime";

export class DoorClient {
  /** options: {token, onEvent(ev, logged), onFrame, onConnect(session), onError(err)} */
  constructor(url, options = {}) {
    this.url = url;
    this.token = options.token;
    this.hooks = options;
    this.reconnects = 0;
    this.lastSeq = 0; // the events drawn, numbered in order
    this.socket = null;
    this.total = { input: 0, output: 0 };
    this._turn = null; // the running send()'s inbox
    this._configuring = []; // configure()s waiting for session.updated
  }

  connect() {
    return new Promise((resolve, reject) => {
      // A browser sets no header on a WebSocket: the key rides as OpenAI's subprotocol.
      const protocols = ["realtime", ...(this.token ? [`openai-insecure-api-key.${this.token}`] : [])];
      const socket = new WebSocket(this.url, protocols);
      this.socket = socket;
      let opened = false;
      socket.onmessage = (msg) => {
        let ev;
        try {
          ev = JSON.parse(msg.data);
        } catch {
          return;
        }
        this.hooks.onFrame?.({ dir: "in", binary: false, bytes: msg.data.length, data: ev });
        if (!opened && ev.type === "session.created") {
          opened = true;
          const model = ev.session?.model ?? "";
          this.session = { type: "session", session_id: ev.session?.id ?? "", seq: 0, resumed: false, provider: `OpenAI door · ${model}`, node: "" };
          this.hooks.onConnect?.(this.session);
          resolve();
        }
        this._receive(ev);
      };
      socket.onclose = (ev) => {
        const error = new ClientError(
          opened ? `the OpenAI door's connection closed (${ev.code})` : `the OpenAI door refused the connection (${ev.code}): check the model and the key`,
        );
        this._turn?.(null);
        for (const w of this._configuring.splice(0)) w.reject(error);
        if (!opened) reject(error);
        else if (this.socket === socket) this.hooks.onError?.(error);
      };
      socket.onerror = () => {};
    });
  }

  close() {
    const socket = this.socket;
    this.socket = null;
    socket?.close(1000);
  }

  dropConnection() {
    this.socket?.close(4000, "dropped");
  }

  _send(frame) {
    if (!this.socket || this.socket.readyState !== WebSocket.OPEN) throw new ClientError("not connected");
    const text = JSON.stringify(frame);
    this.socket.send(text);
    this.hooks.onFrame?.({ dir: "out", binary: false, bytes: text.length, data: frame });
  }

  /** An event the page draws as the gateway's: numbered, then to onEvent and send(). */
  _draw(ev, logged = true) {
    if (logged) {
      this.lastSeq += 1;
      ev.seq = this.lastSeq;
    }
    ev.timestamp = Date.now() / 1000;
    this.hooks.onEvent?.(ev, logged);
    this._turn?.(ev);
  }

  _receive(ev) {
    switch (ev.type) {
      case "session.created":
      case "session.updated": {
        const s = ev.session ?? {};
        const config = {
          instructions: s.instructions ?? "",
          model: s.model ?? "",
          output: (s.output_modalities ?? ["text"])[0],
          tools: (s.tools ?? []).map((t) => ({ name: t.name, description: t.description ?? "", parameters: t.parameters })),
        };
        const configured = { type: "configured", config };
        this._draw(configured);
        if (ev.type === "session.updated") this._configuring.shift()?.resolve(configured);
        break;
      }
      case "conversation.item.done":
        if (ev.item?.role === "user") {
          const content = (ev.item.content ?? []).map((p) => p.text ?? p.transcript ?? "").join("");
          this._draw({ type: "user", content });
        }
        break;
      case "response.output_text.delta":
      case "response.output_audio_transcript.delta":
        this._draw({ type: "respond", content: ev.delta });
        break;
      case "response.done": {
        const usage = ev.response?.usage ?? {};
        const step = { input: usage.input_tokens ?? 0, output: usage.output_tokens ?? 0 };
        this.total = { input: this.total.input + step.input, output: this.total.output + step.output };
        this._draw(ev.response?.status === "cancelled" ? { type: "cancelled", content: "" } : { type: "end" });
        this._draw({ type: "metric", step, total: { ...this.total }, cost: { step: 0, total: 0 } });
        break;
      }
      case "error": {
        const error = { type: "error", code: ev.error?.code ?? ev.error?.type ?? "error", content: ev.error?.message ?? "" };
        this._configuring.shift()?.reject(error);
        this._draw(error, false);
        break;
      }
      default:
        break; // shown in the inspector only
    }
  }

  /** A turn: the user's message and response.create; yields the events drawn, to its metric. */
  async *send(text) {
    const inbox = [];
    let wake = null;
    this._turn = (ev) => {
      inbox.push(ev);
      wake?.();
    };
    try {
      const item = { type: "message", role: "user", content: [{ type: "input_text", text }] };
      this._send({ type: "conversation.item.create", item });
      this._send({ type: "response.create" });
      for (;;) {
        while (!inbox.length) await new Promise((r) => (wake = r));
        const ev = inbox.shift();
        if (ev === null) throw new ClientError("the OpenAI door's connection closed");
        yield ev;
        if (ev.type === "metric" || ev.type === "error") return;
      }
    } finally {
      this._turn = null;
    }
  }

  /** A configure as session.update: instructions, function tools and output go through. */
  configure(fields) {
    return new Promise((resolve, reject) => {
      const session = { type: "realtime" };
      if (fields.instructions !== undefined) session.instructions = fields.instructions;
      if (fields.tools !== undefined) {
        session.tools = fields.tools.map((t) => ({ type: "function", name: t.name, description: t.description ?? "", parameters: t.parameters ?? { type: "object" } }));
      }
      if (fields.output) session.output_modalities = [fields.output];
      this._configuring.push({ resolve, reject });
      try {
        this._send({ type: "session.update", session });
      } catch (err) {
        this._configuring.pop();
        reject(err);
      }
    });
  }

  async cancel() {
    this._send({ type: "response.cancel" });
  }

  async toolResult(id, status, content) {
    const output = typeof content === "string" ? content : JSON.stringify(content ?? null);
    this._send({ type: "conversation.item.create", item: { type: "function_call_output", call_id: id, output } });
    this._send({ type: "response.create" });
  }

  async approve() {
    throw new ClientError("approvals are the gateway's own protocol: turn the OpenAI door off to decide on calls");
  }

  async commit() {
    this._send({ type: "input_audio_buffer.commit" });
  }

  async ping() {
    return null; // OpenAI's protocol has no ping: the round trip is not measured
  }

  played() {}

  sendAudio() {
    throw new ClientError("the microphone speaks the gateway's own protocol: turn the OpenAI door off to talk");
  }
}
