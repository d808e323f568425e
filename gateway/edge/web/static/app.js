// realtime-gateway browser page, built on the JavaScript client (/client.js).
//
// The client keeps the session alive: it reconnects with session_id and
// after=lastSeq, drops what it already delivered and refills gaps, so a
// dropped socket, a node drain (close 1012) or a page reload (the tab keeps its
// session id and replays from seq 0) never loses or doubles text. This file
// only renders: every delivered event arrives once, in order, via onEvent.
import { Client, ClientError, RefusedError } from "/client.js";

(() => {
  const WS_PATH = "/v1/realtime";
  const KEY_SESSION = "rtgw.sessionId";
  const KEY_TOKEN = "rtgw.token"; // sessionStorage: per tab, gone when the tab closes
  const SHOW_CHARS = 400; // tool args longer than this are truncated
  const RESULT_CHARS = 20000; // an expanded tool result shows at most this much
  // The page's own client-side tool: the model may ask the user a yes/no question.
  const CONFIRM_TOOL = {
    name: "confirm",
    description: "Ask the user a yes/no question in the page; the result is true (yes) or false (no).",
    parameters: {
      type: "object",
      properties: { question: { type: "string", description: "the question to show" } },
      required: ["question"],
    },
  };

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
    mic: $("mic"),
    speaker: $("speaker"),
  };
  const AUDIO_RATE = 24000; // Hz, both ways (protocol/audio.py)

  // ------------------------------------------------------------ state

  const conn = {
    client: null,
    state: "disconnected", // connecting | connected | reconnecting | disconnected
    wanted: false, // the user asked for a connection (Connect, not Disconnect)
    sessionId: sessionStorage.getItem(KEY_SESSION),
    lastSeq: 0, // last logged seq applied to the view
    seqs: [], // every logged seq applied, in order (tests check it is contiguous)
    connections: 0, // session frames received: > 1 means we reconnected
    turnRunning: false,
    awaitingEcho: false, // a user message was sent and its logged echo has not come
  };

  // The current turn's DOM, and the nodes of the model step in progress: an
  // interrupt means that step is rerun, so exactly those nodes are removed.
  const view = { turn: null, step: [], kind: "", text: null, respond: null, stats: null };

  // Voice: the microphone (getUserMedia → AudioWorklet → PCM16 binary frames)
  // and the speaker (the model's speech, played in order as it arrives).
  const voice = {
    mic: null, // {context, stream, node} while the microphone is on
    inputConfigured: false, // input_audio was configured in this session
    speaker: false, // output audio asked for
    playback: null, // AudioContext playing the model's speech
    playAt: 0, // context time the next chunk starts
    playing: new Set(), // chunks scheduled and not yet ended
    framesSent: 0,
    chunksPlayed: 0,
  };

  // ------------------------------------------------------------ connection

  function socketUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${WS_PATH}`;
  }

  async function connect() {
    if (conn.client) return;
    conn.wanted = true;
    const token = ui.token.value.trim();
    const client = new Client(socketUrl(), {
      token: token || undefined,
      sessionId: conn.sessionId ?? undefined,
      after: conn.sessionId ? conn.lastSeq : undefined,
      onEvent: (ev, logged) => {
        if (client === conn.client) receive(ev, logged);
      },
      onConnect: (session) => {
        if (client !== conn.client) return;
        if (conn.sessionId && session.session_id !== conn.sessionId) resetView();
        conn.sessionId = session.session_id;
        sessionStorage.setItem(KEY_SESSION, session.session_id);
        // A new session learns the page's tools once; a resumed one has them stored.
        // A client token (rtgw_ct.…) may not configure: its backend set the session up.
        const clientToken = token.startsWith("rtgw_ct.");
        if (!session.resumed && !clientToken) {
          client.configure({ tools: [CONFIRM_TOOL] }).catch(() => {});
        }
        conn.connections += 1;
        setState("connected");
      },
      onDisconnect: () => {
        if (client !== conn.client) return;
        conn.awaitingEcho = false; // the message may or may not be logged: the replay tells
        setState("reconnecting");
      },
      onError: (err) => {
        if (client === conn.client) failed(err);
      },
      onAudio: (pcm16) => {
        if (client === conn.client) play(pcm16);
      },
    });
    conn.client = client;
    setState(conn.connections ? "reconnecting" : "connecting");
    try {
      await client.connect();
    } catch (err) {
      if (client === conn.client) failed(err);
    }
  }

  // The client gave up: say why in one line and stop (the user decides what to change).
  function failed(err) {
    const client = conn.client;
    conn.client = null;
    conn.wanted = false;
    client?.close();
    if (err instanceof RefusedError && err.status === 0 && !ui.token.value.trim()) {
      addNote("marker", "API key required: enter it above and press Connect.");
      ui.token.focus();
    } else if (err instanceof RefusedError) {
      const hint = conn.sessionId
        ? "check the API key, or press New session if this session expired"
        : "check the API key";
      addNote("marker", `The gateway refuses the connection: ${hint}.`);
    } else {
      addNote("marker", `Disconnected: ${err instanceof ClientError ? err.message : String(err)}`);
    }
    setState("disconnected");
  }

  function disconnect() {
    stopMic();
    conn.wanted = false;
    const client = conn.client;
    conn.client = null;
    client?.close();
    setState("disconnected");
  }

  function forgetSession(notice) {
    voice.inputConfigured = false;
    voice.speaker = false;
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

  function sendTurn(content) {
    const client = conn.client;
    if (!client || conn.state !== "connected") return false;
    // Rendering happens in onEvent; iterating drives the turn and ends with it.
    (async () => {
      try {
        for await (const _ev of client.send(content)) {
          // rendered by receive()
        }
      } catch {
        // onError reports it
      } finally {
        conn.awaitingEcho = false;
        updateControls();
      }
    })();
    return true;
  }

  // ------------------------------------------------------------ voice

  async function toggleMic() {
    if (voice.mic) {
      stopMic();
      return;
    }
    const client = conn.client;
    if (!client || conn.state !== "connected") return;
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
    } catch (err) {
      addNote("marker", `The microphone is not available: ${err?.message ?? err}`);
      return;
    }
    // A context at the session's rate: the browser resamples the microphone.
    const context = new AudioContext({ sampleRate: AUDIO_RATE });
    await context.audioWorklet.addModule("/static/mic-worklet.js");
    const node = new AudioWorkletNode(context, "mic-frames");
    if (!voice.inputConfigured) {
      voice.inputConfigured = true;
      await client.configure({ input_audio: { format: "pcm16", rate: AUDIO_RATE } });
    }
    node.port.onmessage = (msg) => {
      if (conn.client?.sendAudio(msg.data)) voice.framesSent += 1;
    };
    context.createMediaStreamSource(stream).connect(node);
    voice.mic = { context, stream, node };
    updateControls();
  }

  function stopMic() {
    const mic = voice.mic;
    if (!mic) return;
    voice.mic = null;
    mic.node.port.onmessage = null;
    for (const track of mic.stream.getTracks()) track.stop();
    mic.context.close();
    updateControls();
  }

  function toggleSpeaker() {
    const client = conn.client;
    if (!client || conn.state !== "connected") return;
    voice.speaker = !voice.speaker;
    if (voice.speaker && !voice.playback) {
      voice.playback = new AudioContext({ sampleRate: AUDIO_RATE }); // a click: may start
    }
    if (!voice.speaker) stopPlayback();
    client.configure({ output: voice.speaker ? "audio" : "text" }).catch(() => {});
    updateControls();
  }

  // The model's speech, scheduled back to back; a barge-in stops it.
  function play(pcm16) {
    const context = voice.playback;
    if (!voice.speaker || !context) return;
    const buffer = context.createBuffer(1, pcm16.length, AUDIO_RATE);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < pcm16.length; i++) samples[i] = pcm16[i] / 0x8000;
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    const at = Math.max(voice.playAt, context.currentTime + 0.05);
    source.onended = () => voice.playing.delete(source);
    voice.playing.add(source);
    source.start(at);
    voice.playAt = at + buffer.duration;
    voice.chunksPlayed += 1;
  }

  function stopPlayback() {
    for (const source of voice.playing) source.stop();
    voice.playing.clear();
    voice.playAt = 0;
  }

  // ------------------------------------------------------------ events

  function receive(ev, logged) {
    if (logged) {
      conn.lastSeq = ev.seq;
      conn.seqs.push(ev.seq);
      render(ev);
    } else if (ev.type === "error") {
      // Not logged: a reply to one of our frames, stamped with the last seq.
      conn.awaitingEcho = false;
      addError(ev);
    }
    updateStatus();
  }

  function render(ev) {
    switch (ev.type) {
      case "user":
        startTurn(ev);
        conn.awaitingEcho = false;
        setRunning(true);
        break;
      case "think":
      case "respond":
        firstToken(ev);
        appendText(ev.type, ev.content);
        break;
      case "call":
        firstToken(ev);
        addCall(ev);
        break;
      case "result":
        settleQuestions();
        addResult(ev);
        break;
      case "end":
        view.kind = "";
        renderMarkdown();
        setRunning(false);
        break;
      case "cancelled":
        settleQuestions();
        renderMarkdown();
        addNote("marker cancelled", "Cancelled.");
        setRunning(false);
        break;
      case "interrupt":
        settleQuestions();
        discardStep();
        addNote("marker interrupt", `Interrupted: ${ev.content || "the step is rerun"}`);
        setRunning(true);
        break;
      case "error":
        addError(ev);
        break;
      case "speech_started":
        stopPlayback(); // barge-in: the user speaks over the answer
        addNote("marker speech", "Listening…");
        break;
      case "speech_stopped":
        addNote("marker speech", "Heard you.");
        break;
      case "configured":
        voice.speaker = ev.config?.output === "audio";
        voice.inputConfigured = Boolean(ev.config?.input_audio);
        updateControls();
        break;
      case "metric":
        ui.tokens.textContent = `${ev.total.input} in / ${ev.total.output} out`;
        turnTokens(ev);
        break;
      default: // execute, and types a newer gateway may add
        break;
    }
  }

  // Per-turn figures, from the server's timestamps (so a replayed turn shows the same).
  function firstToken(ev) {
    const stats = view.stats;
    if (!stats || stats.ttftMs !== null) return;
    stats.ttftMs = Math.max(0, Math.round((ev.timestamp - stats.start) * 1000));
    showStats();
  }

  function turnTokens(ev) {
    const stats = view.stats;
    if (!stats) return;
    stats.input += ev.step.input;
    stats.output += ev.step.output;
    showStats();
  }

  function showStats() {
    const stats = view.stats;
    const parts = [`${stats.input} in / ${stats.output} out tokens`];
    if (stats.ttftMs !== null) parts.push(`first token ${stats.ttftMs} ms`);
    stats.node.textContent = parts.join(" · ");
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

  function welcome() {
    const hint = h("p", "marker welcome");
    hint.append(
      "Type a message below and press Enter. Try ",
      h("code", "", "hello"),
      ", or ",
      h("code", "", '/tool list {"path": "."}'),
      " to see the model call a tool.",
    );
    return hint;
  }

  function resetView() {
    ui.log.replaceChildren(welcome());
    Object.assign(view, { turn: null, step: [], kind: "", text: null, respond: null, stats: null });
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
    const turn = currentTurn();
    const stats = view.stats && view.stats.node.parentNode === turn ? view.stats.node : null;
    following(() => turn.insertBefore(node, stats));
    if (partOfStep) view.step.push(node);
  }

  function boundary() {
    view.step = [];
    view.kind = "";
  }

  function startTurn(ev) {
    ui.log.querySelector(".welcome")?.remove();
    view.turn = ui.log.appendChild(h("article", "turn"));
    append(h("p", ev.source === "audio" ? "user spoken" : "user", ev.content));
    const node = h("p", "turn-stats");
    view.turn.appendChild(node);
    view.stats = { start: ev.timestamp, ttftMs: null, input: 0, output: 0, node };
    showStats();
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
        view.respond = block;
        append(block, { partOfStep: true });
      }
    }
    following(() => view.text.appendData(chunk)); // one growing text node: no O(n²) re-render
  }

  function addCall(ev) {
    let name = "?";
    let args = ev.content;
    let parsed = null;
    try {
      parsed = JSON.parse(ev.content);
      name = String(parsed.name);
      args = JSON.stringify(parsed.args ?? {});
    } catch {
      // show the raw content
    }
    view.kind = "";
    const onClient = ev.runs_on === "client";
    const node = h("div", onClient ? "call client-call" : "call");
    node.append(
      onClient ? "Client tool call " : "Tool call ",
      h("code", "tool-name", name),
      " ",
      h("code", "tool-args", truncate(args)),
    );
    if (onClient && name === "confirm" && parsed) node.append(confirmQuestion(ev.id, parsed.args ?? {}));
    append(node, { partOfStep: true });
  }

  // The confirm tool: the question with Yes/No; the answer goes back as the call's result.
  function confirmQuestion(id, args) {
    const box = h("div", "question");
    box.dataset.callId = id;
    box.append(h("span", "question-text", String(args.question ?? "")));
    for (const [label, value] of [["Yes", true], ["No", false]]) {
      const button = h("button", "answer", label);
      button.type = "button";
      button.addEventListener("click", () => {
        const client = conn.client;
        if (!client) return;
        settleQuestion(box, label);
        client.toolResult(id, "success", value).catch(() => {});
      });
      box.append(button);
    }
    return box;
  }

  function settleQuestion(box, answer) {
    for (const b of box.querySelectorAll("button")) b.disabled = true;
    if (answer) box.append(h("span", "question-answer", `you answered ${answer}`));
    box.classList.add("settled");
  }

  // A result ends its batch: questions still open there can no longer be answered.
  function settleQuestions() {
    for (const box of ui.log.querySelectorAll(".question:not(.settled)")) settleQuestion(box, "");
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
      const raw = typeof item.content === "string" ? item.content : JSON.stringify(item.content, null, 2);
      const text = raw ?? "";
      // Collapsed to one line; expanding shows the whole result (up to RESULT_CHARS).
      const row = h("details", "tool-item");
      const summary = h("summary");
      const preview = text.replace(/\s+/g, " ");
      summary.append(
        "Result ",
        h("span", "tool-name", String(item.tool)),
        " ",
        h("span", `tool-status ${status}`, status),
        " ",
        h("span", "tool-preview", preview.length > 80 ? `${preview.slice(0, 80)}…` : preview),
      );
      const shown = text.length > RESULT_CHARS
        ? `${text.slice(0, RESULT_CHARS)}… (${text.length - RESULT_CHARS} more characters)`
        : text;
      row.append(summary, h("pre", "tool-output", shown));
      node.append(row);
    }
    append(node);
    boundary(); // the next step starts after the results
  }

  // Markdown for the finished answer, built from DOM nodes (textContent only):
  // the model's text can never inject HTML. Streaming shows plain text; the
  // block is re-rendered once when the turn ends.
  function renderMarkdown() {
    const block = view.respond;
    view.respond = null;
    if (!block || !block.isConnected) return;
    const source = block.textContent;
    const rendered = markdown(source);
    if (rendered.textContent.replace(/\s/g, "") === "") return;
    block.replaceChildren(...rendered.childNodes);
  }

  function markdown(source) {
    const out = document.createDocumentFragment();
    const lines = source.split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (line.startsWith("```")) {
        const code = [];
        for (i += 1; i < lines.length && !lines[i].startsWith("```"); i += 1) code.push(lines[i]);
        i += 1;
        const pre = h("pre");
        pre.append(h("code", "", code.join("\n")));
        out.append(pre);
      } else if (/^#{1,6} /.test(line)) {
        const level = line.match(/^#+/)[0].length;
        out.append(inline(h(`h${Math.min(level + 2, 6)}`), line.slice(level + 1)));
        i += 1;
      } else if (/^\s*([-*]|\d+\.) /.test(line)) {
        const ordered = /^\s*\d+\./.test(line);
        const list = h(ordered ? "ol" : "ul");
        while (i < lines.length && /^\s*([-*]|\d+\.) /.test(lines[i])) {
          list.append(inline(h("li"), lines[i].replace(/^\s*([-*]|\d+\.) /, "")));
          i += 1;
        }
        out.append(list);
      } else if (line.trim() === "") {
        i += 1;
      } else {
        const para = [];
        while (i < lines.length && lines[i].trim() !== "" && !/^(```|#{1,6} |\s*([-*]|\d+\.) )/.test(lines[i])) {
          para.push(lines[i]);
          i += 1;
        }
        out.append(inline(h("p"), para.join("\n")));
      }
    }
    return out;
  }

  // `code`, **bold**, *italic*, [text](http(s) URL) — anything else stays text.
  function inline(parent, text) {
    const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
    let last = 0;
    for (const m of text.matchAll(pattern)) {
      parent.append(text.slice(last, m.index));
      if (m[1] !== undefined) parent.append(h("code", "", m[1]));
      else if (m[2] !== undefined) parent.append(h("strong", "", m[2]));
      else if (m[3] !== undefined) parent.append(h("em", "", m[3]));
      else {
        const a = h("a", "", m[4]);
        a.href = m[5];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        parent.append(a);
      }
      last = m.index + m[0].length;
    }
    parent.append(text.slice(last));
    return parent;
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
    ui.mic.disabled = !online && !voice.mic;
    ui.mic.setAttribute("aria-pressed", String(Boolean(voice.mic)));
    ui.mic.textContent = voice.mic ? "Mic on" : "Mic";
    ui.speaker.disabled = !online;
    ui.speaker.setAttribute("aria-pressed", String(voice.speaker));
    ui.speaker.textContent = voice.speaker ? "Speaker on" : "Speaker";
  }

  // ------------------------------------------------------------ wiring

  ui.connectForm.addEventListener("submit", (e) => {
    e.preventDefault();
    if (conn.wanted) return;
    sessionStorage.setItem(KEY_TOKEN, ui.token.value.trim());
    connect();
  });
  ui.disconnect.addEventListener("click", disconnect);
  ui.newSession.addEventListener("click", newSession);

  ui.messageForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const content = ui.message.value;
    if (!content.trim() || ui.send.disabled) return;
    if (sendTurn(content)) {
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
  ui.cancel.addEventListener("click", () => conn.client?.cancel().catch(() => {}));
  ui.mic.addEventListener("click", () => {
    toggleMic().catch((err) => addNote("marker", `Microphone: ${err?.message ?? err}`));
  });
  ui.speaker.addEventListener("click", toggleSpeaker);

  ui.token.value = sessionStorage.getItem(KEY_TOKEN) || "";
  resetView();
  // Connect on load: a node that needs no key just works; one that does says
  // "API key required" once and waits for the key. A reload resumes the tab's
  // session, replaying it from the start into the empty view.
  connect();

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
    get mic() {
      return Boolean(voice.mic);
    },
    get framesSent() {
      return voice.framesSent;
    },
    get chunksPlayed() {
      return voice.chunksPlayed;
    },
    drop() {
      conn.client?.dropConnection();
    },
  });
})();
