// The realtime-gateway console, built on the JavaScript client (/client.js).
//
// The client keeps the session alive: it reconnects with session_id and
// after=lastSeq, drops what it already delivered and refills gaps, so a
// dropped socket, a node drain (close 1012) or a page reload (the tab keeps
// its session id and replays from seq 0) never loses or doubles text. This
// file wires the panes: the conversation (conversation.js), the event
// inspector (inspector.js), the settings panel (settings.js), voice
// (voice.js), session controls and the status bar.
import { Client, ClientError, RefusedError } from "/client.js";
import { Conversation } from "/static/conversation.js";
import { $, copyText, download, fmtCost, fmtCount, fmtMs, toast } from "/static/dom.js";
import {
  downloadRecording,
  fetchRecording,
  parseRecording,
  renderTimeline,
  timelineRows,
} from "/static/recording.js";
import { Inspector } from "/static/inspector.js";
import { DOOR_PATH, DoorClient } from "/static/openai-door.js";
import { Settings } from "/static/settings.js";
import { Voice } from "/static/voice.js";

const WS_PATH = "/v1/realtime";
const KEY_SESSION = "rtgw.sessionId";
const KEY_TOKEN = "rtgw.token"; // sessionStorage: per tab, gone when the tab closes
const KEY_DOOR = "rtgw.door"; // sessionStorage: "1" when the page speaks through the OpenAI door
const KEY_VIEW = "rtgw.view";
const AUDIO_RATE = 24000;
const PING_EVERY = 15000; // ms
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

const ui = {
  app: $("app"),
  state: $("state"),
  pill: $("conn-pill"),
  token: $("token"),
  tokenHint: $("token-hint"),
  connectForm: $("connect-form"),
  connect: $("connect"),
  disconnect: $("disconnect"),
  newSession: $("new-session"),
  newSession2: $("new-session-2"),
  sessionId: $("session-id"),
  sessionOrigin: $("session-origin"),
  copySession: $("copy-session"),
  exportButton: $("export"),
  deleteButton: $("delete-session"),
  deleteHint: $("delete-hint"),
  loadRecording: $("load-recording"),
  downloadRecording: $("download-recording"),
  recordingHint: $("recording-hint"),
  recordingTimeline: $("recording-timeline"),
  resumeForm: $("resume-form"),
  resumeId: $("resume-id"),
  gatewayUrl: $("gateway-url"),
  log: $("conversation"),
  announcer: $("announcer"),
  messageForm: $("message-form"),
  message: $("message"),
  send: $("send"),
  cancel: $("cancel"),
  mic: $("mic"),
  speaker: $("speaker"),
  commit: $("commit"),
  voiceBar: $("voice-bar"),
  voiceState: $("voice-state"),
  levelFill: $("level-fill"),
  micMeter: $("mic-meter-fill"),
  micLevel: $("mic-level"),
  eventsCount: $("events-count"),
  sbState: $("sb-state"),
  sbNode: $("sb-node"),
  sbProvider: $("sb-provider"),
  sbSession: $("sb-session"),
  sbRtt: $("sb-rtt"),
  lastSeq: $("last-seq"),
  tokens: $("tokens"),
};

/** The recording last shown (its session, its JSON Lines), for the download. */
const recording = { sid: null, text: "", note: "" };

// ------------------------------------------------------------------ state

const conn = {
  client: null,
  state: "disconnected", // connecting | connected | reconnecting | disconnected
  wanted: false, // the user asked for a connection (Connect, not Disconnect)
  sessionId: sessionStorage.getItem(KEY_SESSION),
  session: null, // the last session frame
  lastSeq: 0, // last logged seq applied to the view
  seqs: [], // every logged seq applied, in order (tests check it is contiguous)
  events: [], // every logged event, for the transcript export
  connections: 0, // session frames received: > 1 means we reconnected
  turnRunning: false,
  awaitingEcho: false, // a user message was sent and its logged echo has not come
  config: {}, // the last configured answer
  totals: { input: 0, output: 0, cost: 0 },
  rtt: null,
  clientToken: false,
};

let offer = { provider: "", providers: [], auth: null, api_port: null };

