// Types of realtime-gateway's JavaScript client (client.js). Events follow the
// gateway's client protocol (README "Client protocol").

interface EventBase {
  seq: number;
  timestamp: number;
}
export interface SessionEvent extends EventBase {
  type: "session";
  session_id: string;
  resumed: boolean;
  provider: string;
  node: string;
}
export interface UserEvent extends EventBase { type: "user"; content: string }
export interface ThinkEvent extends EventBase { type: "think"; content: string; seq_from?: number }
export interface RespondEvent extends EventBase { type: "respond"; content: string; seq_from?: number }
export interface CallEvent extends EventBase {
  type: "call";
  content: string;
  /** The call's id within the session; answer a client call with it. */
  id: string;
  /** "client": a tool this client declared (answer with a tool_result); "gateway": a server tool. */
  runs_on: "gateway" | "client";
}
export interface ExecuteEvent extends EventBase { type: "execute" }
export interface ResultEvent extends EventBase {
  type: "result";
  content: string;
  payload: { tools_executed: number; success_count: number; failure_count: number };
}
export interface EndEvent extends EventBase { type: "end" }
export interface Usage { input: number; output: number }
export interface MetricEvent extends EventBase { type: "metric"; step: Usage; total: Usage }
export interface ErrorEvent extends EventBase { type: "error"; code: string; content: string }
export interface InterruptEvent extends EventBase { type: "interrupt"; content: string }
export interface CancelledEvent extends EventBase { type: "cancelled"; content: string }

export type GatewayEvent =
  | UserEvent | ThinkEvent | CallEvent | ExecuteEvent | ResultEvent | RespondEvent
  | EndEvent | MetricEvent | ErrorEvent | InterruptEvent | CancelledEvent;

/** A client tool: gets the call's args, returns the result's content (JSON-encodable). */
export type ToolHandler = (args: Record<string, unknown>) => unknown | Promise<unknown>;

export interface ClientOptions {
  /** API key: a Bearer header in Node, ?token= in browsers. */
  token?: string;
  /** Resume this session after seq `after`. */
  sessionId?: string;
  after?: number;
  /** ms to wait for the metric after end/cancelled (default 500). */
  metricGrace?: number;
  /** ms of failed reconnecting before ConnectionLostError (default 60000). */
  reconnectTimeout?: number;
  /** Reconnect delays in ms, doubled per attempt, with jitter (defaults 100, 5000). */
  backoffInitial?: number;
  backoffMax?: number;
  /** ms for a handshake and its session frame (default 10000). */
  openTimeout?: number;
  /** A WebSocket constructor to use instead of the built-in transport. */
  WebSocket?: new (url: string) => WebSocket;
  onConnect?: (session: SessionEvent) => void;
  onDisconnect?: (reason: string) => void;
  /** Every event delivered (replays and other clients' turns too), once, in order; logged=false for an unlogged error reply. */
  onEvent?: (event: GatewayEvent, logged: boolean) => void;
  /** The client gave up (ConnectionLostError, or RefusedError on a resume). */
  onError?: (error: ClientError) => void;
  /** The model's speech: PCM16 mono at 24 kHz, tagged with the seq of the newest event. */
  onAudio?: (pcm16: Int16Array, seq: number) => void;
}

export class ClientError extends Error {}
/** status 0: a browser, which cannot read a refused handshake's status. */
export class RefusedError extends ClientError {
  status: number;
  serverMessage: string;
}
export class UnreachableError extends ClientError {}
export class ConnectionLostError extends ClientError {}

export class Client {
  constructor(url: string, options?: ClientOptions);
  readonly url: string;
  readonly sessionId: string | null;
  /** The seq of the last logged event received (what a resume asks `after`). */
  readonly lastSeq: number;
  readonly session: SessionEvent | null;
  readonly connected: boolean;
  readonly reconnects: number;
  connect(): Promise<void>;
  /** A turn's events, from the echo of `text` to the turn's end; each exactly once. */
  send(text: string): AsyncGenerator<GatewayEvent, void, undefined>;
  cancel(): Promise<void>;
  /** User audio (PCM16 mono at input_audio.rate) as one binary frame; false while disconnected. */
  sendAudio(pcm16: Int16Array | ArrayBuffer): boolean;
  tool(name: string, handler: ToolHandler): this;
  /** Answer a client-side call yourself: {type: "tool_result", id, status, content}. */
  toolResult(id: string, status: "success" | "failure", content: unknown): Promise<void>;
  /** Send a configure frame (only the fields given), e.g. {tools: [...]}, {output: "audio"}. */
  configure(fields: Record<string, unknown>): Promise<void>;
  close(): void;
  /** Test hook: drop the connection as a network failure would. */
  dropConnection(): void;
}

export class TurnTracker {
  closing: boolean;
  done: boolean;
  endsBefore(type: string): boolean;
  feed(type: string, code?: string): boolean;
}
export function classifySeq(
  type: string, seq: number, last: number, seqFrom?: number,
): "new" | "reply" | "duplicate" | "gap";
export function normalizeUrl(url: string): string;
