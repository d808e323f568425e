// Types of realtime-gateway's JavaScript client (client.js). Events follow the
// gateway's client protocol (docs/protocol.md).

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
export interface UserEvent extends EventBase {
  type: "user"; content: string; source?: "audio"; reply_to?: string; item?: string;
}
/** A turn started with no new user message (the `reply` command). */
export interface ReplyEvent extends EventBase { type: "reply"; reply_to?: string }
export interface ThinkEvent extends EventBase { type: "think"; content: string; seq_from?: number }
export interface RespondEvent extends EventBase { type: "respond"; content: string; seq_from?: number }
export interface CallEvent extends EventBase {
  type: "call";
  content: string;
  /** The call's id within the session; answer a client call with it. */
  id: string;
  /** "client": a tool this client declared (answer with a tool_result); "gateway": a server tool. */
  runs_on: "gateway" | "client";
  /** A background call: the model was told "started"; its `result` comes later. */
  background?: boolean;
}
export interface ExecuteEvent extends EventBase { type: "execute" }
export interface ResultEvent extends EventBase {
  type: "result";
  content: string;
  payload: { tools_executed: number; success_count: number; failure_count: number };
}
export interface EndEvent extends EventBase { type: "end" }
export interface Usage {
  input: number;
  output: number;
  cached?: number;
  input_audio?: number;
  output_audio?: number;
}
export interface MetricEvent extends EventBase {
  type: "metric";
  step: Usage;
  total: Usage;
  /** USD: this step's and the session's. */
  cost?: { step: number; total: number };
  /** Part of `step` was estimated from characters (the provider reported no usage). */
  estimated?: boolean;
}
/** The code set, generated from the gateway's Python declaration (errors.js). */
export type ErrorCode = (typeof ERROR_CODES)[number];
export const ERROR_CODES: readonly string[];
/** `reply_to`: the `id` of the command it refuses (an approve's: the call's id). */
export interface ErrorEvent extends EventBase { type: "error"; code: string; content: string; reply_to?: string }
export interface InterruptEvent extends EventBase { type: "interrupt"; content: string }
/** A guardrail rule tripped (docs/guardrails.md): never the matched text. */
export interface GuardrailEvent extends EventBase {
  type: "guardrail";
  rule: string;
  action: "block" | "redact" | "end_turn";
  on: "input" | "output";
  /** The id of the user message it judged. */
  reply_to?: string;
}
export interface CancelledEvent extends EventBase {
  type: "cancelled";
  content: string;
  reply_to?: string;
  reason?: "barge_in";
  /** A barge-in: ms of the spoken answer the client reported played (see played()). */
  heard_ms?: number;
}
/** The session's effective configuration (docs/http-api.md "A session's own configuration"). */
export interface SessionConfig {
  instructions?: string;
  tools?: ClientToolSpec[];
  server_tools?: string[] | null;
  provider?: string;
  model?: string;
  metadata?: Record<string, string>;
  input_audio?: { format: "pcm16"; rate: number; turn_detection: "server_vad" | "none" } | null;
  output?: "text" | "audio";
  voice?: string;
}
export interface ClientToolSpec {
  name: string;
  description?: string;
  /** JSON Schema of the args: an object schema. */
  parameters: Record<string, unknown>;
}
/** Call `id` waits for a user's decision: show `name` and the exact `args`, then approve(). */
export interface ApprovalRequiredEvent extends EventBase {
  type: "approval_required";
  id: string;
  name: string;
  args: Record<string, unknown>;
  /** SHA-256 of the call's id, name and args: an approval applies to exactly this call. */
  digest: string;
}
/** The decision on call `id` (logged once); reason "timeout" when nobody decided in time. */
export interface ApprovalEvent extends EventBase {
  type: "approval";
  id: string;
  digest: string;
  decision: "allow" | "deny";
  reply_to?: string;
  reason?: "timeout";
}
export interface ConfiguredEvent extends EventBase { type: "configured"; config: SessionConfig; reply_to?: string }
export interface ContextEvent extends EventBase {
  type: "context";
  role: "system" | "user" | "assistant";
  content: string;
  reply_to?: string;
  item?: string;
}
export interface SpeechStartedEvent extends EventBase {
  type: "speech_started";
  offset_ms: number;
  /** The previous answer, complete but still playing, was cut where the client had played to. */
  heard_ms?: number;
}
export interface SpeechStoppedEvent extends EventBase { type: "speech_stopped"; offset_ms: number }