const conversation = new Conversation(ui.log, {
  suggest: (text) => {
    ui.message.value = text;
    submitMessage();
  },
  mic: () => toggleMic(),
  answerTool: (id, status, content) => conn.client?.toolResult(id, status, content).catch(() => {}),
  // Resolves with the logged approval; a refusal is shown by onEvent (an unlogged error).
  approve: (id, digest, decision) => conn.client?.approve(id, digest, decision) ?? Promise.reject(new ClientError("not connected")),
  handles: (name) => name === "confirm",
  running: (running) => ui.log.setAttribute("aria-busy", String(running)),
});

const inspector = new Inspector($("events-pane"), {
  session: () => ({ session_id: conn.sessionId, node: conn.session?.node, provider: conn.session?.provider }),
});

const settings = new Settings($("settings-pane"), {
  pageTools: [CONFIRM_TOOL],
  apply: async (fields) => {
    const client = conn.client;
    if (!client || conn.state !== "connected") throw new ClientError("not connected");
    return client.configure(fields);
  },
  door: (on) => {
    sessionStorage.setItem(KEY_DOOR, on ? "1" : "");
    newSession();
  },
});
settings.door.checked = sessionStorage.getItem(KEY_DOOR) === "1";

const voice = new Voice({
  client: () => conn.client,
  state: (text, kind) => {
    ui.voiceState.textContent = text || "Microphone off";
    ui.voiceState.dataset.kind = kind;
  },
  level: (rms) => {
    const level = rms > 0 ? Math.max(0, Math.min(1, (20 * Math.log10(rms) + 60) / 60)) : 0;
    ui.levelFill.style.transform = `scaleX(${level.toFixed(3)})`;
    ui.micMeter.style.transform = `scaleY(${level.toFixed(3)})`;
    ui.micLevel.value = level;
  },
  changed: () => updateControls(),
  problem: (text) => conversation.note(text, "bad"),
});

// ------------------------------------------------------------------ connection

function socketUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${WS_PATH}`;
}

// Through the OpenAI door: ?model= a model it serves (the Model setting's, if it is one).
function doorUrl() {
  const models = offer.door_models ?? [];
  const model = models.includes(settings.model.value.trim()) ? settings.model.value.trim() : models[0];
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${DOOR_PATH}?model=${encodeURIComponent(model ?? "gpt-realtime-2.1")}`;
}

