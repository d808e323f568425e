// realtime-gateway JavaScript client: the errors it raises (see client.js, which
// re-exports them). Every one says why the client cannot go on and what to do.

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

/** The gateway refused an approve: wrong_digest, unknown_call (decided already, or not
 * waiting) or forbidden (this connection may not approve), and its text. */
export class ApprovalRefusedError extends ClientError {
  constructor(code, content) {
    super(`the gateway refused the approval (${code}): ${content}`);
    this.name = "ApprovalRefusedError";
    this.code = code;
    this.content = content;
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