export type GatewayEvent =
  | UserEvent | ReplyEvent | ThinkEvent | CallEvent | ExecuteEvent | ResultEvent | RespondEvent
  | EndEvent | MetricEvent | ErrorEvent | InterruptEvent | CancelledEvent
  | ConfiguredEvent | ContextEvent | SpeechStartedEvent | SpeechStoppedEvent
  | ApprovalRequiredEvent | ApprovalEvent | GuardrailEvent;

/** One frame on the wire, for an inspector: sent ("out") or received ("in"). */
export interface WireFrame {
  dir: "in" | "out";
  /** A binary frame: user audio (out) or the model's speech (in, tagged with `seq`). */
  binary: boolean;
  bytes: number;
  /** The JSON frame, parsed (absent for binary frames). */
  data?: Record<string, unknown>;
  /** Received audio: its seq tag. */
  seq?: number;
  /** Received JSON: "new", "reply", "duplicate" or "gap" (see classifySeq). */
  verdict?: "new" | "reply" | "duplicate" | "gap";
}

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
  /** Every frame sent and received, as it goes (the session frame, duplicates and pongs too). */
  onFrame?: (frame: WireFrame) => void;
  /** Each approval_required read (a resumed client's replay too): return "allow"/true or
   * "deny"/false to decide at once, nothing to decide later with approve(). */
  onApproval?: (
    event: ApprovalRequiredEvent,
  ) => "allow" | "deny" | boolean | void | Promise<"allow" | "deny" | boolean | void>;
}

export class ClientError extends Error {}
/** The handshake was refused. In a browser, which cannot read the status, it is
 * inferred (`inferred: true`): 403 origin, 404 session, 401 key. */
export class RefusedError extends ClientError {
  status: number;
  serverMessage: string;
  reason: "origin" | "key" | "session" | "forbidden" | "";
  inferred: boolean;
}
/** The gateway refused a command: its error's `code` and `content`. */
export class CommandRefusedError extends ClientError {
  code: string;
  content: string;
}
/** The gateway refused a configure: `forbidden` (a client token, or the key's policy) or `bad_frame`. */
export class ConfigureRefusedError extends CommandRefusedError {}
/** The gateway refused an approve: `wrong_digest`, `unknown_call` (decided already, or
 * not waiting) or `forbidden` (this connection may not approve). */
export class ApprovalRefusedError extends ClientError {
  code: string;
  content: string;
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
  /** A turn's events, from the echo of `text` to the turn's end; each exactly once. An input
   * guardrail that judged `text` comes first; one that blocked it is the only event (no turn). */
  send(text: string): AsyncGenerator<GatewayEvent, void, undefined>;
  cancel(): Promise<void>;
  /** User audio (PCM16 mono at input_audio.rate) as one binary frame; false while disconnected. */
  sendAudio(pcm16: Int16Array | ArrayBuffer): boolean;
  tool(name: string, handler: ToolHandler): this;
  /** Answer a client-side call yourself: {type: "tool_result", id, status, content}. */
  toolResult(id: string, status: "success" | "failure", content: unknown): Promise<void>;
  /** Change the configuration (only the fields given), e.g. {tools: [...]}, {output: "audio"};
   * resolves with the `configured` answer, rejects with ConfigureRefusedError. */
  configure(fields: SessionConfig, options?: { timeout?: number }): Promise<ConfiguredEvent>;
  /** Add a message without a turn; resolves with the logged `context` event, rejects
   * with CommandRefusedError. */
  context(
    content: string,
    options?: { role?: "system" | "user" | "assistant"; timeout?: number },
  ): Promise<ContextEvent>;
  /** Start a turn with no new message (`reply`): its events, as `send`'s, from its
   * `reply` event to its end. */
  reply(): AsyncGenerator<GatewayEvent, void, undefined>;
  /** Decide on a call that waits for approval (its approval_required's id and digest);
   * resolves with the logged `approval`, rejects with ApprovalRefusedError. */
  approve(
    id: string, digest: string, decision?: "allow" | "deny", options?: { timeout?: number },
  ): Promise<ApprovalEvent>;
  /** End a spoken turn yourself (input_audio.turn_detection "none"). */
  commit(): Promise<void>;
  /** The round trip of a ping, in ms. */
  ping(): Promise<number>;
  /** Report playback: `ms` of the spoken answer was heard, up to the audio tagged `seq`
   * (false when not sent). */
  played(seq: number, ms: number): boolean;
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