async function connect() {
  if (conn.client) return;
  conn.wanted = true;
  const token = ui.token.value.trim();
  conn.clientToken = token.startsWith("rtgw_ct.");
  const door = settings.door.checked;
  const client = new (door ? DoorClient : Client)(door ? doorUrl() : socketUrl(), {
    token: token || undefined,
    sessionId: conn.sessionId ?? undefined,
    after: conn.sessionId ? conn.lastSeq : undefined,
    onEvent: (ev, logged) => {
      if (client === conn.client) receive(ev, logged);
    },
    onFrame: (frame) => {
      if (client === conn.client) {
        inspector.add(frame);
        ui.eventsCount.textContent = fmtCount(inspector.frames.length + inspector.dropped);
      }
    },
    onConnect: (session) => {
      if (client !== conn.client) return;
      if (conn.sessionId && session.session_id !== conn.sessionId) resetView();
      conn.sessionId = session.session_id;
      conn.session = session;
      sessionStorage.setItem(KEY_SESSION, session.session_id);
      // A new session learns the page's tools once; a resumed one has them stored.
      // A client token may not configure: its backend set the session up.
      if (!session.resumed && !conn.clientToken) {
        client.configure({ tools: [CONFIRM_TOOL] }).catch(() => {});
      }
      if (conn.connections === 0) {
        ui.sessionOrigin.textContent = session.resumed ? `resumed at seq ${session.seq}` : "new in this tab";
      }
      conn.connections += 1;
      if (offer.auth === null) ui.tokenHint.textContent = token ? "" : "(not needed: this node runs open)";
      conversation.keyAccepted();
      conversation.setProvider(session.provider);
      settings.setLocked(conn.clientToken);
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
    onAudio: (pcm16, seq) => {
      if (client === conn.client) voice.play(pcm16, seq);
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

// The client gave up: say why in one line, with what to do, and stop.
function failed(err) {
  const client = conn.client;
  conn.client = null;
  conn.wanted = false;
  client?.close();
  voice.stopMic();
  if (err instanceof RefusedError && err.reason === "key" && !conn.sessionId) {
    // Asked where the conversation will be; the Session panel's field is the same key.
    const typed = ui.token.value.trim();
    conversation.askKey(
      (key) => {
        ui.token.value = key;
        sessionStorage.setItem(KEY_TOKEN, key);
        connect();
      },
      typed ? "That key is not accepted: check it, or ask for a new client token." : "",
    );
    ui.tokenHint.textContent = "(required by this node)";
    setView("chat");
  } else if (err instanceof RefusedError) {
    const what = {
      key: "the API key is not accepted: check it in Session → API key",
      session: `session ${conn.sessionId} does not exist any more (expired, deleted, or another key's): press New session`,
      origin: err.serverMessage,
    }[err.reason] ?? err.serverMessage;
    conversation.note(`The gateway refuses the connection: ${what}.`, "bad");
  } else {
    conversation.note(`Disconnected: ${err instanceof ClientError ? err.message : String(err)}`, "bad");
  }
  setState("disconnected");
}

function disconnect() {
  voice.stopMic();
  voice.stop();
  conn.wanted = false;
  const client = conn.client;
  conn.client = null;
  client?.close();
  setState("disconnected");
}

function forgetSession() {
  conn.sessionId = null;
  conn.session = null;
  sessionStorage.removeItem(KEY_SESSION);
  ui.sessionOrigin.textContent = "–";
  resetView();
}

function newSession() {
  const wanted = conn.wanted || conn.state !== "disconnected";
  disconnect();
  forgetSession();
  conn.connections = 0;
  if (wanted) connect();
  ui.message.focus();
}

function resume(id) {
  disconnect();
  forgetSession();
  conn.sessionId = id;
  conn.connections = 0;
  sessionStorage.setItem(KEY_SESSION, id);
  connect();
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

function submitMessage() {
  const content = ui.message.value;
  if (!content.trim() || ui.send.disabled) return;
  if (sendTurn(content)) {
    ui.message.value = "";
    autosize();
    conn.awaitingEcho = true;
    updateControls();
  }
}

// ------------------------------------------------------------------ voice

async function toggleMic() {
  if (voice.micOn) {
    voice.stopMic();
    return;
  }
  const client = conn.client;
  if (!client || conn.state !== "connected") return;
  const wanted = conn.config.input_audio ?? { format: "pcm16", rate: AUDIO_RATE, turn_detection: "server_vad" };
  if (!conn.config.input_audio) {
    try {
      await client.configure({ input_audio: wanted });
    } catch (err) {
      conversation.note(`The microphone needs input audio configured: ${err.content ?? err.message}`, "bad");
      return;
    }
  }
  await voice.startMic(wanted.rate);
}

async function toggleSpeaker() {
  const client = conn.client;
  if (!client || conn.state !== "connected") return;
  const on = !voice.speaker;
  voice.enableSpeaker(on); // on a click: the browser lets the context play
  try {
    await client.configure({ output: on ? "audio" : "text" });
  } catch (err) {
    voice.enableSpeaker(!on);
    conversation.note(`The speaker needs output audio: ${err.content ?? err.message}`, "bad");
  }
}

// ------------------------------------------------------------------ events

function receive(ev, logged) {
  if (logged) {
    conn.lastSeq = ev.seq;
    conn.seqs.push(ev.seq);
    conn.events.push(ev);
    switch (ev.type) {
      case "user":
      case "reply": // a turn with no new message: the model answers what it has
        conn.awaitingEcho = false;
        voice.newAnswer();
        setRunning(true);
        break;
      case "end":
      case "cancelled":
        setRunning(false);
        break;
      case "interrupt":
        setRunning(true);
        break;
      case "guardrail":
        if (ev.on === "input" && ev.action !== "redact") conn.awaitingEcho = false; // no turn
        break;
      case "speech_started":
        voice.stop(); // barge-in: the user speaks over the answer
        break;
      case "configured":
        conn.config = ev.config ?? {};
        settings.showConfigured(ev);
        voice.speaker = conn.config.output === "audio" && Boolean(voice.playback);
        if (!conn.config.input_audio) voice.stopMic();
        updateControls();
        break;
      case "metric":
        conn.totals.input = ev.total.input;
        conn.totals.output = ev.total.output;
        conn.totals.cost = ev.cost?.total ?? conn.totals.cost;
        break;
      default:
        break;
    }
    if (ev.type === "speech_started" && voice.micOn) voiceState("Hearing you", "hearing");
    if (ev.type === "speech_stopped" && voice.micOn) voiceState("Transcribing", "thinking");
    if (ev.type === "user" && voice.micOn) voiceState("Listening", "listening");
  } else if (ev.type === "error") {
    conn.awaitingEcho = false; // not logged: a reply to one of our frames
  }
  conversation.render(ev, logged);
  updateStatus();
}

function voiceState(text, kind) {
  ui.voiceState.textContent = text;
  ui.voiceState.dataset.kind = kind;
}

// ------------------------------------------------------------------ view

function resetView() {
  conversation.reset();
  settings.reset();
  inspector.clear();
  voice.reset();
  ui.eventsCount.textContent = "";
  Object.assign(conn, { lastSeq: 0, seqs: [], events: [], config: {}, totals: { input: 0, output: 0, cost: 0 } });
  setRunning(false);
  updateStatus();
}

function setView(view) {
  ui.app.dataset.view = view;
  sessionStorage.setItem(KEY_VIEW, view);
  const side = view === "chat" ? ui.app.dataset.side || "events" : view;
  if (view !== "chat") ui.app.dataset.side = view;
  for (const tab of document.querySelectorAll('[role="tab"]')) {
    const selected = tab.dataset.view === view || (view === "chat" && tab.dataset.view === side && isWide());
    tab.setAttribute("aria-selected", String(tab.dataset.view === view));
    tab.classList.toggle("side-open", selected && tab.dataset.view !== "chat");
    tab.tabIndex = tab.dataset.view === view ? 0 : -1;
  }
  for (const name of ["events", "settings", "session"]) $(`${name}-pane`).hidden = name !== side;
  if (side === "events") inspector.reveal();
}

function isWide() {
  return matchMedia("(min-width: 960px)").matches;
}

function setState(state) {
  conn.state = state;
  ui.state.textContent = state;
  ui.sbState.textContent = conn.client && conn.client.reconnects ? `${state} · ${conn.client.reconnects} reconnect${conn.client.reconnects === 1 ? "" : "s"}` : state;
  ui.pill.dataset.state = state;
  ui.app.dataset.state = state;
  updateStatus();
}

function setRunning(running) {
  conn.turnRunning = running;
  if (!running) ui.announcer.textContent = "";
  updateControls();
}

function updateStatus() {
  ui.sessionId.textContent = conn.sessionId || "none";
  ui.sbSession.textContent = conn.sessionId ? `${conn.sessionId.slice(0, 10)}…` : "–";
  ui.sbSession.title = conn.sessionId || "";
  ui.lastSeq.textContent = String(conn.lastSeq);
  const session = conn.session;
  ui.sbNode.textContent = session?.node || "–";
  const model = conn.config.model || offer.providers.find((p) => p.name === (conn.config.provider || session?.provider))?.default_model;
  ui.sbProvider.textContent = session ? `${conn.config.provider || session.provider}${model ? ` · ${model}` : ""}` : "–";
  const t = conn.totals;
  ui.tokens.textContent = `${t.input.toLocaleString()} in / ${t.output.toLocaleString()} out${t.cost ? ` · ${fmtCost(t.cost)}` : ""}`;
  ui.sbRtt.textContent = conn.rtt === null ? "–" : fmtMs(conn.rtt);
  updateControls();
}

function updateControls() {
  const online = conn.state === "connected";
  ui.connect.disabled = conn.wanted;
  ui.disconnect.disabled = !conn.wanted;
  ui.send.disabled = !online || conn.turnRunning || conn.awaitingEcho;
  ui.cancel.disabled = !online || !conn.turnRunning;
  ui.mic.disabled = !online && !voice.micOn;
  ui.mic.setAttribute("aria-pressed", String(voice.micOn));
  ui.mic.classList.toggle("on", voice.micOn);
  ui.speaker.disabled = !online;
  ui.speaker.setAttribute("aria-pressed", String(voice.speaker));
  ui.speaker.classList.toggle("on", voice.speaker);
  ui.voiceBar.hidden = !voice.micOn;
  ui.commit.hidden = !(voice.micOn && conn.config.input_audio?.turn_detection === "none");
  ui.exportButton.disabled = !conn.events.length;
  ui.copySession.disabled = !conn.sessionId;
  const api = apiBase();
  ui.deleteButton.disabled = !api || !conn.sessionId;
  ui.deleteHint.textContent = api
    ? `Deletes it on every node through the HTTP API (${api}); its clients are closed with 4404.`
    : "Delete needs the node's HTTP API.";
  ui.loadRecording.disabled = !api || !conn.sessionId;
  if (recording.sid && recording.sid !== conn.sessionId) {
    Object.assign(recording, { sid: null, text: "", note: "" }); // another session now
    ui.recordingTimeline.replaceChildren();
    ui.downloadRecording.disabled = true;
  }
  ui.recordingHint.textContent =
    recording.note ||
    (api
      ? "What crossed every wire of this session, if it is recorded (configure record, a key policy, or serve --record)."
      : "The recording is read through the node's HTTP API.");
  ui.app.classList.toggle("running", conn.turnRunning);
}

function autosize() {
  ui.message.style.height = "auto";
  ui.message.style.height = `${Math.min(ui.message.scrollHeight, 200)}px`;
}

// ------------------------------------------------------------------ session controls

function apiBase() {
  // The HTTP API is served on the page's own port (and origin).
  return location.origin;
}

let deleteArmed = null;

async function deleteSession() {
  const api = apiBase();
  const sid = conn.sessionId;
  if (!api || !sid) return;
  if (!deleteArmed) {
    ui.deleteButton.querySelector("span").textContent = "Click again to delete";
    deleteArmed = setTimeout(() => {
      deleteArmed = null;
      ui.deleteButton.querySelector("span").textContent = "Delete";
    }, 4000);
    return;
  }
  clearTimeout(deleteArmed);
  deleteArmed = null;
  ui.deleteButton.querySelector("span").textContent = "Delete";
  const token = ui.token.value.trim();
  let response;
  try {
    response = await fetch(`${api}/v1/sessions/${encodeURIComponent(sid)}`, {
      method: "DELETE",
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
  } catch {
    conversation.note(
      `The browser could not call ${api}: the HTTP API answers pages of --allowed-origins only (add ${location.origin}).`,
      "bad",
    );
    return;
  }
  if (response.status === 204) {
    toast("Session deleted");
    disconnect();
    forgetSession();
    conversation.note(`Session ${sid} was deleted on every node.`);
    return;
  }
  let message = `HTTP ${response.status}`;
  try {
    message = (await response.json()).error?.message ?? message;
  } catch {
    // not JSON
  }
  conversation.note(`Delete refused: ${message}`, "bad");
}

async function showRecording() {
  const api = apiBase();
  const sid = conn.sessionId;
  if (!api || !sid) return;
  ui.loadRecording.disabled = true;
  ui.recordingHint.textContent = "Reading the recording…";
  try {
    const { text, truncated } = await fetchRecording(api, sid, ui.token.value.trim());
    const records = parseRecording(text);
    renderTimeline(ui.recordingTimeline, timelineRows(records));
    const note =
      `${records.length} records` +
      (truncated ? " (the first 16 MB: download it through the API for the rest)" : "") +
      " (what happened in the last second is still being written: show it again to see it)." +
      " Replay it with: gateway replay FILE --url ws://…";
    Object.assign(recording, { sid, text, note });
    ui.downloadRecording.disabled = false;
  } catch (exc) {
    const note =
      exc instanceof TypeError
        ? `The browser could not call ${api}: the HTTP API answers pages of --allowed-origins only (add ${location.origin}).`
        : `No recording: ${exc.message}`;
    Object.assign(recording, { sid, text: "", note });
    ui.recordingTimeline.replaceChildren();
    ui.downloadRecording.disabled = true;
  } finally {
    ui.loadRecording.disabled = false;
    ui.recordingHint.textContent = recording.note;
  }
}

function exportTranscript() {
  download(`rtgw-session-${conn.sessionId ?? "none"}.json`, {
    session_id: conn.sessionId,
    node: conn.session?.node,
    provider: conn.session?.provider,
    config: conn.config,
    exported_at: new Date().toISOString(),
    events: conn.events,
  });
}

async function loadOffer() {
  try {
    const r = await fetch("/node.json", { cache: "no-store" });
    if (!r.ok) return;
    offer = await r.json();
  } catch {
    return;
  }
  settings.setOffer(offer);
  ui.tokenHint.textContent = offer.auth ? "(required by this node)" : "(not needed: this node runs open)";
  updateStatus();
}

async function pingLoop() {
  for (;;) {
    await new Promise((r) => setTimeout(r, conn.rtt === null ? 1000 : PING_EVERY));
    const client = conn.client;
    if (!client || conn.state !== "connected") continue;
    try {
      conn.rtt = await Promise.race([client.ping(), new Promise((_, no) => setTimeout(no, 10000))]);
      updateStatus();
    } catch {
      // the connection is being replaced: the next round asks again
    }
  }
}

// ------------------------------------------------------------------ wiring

ui.connectForm.addEventListener("submit", (e) => {
  e.preventDefault();
  if (conn.wanted) return;
  sessionStorage.setItem(KEY_TOKEN, ui.token.value.trim());
  connect();
});
ui.disconnect.addEventListener("click", disconnect);
ui.newSession.addEventListener("click", newSession);
ui.newSession2.addEventListener("click", newSession);
ui.copySession.addEventListener("click", async () => {
  if (conn.sessionId) toast((await copyText(conn.sessionId)) ? "Session id copied" : "Copy failed");
});
ui.exportButton.addEventListener("click", exportTranscript);
ui.loadRecording.addEventListener("click", showRecording);
ui.downloadRecording.addEventListener("click", () =>
  downloadRecording(`rtgw-recording-${recording.sid}.jsonl`, recording.text),
);
ui.deleteButton.addEventListener("click", () => deleteSession());
ui.resumeForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const id = ui.resumeId.value.trim();
  if (id) resume(id);
});

ui.messageForm.addEventListener("submit", (e) => {
  e.preventDefault();
  submitMessage();
});
ui.message.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    submitMessage();
  }
});
ui.message.addEventListener("input", autosize);
ui.cancel.addEventListener("click", () => conn.client?.cancel().catch(() => {}));
ui.mic.addEventListener("click", () => {
  toggleMic().catch((err) => conversation.note(`Microphone: ${err?.message ?? err}`, "bad"));
});
ui.speaker.addEventListener("click", () => toggleSpeaker());
ui.commit.addEventListener("click", () => conn.client?.commit().catch(() => {}));

document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && conn.turnRunning) {
    conn.client?.cancel().catch(() => {});
  } else if (e.altKey && e.key.toLowerCase() === "n") {
    e.preventDefault();
    newSession();
  }
});

