// realtime-gateway browser client: plain JS, no dependencies, no build step.
//
// The page keeps the last seq it applied. Every (re)connection after the first
// passes ?session_id=&after=LASTSEQ, the gateway replays the log after it, and
// events with a seq already applied are dropped, so a dropped socket, a node
// drain (close 1012) or a page reload never loses or doubles text.
"use strict";

(() => {
  const WS_PATH = "/v1/realtime";
  const KEY_SESSION = "rtgw.sessionId";
  const KEY_TOKEN = "rtgw.token"; // sessionStorage: per tab, gone when the tab closes
  const SHOW_CHARS = 400; // tool args/results longer than this are truncated
  const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];
  const CLOSE_DROPPED = 4000; // we closed to resync (seq gap, test hook): reconnect
  const CLOSE_SERVICE_RESTART = 1012; // node draining or session moved
  const REFUSALS_BEFORE_NOTICE = 3;

  const $ = (id) => document.getElementById(id);
  const ui = {
    connectForm: $("connect-form"),
    token: $("token"),
    connect: $("connect"),
    disconnect: $("disconnect"),
    newSession: $("new-session"),
    state: $("state"),
    sessionId: $("session-id"),
    lastSeq: $("last-seq"),
    tokens: $("tokens"),
    log: $("conversation"),
    messageForm: $("message-form"),
    message: $("message"),
    send: $("send"),
    cancel: $("cancel"),
  };

  // ------------------------------------------------------------ state

  const conn = {
    ws: null,
    state: "disconnected", // connecting | connected | reconnecting | disconnected
    wanted: false, // the user asked for a connection (Connect, not Disconnect)
    sessionId: sessionStorage.getItem(KEY_SESSION),
    lastSeq: 0, // last logged seq applied to the view
    seqs: [], // every logged seq applied, in order (tests check it is contiguous)
    connections: 0, // session frames received: > 1 means we reconnected
    attempt: 0,
    refusals: 0,
    timer: 0,
    turnRunning: false,
    awaitingEcho: false, // a user message was sent and its logged echo has not come
  };

  // The current turn's DOM, and the nodes of the model step in progress: an
  // interrupt means that step is rerun, so exactly those nodes are removed.
  const view = { turn: null, step: [], kind: "", text: null };

  // ------------------------------------------------------------ connection

  function socketUrl() {
    const params = new URLSearchParams();
    if (conn.sessionId) {
      params.set("session_id", conn.sessionId);
      params.set("after", String(conn.lastSeq));
    }
    const token = ui.token.value.trim();
    if (token) params.set("token", token);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const query = params.toString();
    return `${scheme}//${location.host}${WS_PATH}${query ? `?${query}` : ""}`;
  }

  function connect() {
    clearTimeout(conn.timer);
    conn.timer = 0;
    conn.wanted = true;
    const ws = new WebSocket(socketUrl());
    let opened = false;
    conn.ws = ws;
    setState(conn.connections ? "reconnecting" : "connecting");
    // Handlers check `ws === conn.ws`: a replaced socket's late events are ignored.
    ws.onopen = () => {
      opened = true;
    };
    ws.onmessage = (msg) => {
      if (ws === conn.ws) receive(msg.data);
    };
    ws.onclose = (ev) => {
      if (ws === conn.ws) closed(ev, opened);
    };
  }

  function closed(ev, opened) {
    conn.ws = null;
    conn.awaitingEcho = false; // the message may or may not be logged: the replay tells
    if (!conn.wanted) {
      setState("disconnected");
      return;
    }
    if (ev.code === CLOSE_SERVICE_RESTART) {
      // Every client of a draining node comes back at once: spread them a little.
      reconnectIn(Math.random() * 500);
    } else if (!opened) {
      checkRefusal();
    } else {
      reconnectIn(backoff());
    }
  }

  // A browser cannot read the HTTP status of a refused handshake. If the node
  // answers /healthz but keeps refusing us, the API key is wrong (401/403) or
  // the session expired (404) — or the store is briefly down (503), so the
  // view is kept and retries go on; the user decides what to change.
  function checkRefusal() {
    fetch("/healthz", { cache: "no-store" })
      .then((r) => {
        if (r.ok && ++conn.refusals === REFUSALS_BEFORE_NOTICE) {
          const hint = conn.sessionId
            ? "check the API key, or press New session if this session expired"
            : "check the API key";
          addNote("marker", `The gateway refuses the connection: ${hint}. Still retrying.`);
        }
      })
      .catch(() => {})
      .finally(() => {
        if (conn.wanted && !conn.ws) reconnectIn(backoff());
      });
  }

  function backoff() {
    const base = BACKOFF_MS[Math.min(conn.attempt, BACKOFF_MS.length - 1)];
    conn.attempt += 1;
    return base * (0.8 + Math.random() * 0.4); // jitter: no reconnect herd
  }

  function reconnectIn(ms) {
    clearTimeout(conn.timer);
    setState("reconnecting", `in ${(ms / 1000).toFixed(1)} s`);
    conn.timer = setTimeout(connect, ms);
  }

  function disconnect() {
    conn.wanted = false;
    clearTimeout(conn.timer);
    conn.timer = 0;
    const ws = conn.ws;
    conn.ws = null;
    if (ws) ws.close(1000, "closed by the user");
    setState("disconnected");
  }

  function forgetSession(notice) {
    conn.sessionId = null;
    sessionStorage.removeItem(KEY_SESSION);
    resetView();
    if (notice) addNote("marker", notice);
  }

  function newSession() {
    const wanted = conn.wanted;
    disconnect();
    forgetSession("");
    if (wanted) connect();
  }

  function sendFrame(frame) {
    if (!conn.ws || conn.state !== "connected") return false;
    conn.ws.send(JSON.stringify(frame));
    return true;
  }

  // ------------------------------------------------------------ events

  function receive(data) {
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return;
    }
    if (ev.type === "session") {
      onSession(ev);
    } else if (ev.seq === conn.lastSeq + 1) {
      conn.lastSeq = ev.seq;
      conn.seqs.push(ev.seq);
      render(ev);
    } else if (ev.seq > conn.lastSeq) {
      // A gap: never render past it. Reconnecting replays from lastSeq.
      conn.ws.close(CLOSE_DROPPED, "seq gap");
      return;
    } else if (ev.type === "error") {
      // Not logged: a reply to one of our frames, stamped with the last seq.
      conn.awaitingEcho = false;
      addError(ev);
    } // else: a duplicate of something already shown
    updateStatus();
  }

  function onSession(ev) {
    if (conn.sessionId && ev.session_id !== conn.sessionId) resetView();
    conn.sessionId = ev.session_id;
    sessionStorage.setItem(KEY_SESSION, ev.session_id);
    conn.connections += 1;
    conn.attempt = 0;
    conn.refusals = 0;
    setState("connected");
  }

  function render(ev) {
    switch (ev.type) {
      case "user":
        startTurn(ev.content);
        conn.awaitingEcho = false;
        setRunning(true);
        break;
      case "think":
      case "respond":
        appendText(ev.type, ev.content);
        break;
      case "call":
        addCall(ev.content);
        break;
      case "result":
        addResult(ev);
        break;
      case "end":
        view.kind = "";
        setRunning(false);
        break;
      case "cancelled":
        addNote("marker cancelled", "Cancelled.");
        setRunning(false);
        break;
      case "interrupt":
        discardStep();
        addNote("marker interrupt", `Interrupted: ${ev.content || "the step is rerun"}`);
        setRunning(true);
        break;
      case "error":
        addError(ev);
        break;
      case "metric":
        ui.tokens.textContent = `${ev.total.input} in / ${ev.total.output} out`;
        break;
      default: // execute, and types a newer gateway may add
        break;
    }
  }

  // ------------------------------------------------------------ view

  function h(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text; // never innerHTML: content is untrusted
    return node;
  }

  function truncate(text) {
    if (text.length <= SHOW_CHARS) return text;
    return `${text.slice(0, SHOW_CHARS)}… (${text.length - SHOW_CHARS} more characters)`;
  }

  function resetView() {
    ui.log.replaceChildren();
    Object.assign(view, { turn: null, step: [], kind: "", text: null });
    conn.lastSeq = 0;
    conn.seqs = [];
    setRunning(false);
    updateStatus();
  }

  function currentTurn() {
    if (!view.turn) view.turn = ui.log.appendChild(h("article", "turn"));
    return view.turn;
  }

  // Follow the stream only while the reader is at the bottom: scrolling up to
  // read stops the jumping.
  function following(change) {
    const atBottom = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 60;
    change();
    if (atBottom) ui.log.scrollTop = ui.log.scrollHeight;
  }

  function append(node, { partOfStep = false } = {}) {
    following(() => currentTurn().appendChild(node));
    if (partOfStep) view.step.push(node);
  }

  function boundary() {
    view.step = [];
    view.kind = "";
  }

  function startTurn(content) {
    view.turn = ui.log.appendChild(h("article", "turn"));
    append(h("p", "user", content));
    boundary();
  }

  function appendText(kind, chunk) {
    if (view.kind !== kind) {
      view.kind = kind;
      view.text = document.createTextNode("");
      if (kind === "think") {
        const block = h("details", "think");
        block.open = true;
        block.append(h("summary", "", "Thinking"), h("div", "text"));
        block.lastChild.append(view.text);
        append(block, { partOfStep: true });
      } else {
        const block = h("div", "respond");
        block.append(view.text);
        append(block, { partOfStep: true });
      }
    }
    following(() => view.text.appendData(chunk)); // one growing text node: no O(n²) re-render
  }

  function addCall(content) {
    let name = "?";
    let args = content;
    try {
      const call = JSON.parse(content);
      name = String(call.name);
      args = JSON.stringify(call.args ?? {});
    } catch {
      // show the raw content
    }
    view.kind = "";
    const node = h("div", "call");
    node.append("Tool call ", h("code", "tool-name", name), " ", h("code", "tool-args", truncate(args)));
    append(node, { partOfStep: true });
  }

  function addResult(ev) {
    let items = [];
    try {
      items = JSON.parse(ev.content);
    } catch {
      items = [{ tool: "?", status: "failure", content: ev.content }];
    }
    const node = h("div", "result");
    for (const item of items) {
      const status = item.status === "success" ? "success" : "failure";
      const raw = typeof item.content === "string" ? item.content : JSON.stringify(item.content);
      const row = h("div", "tool-item");
      row.append(
        "Result ",
        h("span", "tool-name", String(item.tool)),
        " ",
        h("span", `tool-status ${status}`, status),
        h("pre", "tool-output", truncate(raw ?? "")),
      );
      node.append(row);
    }
    append(node);
    boundary(); // the next step starts after the results
  }

  function discardStep() {
    for (const node of view.step) node.remove();
    boundary();
  }

  function addError(ev) {
    const node = h("p", "error", `Error (${ev.code || "internal"}): ${ev.content}`);
    node.setAttribute("role", "alert");
    append(node);
  }

  function addNote(className, text) {
    append(h("p", className, text));
  }

  // ------------------------------------------------------------ status and controls

  function setState(state, detail = "") {
    conn.state = state;
    ui.state.textContent = detail ? `${state} ${detail}` : state;
    updateStatus();
  }

  function setRunning(running) {
    conn.turnRunning = running;
    // Screen readers hold a busy live region's updates: the streamed answer is
    // announced once, not token by token.
    ui.log.setAttribute("aria-busy", String(running));
    updateControls();
  }

  function updateStatus() {
    ui.sessionId.textContent = conn.sessionId || "none";
    ui.lastSeq.textContent = String(conn.lastSeq);
    updateControls();
  }

  function updateControls() {
    const online = conn.state === "connected";
    ui.connect.disabled = conn.wanted;
    ui.disconnect.disabled = !conn.wanted;
    ui.send.disabled = !online || conn.turnRunning || conn.awaitingEcho;
    ui.cancel.disabled = !online || !conn.turnRunning;
  }

  // ------------------------------------------------------------ wiring

  ui.connectForm.addEventListener("submit", (e) => {
    e.preventDefault();
    if (conn.wanted) return;
    sessionStorage.setItem(KEY_TOKEN, ui.token.value.trim());
    conn.attempt = 0;
    connect();
  });
  ui.disconnect.addEventListener("click", disconnect);
  ui.newSession.addEventListener("click", newSession);

  ui.messageForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const content = ui.message.value;
    if (!content.trim() || ui.send.disabled) return;
    if (sendFrame({ type: "user", content })) {
      ui.message.value = "";
      conn.awaitingEcho = true;
      updateControls();
    }
  });
  ui.message.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      ui.messageForm.requestSubmit();
    }
  });
  ui.cancel.addEventListener("click", () => sendFrame({ type: "cancel" }));

  // Back online: retry now instead of waiting out the backoff.
  window.addEventListener("online", () => {
    if (conn.wanted && !conn.ws) connect();
  });

  ui.token.value = sessionStorage.getItem(KEY_TOKEN) || "";
  updateStatus();
  // A reload resumes the tab's session, replaying it from the start into the empty view.
  if (conn.sessionId) connect();

  // Test hook: read-only state, plus drop() to break the socket as a network would.
  window.rtgw = Object.freeze({
    get state() {
      return conn.state;
    },
    get sessionId() {
      return conn.sessionId;
    },
    get lastSeq() {
      return conn.lastSeq;
    },
    get seqs() {
      return conn.seqs.slice();
    },
    get connections() {
      return conn.connections;
    },
    get turnRunning() {
      return conn.turnRunning;
    },
    get ws() {
      return conn.ws;
    },
    drop() {
      if (conn.ws) conn.ws.close(CLOSE_DROPPED, "dropped by the test hook");
    },
  });
})();