const tabs = [...document.querySelectorAll('[role="tab"]')];
for (const tab of tabs) {
  tab.addEventListener("click", () => setView(tab.dataset.view));
  tab.addEventListener("keydown", (e) => {
    const visible = tabs.filter((t) => t.offsetParent !== null);
    const i = visible.indexOf(tab);
    const next = e.key === "ArrowRight" ? visible[(i + 1) % visible.length] : e.key === "ArrowLeft" ? visible[(i - 1 + visible.length) % visible.length] : null;
    if (next) {
      e.preventDefault();
      setView(next.dataset.view);
      next.focus();
    }
  });
}
matchMedia("(min-width: 960px)").addEventListener("change", () => setView(isWide() && ui.app.dataset.view !== "chat" ? ui.app.dataset.view : ui.app.dataset.view));

ui.gatewayUrl.textContent = socketUrl();
ui.token.value = sessionStorage.getItem(KEY_TOKEN) || "";
resetView();
setView(sessionStorage.getItem(KEY_VIEW) || "chat");
const offered = loadOffer();
pingLoop();
// Connect on load: a node that needs no key just works; one that does says
// "API key required" once and waits for the key. A reload resumes the tab's
// session, replaying it from the start into the empty view (through the OpenAI
// door: a new session, on a model the node's offer names).
if (settings.door.checked) offered.then(connect);
else connect();

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
    return voice.micOn;
  },
  get framesSent() {
    return voice.framesSent;
  },
  get chunksPlayed() {
    return voice.chunksPlayed;
  },
  get played() {
    return voice.lastPlayed;
  },
  get answerMs() {
    return voice.answerMs; // of the current answer's audio scheduled to play
  },
  get playing() {
    return voice.chunks.length > 0;
  },
  get frames() {
    return inspector.frames.length;
  },
  drop() {
    conn.client?.dropConnection();
  },
});
