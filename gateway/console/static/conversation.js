// The conversation pane: turns as they stream, from the events the client delivers.
//
// Every logged event arrives once, in order (the client resumes and drops
// duplicates), so this only renders. A turn is an <article>: the user's
// message, then per model step its think (dimmed, collapsible), tool calls
// with their results, and the answer, streaming with a visible caret until
// the turn's end; a footer gives its tokens, cost and latency. An interrupt
// removes exactly the nodes of the step it cut (the step is rerun).
//
// A call that waits for approval (`approval_required`) shows its exact
// arguments with Allow / Deny in its card; the decision is sent with the
// event's digest, and the logged `approval` settles the card. A background
// call (`"background": true`) shows "running in the background" while the
// answer goes on; its `result` (matched by the call's id) comes later, maybe
// turns later, and fills its card then.
import { fmtCost, fmtMs, h, icon } from "/static/dom.js";
import { markdown } from "/static/markdown.js";

const ARGS_CHARS = 400; // tool args longer than this are cut in the card
const RESULT_CHARS = 20000; // an expanded tool result shows at most this much

/** How a `context` message's role is shown. */
const CONTEXT_WHO = { system: "Instructions", user: "You", assistant: "Model" };

export class Conversation {
  /**
   * root: the scrolling log element. hooks: {suggest(text), mic(), answerTool(id, status,
   * content), approve(id, digest, decision) → Promise}.
   */
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks;
    this.provider = "";
    this.reset();
  }

  reset() {
    this.turn = null; // the article events of the running (or last) turn go to
    this.pending = null; // a spoken turn being heard: its article, before its user event
    this.step = []; // nodes of the model step in progress (an interrupt removes them)
    this.kind = "";
    this.text = null;
    this.respond = null;
    this.think = null;
    this.calls = []; // call cards of the step waiting for their result, in call order
    this.callsById = new Map();
    this.stats = null;
    this.speechStoppedAt = null;
    this.running = false;
    this.root.replaceChildren(this.emptyState());
  }

  // ------------------------------------------------------------------ empty state

  emptyState() {
    const sim = this.provider === "sim" || this.provider === "";
    const tries = [
      ["hello", "Say hello", "A short think, then the answer streams."],
      ['/tool list {"path": "."}', "Call a tool", "The model lists its workspace: call, result, answer."],
      ['/tool confirm {"question": "Ship the release?"}', "Ask for a confirmation", "A client tool this page answers with Yes or No."],
    ];
    if (sim) {
      tries.push(["/long 6", "Stream a long answer", "Markdown, chunk by chunk: scroll while it streams."]);
      tries.push(["/help", "List the simulator's scripts", "/tool, /raw, /instructions, /error…"]);
    }
    const cards = tries.map(([text, title, detail]) =>
      h(
        "button",
        { type: "button", class: "try", onclick: () => this.hooks.suggest(text), "data-send": text },
        h("span", { class: "try-title" }, title),
        h("code", { class: "try-code" }, text),
        h("span", { class: "try-detail" }, detail),
      ),
    );
    cards.push(
      h(
        "button",
        { type: "button", class: "try try-mic", onclick: () => this.hooks.mic() },
        h("span", { class: "try-title" }, icon("mic"), " Talk with the microphone"),
        h("span", { class: "try-detail" }, "The gateway hears you, transcribes and answers; the meter shows your level."),
      ),
    );
    return h(
      "div",
      { class: "empty welcome" },
      h("div", { class: "empty-mark" }, icon("spark")),
      h("h2", null, "Start a conversation"),
      h(
        "p",
        null,
        "Type below and press Enter, or try one of these. Every frame on the wire shows in the ",
        h("strong", null, "Events"),
        " inspector; ",
        h("strong", null, "Settings"),
        " change instructions, model, tools and voice.",
      ),
      h("div", { class: "tries" }, cards),
    );
  }

  /** The node needs a key: ask for it where the conversation will be (submit(key)). */
  askKey(submit, refused = "") {
    this.root.querySelector(".key-card")?.remove();
    const input = h("input", { type: "password", autocomplete: "off", spellcheck: "false", "aria-label": "Key for this gateway", placeholder: "rtgw_… or a client token" });
    const card = h(
      "form",
      { class: "key-card", onsubmit: (e) => { e.preventDefault(); if (input.value.trim()) submit(input.value.trim()); } },
      h("div", { class: "key-mark" }, icon("plug")),
      h("h2", null, "This gateway needs an API key"),
      h("p", null, "Paste an API key, or a client token from your app's backend. It stays in this tab."),
      refused ? h("p", { class: "key-refused", role: "alert" }, refused) : null,
      h("div", { class: "key-row" }, input, h("button", { type: "submit", class: "primary" }, "Connect")),
    );
    const empty = this.root.querySelector(".empty");
    if (empty) empty.replaceWith(card);
    else this.root.prepend(card);
    input.focus();
    return card;
  }

  keyAccepted() {
    const card = this.root.querySelector(".key-card");
    if (card) card.replaceWith(this.emptyState());
  }

  setProvider(provider) {
    this.provider = provider;
    const empty = this.root.querySelector(".empty");
    if (empty) empty.replaceWith(this.emptyState());
  }

  // ------------------------------------------------------------------ events

  /** One delivered event: logged (from the session's log) or an unlogged reply. */
  render(ev, logged) {
    if (!logged) {
      if (ev.type === "error") this.note(`Not sent — ${ev.code}: ${ev.content}`, "reply");
      return;
    }
    switch (ev.type) {
      case "user":
      case "reply":
        this.startTurn(ev);
        break;
      case "think":
      case "respond":
        this.firstToken(ev);
        this.appendText(ev.type, ev.content);
        break;
      case "call":
        this.firstToken(ev);
        this.addCall(ev);
        break;
      case "execute":
        for (const card of this.calls) card.classList.add("running");
        this.kind = "";
        break;
      case "result":
        this.addResult(ev);
        break;
      case "end":
        this.finishTurn("", ev.timestamp);
        break;
      case "cancelled":
        this.finishTurn(this.cancelNote(ev), ev.timestamp);
        break;
      case "interrupt":
        this.discardStep();
        this.add(this.marker("interrupt", `Interrupted — ${ev.content || "the step is rerun"}`));
        break;
      case "error":
        this.addError(ev);
        break;
      case "speech_started":
        this.hearing("Listening…");
        break;
      case "speech_stopped":
        this.speechStoppedAt = ev.timestamp;
        this.hearing("Transcribing…");
        break;
      case "configured":
        this.configured(ev);
        break;
      case "metric":
        this.turnMetric(ev);
        break;
      case "approval_required":
        this.approval(ev);
        break;
      case "approval":
        this.approved(ev);
        break;
      case "guardrail":
        this.guardrail(ev);
        break;
      case "context": // a message added without a turn (the app's instructions, history)
        this.note(`${CONTEXT_WHO[ev.role] ?? ev.role} (added): ${ev.content}`, "context");
        break;
      default:
        break; // types a newer gateway may add
    }
  }

  // ------------------------------------------------------------------ turns

  startTurn(ev) {
    this.root.querySelector(".empty")?.remove();
    this.root.querySelector(".key-card")?.remove();
    const spoken = ev.source === "audio";
    let article = spoken ? this.pending : null;
    this.pending = null;
    if (!article) {
      article = h("article", { class: "turn", "aria-label": "Turn" });
      this.root.append(article);
    }
    article.classList.remove("pending");
    if (ev.type === "user") { // a reply's turn has no message of the user's
      const bubble = article.querySelector(".user") ?? article.appendChild(h("div", { class: "user" }));
      bubble.className = spoken ? "user spoken" : "user";
      bubble.replaceChildren(
        h("span", { class: "who" }, spoken ? [icon("mic"), " You said"] : "You"),
        h("p", { class: "user-text" }, ev.content),
      );
    }
    const footer = h("footer", { class: "turn-stats" });
    article.append(footer);
    this.turn = article;
    this.stats = {
      start: ev.timestamp,
      from: spoken ? this.speechStoppedAt : ev.timestamp,
      spoken,
      ttft: null,
      input: 0,
      output: 0,
      cost: 0,
      estimated: false,
      end: null,
      node: footer,
    };
    this.speechStoppedAt = null;
    this.boundary();
    this.setRunning(true);
    this.showStats();
    this.scroll(true);
  }

  /** A spoken turn being heard: its own article at the end, never inside the last turn. */
  hearing(text) {
    this.root.querySelector(".empty")?.remove();
    if (!this.pending) {
      this.pending = h(
        "article",
        { class: "turn pending", "aria-label": "Turn being heard" },
        h("div", { class: "user spoken voice-pending" }),
      );
      this.root.append(this.pending);
    }
    const bubble = this.pending.querySelector(".user");
    bubble.replaceChildren(
      h("span", { class: "who" }, icon("mic"), " You"),
      h("p", { class: "user-text hearing" }, h("span", { class: "pulse", "aria-hidden": "true" }), text),
    );
    this.scroll(true);
  }

  finishTurn(note, at) {
    this.renderMarkdown();
    this.settleQuestions();
    this.collapseThink();
    if (note) this.add(this.marker("cancelled", note));
    if (this.stats) this.stats.end = at;
    this.kind = "";
    this.setRunning(false);
    this.showStats();
  }

  cancelNote(ev) {
    if (ev.reason !== "barge_in") return ev.content === "stopped by a guardrail" ? "Stopped by a guardrail." : "Cancelled.";
    const heard = typeof ev.heard_ms === "number" ? ` (you had heard ${fmtMs(ev.heard_ms)} of it)` : "";
    return `Cancelled: you spoke over the answer${heard}.`;
  }

  setRunning(running) {
    this.running = running;
    if (this.turn) {
      this.turn.classList.toggle("streaming", running);
      this.turn.setAttribute("aria-busy", String(running));
    }
    if (!running) this.respond?.classList.remove("live");
    this.hooks.running?.(running);
  }

  firstToken(ev) {
    const stats = this.stats;
    if (!stats || stats.ttft !== null) return;
    if (stats.from !== null) stats.ttft = Math.max(0, (ev.timestamp - stats.from) * 1000);
    else stats.ttft = -1; // a spoken turn without speech_stopped (commit): no reference point
    this.showStats();
  }

  turnMetric(ev) {
    const stats = this.stats;
    if (!stats) return;
    stats.input += ev.step.input;
    stats.output += ev.step.output;
    stats.cost += ev.cost?.step ?? 0;
    stats.estimated ||= Boolean(ev.estimated);
    this.showStats();
  }

  showStats() {
    const stats = this.stats;
    if (!stats) return;
    const parts = [];
    if (this.running) {
      parts.push(h("span", { class: "live-badge" }, h("span", { class: "pulse", "aria-hidden": "true" }), "streaming"));
    }
    const tokens = stats.input || stats.output ? `${stats.input.toLocaleString()} in · ${stats.output.toLocaleString()} out` : "";
    if (tokens) parts.push(h("span", { title: "tokens this turn" }, icon("tokens"), tokens + (stats.estimated ? " (est.)" : "")));
    if (stats.cost) parts.push(h("span", { title: "cost this turn" }, fmtCost(stats.cost)));
    if (stats.ttft !== null && stats.ttft >= 0) {
      const label = stats.spoken ? "after you stopped" : "to first token";
      parts.push(h("span", { title: stats.spoken ? "from the end of your speech to the first token" : "from your message to the first token" }, icon("clock"), `${fmtMs(stats.ttft)} ${label}`));
    }
    if (!this.running && stats.end > stats.start) {
      parts.push(h("span", { title: "the whole turn, from your message to its end" }, `turn ${fmtMs((stats.end - stats.start) * 1000)}`));
    }
    stats.node.replaceChildren(...parts);
  }

  // ------------------------------------------------------------------ model output

  add(node, { partOfStep = false } = {}) {
    const turn = this.turn ?? this.root.appendChild(h("article", { class: "turn" }));
    this.turn = turn;
    const footer = turn.querySelector(":scope > .turn-stats");
    const stick = this.atBottom();
    turn.insertBefore(node, footer);
    if (partOfStep) this.step.push(node);
    this.scroll(stick);
    return node;
  }

  boundary() {
    this.step = [];
    this.kind = "";
    this.calls = [];
  }

  appendText(kind, chunk) {
    if (this.kind !== kind) {
      this.kind = kind;
      this.text = document.createTextNode("");
      if (kind === "think") {
        const block = h(
          "details",
          { class: "think", open: true },
          h("summary", null, icon("bulb"), h("span", { class: "think-label" }, "Thinking")),
          h("div", { class: "text" }),
        );
        block.lastChild.append(this.text);
        this.think = block;
        this.add(block, { partOfStep: true });
      } else {
        this.collapseThink();
        const block = h("div", { class: "respond live", "aria-live": "off" });
        block.append(this.text);
        this.respond = block;
        this.add(block, { partOfStep: true });
      }
    }
    const stick = this.atBottom();
    this.text.appendData(chunk); // one growing text node: no O(n²) re-render
    this.scroll(stick);
    if (kind === "respond") this.hooks.streamed?.(chunk);
  }

  /** Thought is kept but folded once the answer starts (a click opens it). */
  collapseThink() {
    const think = this.think;
    if (!think || !think.isConnected) return;
    think.open = false;
    const words = think.textContent.trim().split(/\s+/).filter(Boolean).length;
    think.querySelector(".think-label").textContent = `Thought · ${words} word${words === 1 ? "" : "s"}`;
    this.think = null;
  }

  addCall(ev) {
    let name = "?";
    let args = ev.content;
    let parsed = null;
    try {
      parsed = JSON.parse(ev.content);
      name = String(parsed.name);
      args = JSON.stringify(parsed.args ?? {});
    } catch {
      // shown raw
    }
    this.kind = "";
    this.collapseThink();
    const onClient = ev.runs_on === "client";
    const background = ev.background === true;
    const classes = ["call", onClient ? "client-call" : "", background ? "background running" : ""];
    const card = h(
      "div",
      { class: classes.join(" ").trim(), dataset: { callId: ev.id ?? "", ts: ev.timestamp } },
      h(
        "div",
        { class: "call-head" },
        icon("tool"),
        h("span", { class: "call-kind" }, onClient ? "Client tool" : "Tool"),
        h("code", { class: "tool-name" }, name),
        h("span", { class: `badge ${onClient ? "badge-client" : ""}`, title: onClient ? "this page answers it" : "the gateway runs it" }, onClient ? "runs here" : "gateway"),
        background ? h("span", { class: "badge badge-background", title: "the answer goes on; the result comes when the call is done" }, "background") : null,
        h("span", { class: "call-state", "aria-live": "polite" }, ""),
      ),
      h("code", { class: "tool-args" }, args.length > ARGS_CHARS ? `${args.slice(0, ARGS_CHARS)}… (${args.length - ARGS_CHARS} more characters)` : args),
      h("div", { class: "approval-slot" }),
    );
    if (onClient && name === "confirm" && parsed) card.append(this.confirmQuestion(ev.id, parsed.args ?? {}));
    else if (onClient && !this.hooks.handles?.(name)) card.append(this.manualAnswer(ev.id, name));
    if (!background) this.calls.push(card); // a background call's result comes on its own
    if (ev.id) this.callsById.set(ev.id, card);
    this.add(card, { partOfStep: true });
  }

  /** The page's confirm tool: the question with Yes/No; the answer is the call's result. */
  confirmQuestion(id, args) {
    const box = h("div", { class: "question", dataset: { callId: id } }, h("span", { class: "question-text" }, String(args.question ?? "")));
    for (const [label, value] of [["Yes", true], ["No", false]]) {
      box.append(
        h("button", {
          type: "button",
          class: `answer ${value ? "primary" : ""}`,
          onclick: () => {
            this.settleQuestion(box, label);
            this.hooks.answerTool(id, "success", value);
          },
        }, label),
      );
    }
    return box;
  }

  /** A client tool this page has no handler for: answer it by hand, as JSON. */
  manualAnswer(id, name) {
    const input = h("textarea", { class: "manual-input", rows: "2", "aria-label": `Result for ${name}`, placeholder: '"any JSON value, e.g. {\\"ok\\": true}"' });
    const box = h("div", { class: "question manual", dataset: { callId: id } });
    const send = (status) => {
      let content = input.value.trim();
      try {
        content = content ? JSON.parse(content) : null;
      } catch {
        // sent as text
      }
      this.settleQuestion(box, status);
      this.hooks.answerTool(id, status, content);
    };
    box.append(
      h("span", { class: "question-text" }, `Answer ${name} yourself:`),
      input,
      h("button", { type: "button", class: "answer primary", onclick: () => send("success") }, "Send result"),
      h("button", { type: "button", class: "answer", onclick: () => send("failure") }, "Fail it"),
    );
    return box;
  }

  settleQuestion(box, answer) {
    for (const control of box.querySelectorAll("button, textarea")) control.disabled = true;
    if (answer) box.append(h("span", { class: "question-answer" }, `you answered ${answer}`));
    box.classList.add("settled");
  }

  settleQuestions() {
    for (const box of this.root.querySelectorAll(".question:not(.settled)")) this.settleQuestion(box, "");
  }

  addResult(ev) {
    this.settleQuestions();
    let items;
    try {
      items = JSON.parse(ev.content);
    } catch {
      items = [{ tool: "?", status: "failure", content: ev.content }];
    }
    const own = ev.id ? this.callsById.get(ev.id) : null; // one call's outcome (the journal)
    const cards = own && items.length === 1 ? [own] : this.calls.length === items.length ? this.calls : [];
    const loose = h("div", { class: "result", dataset: { ts: ev.timestamp } });
    items.forEach((item, i) => {
      const status = item.status === "success" ? "success" : "failure";
      const raw = typeof item.content === "string" ? item.content : JSON.stringify(item.content, null, 2);
      const text = raw ?? "";
      const preview = text.replace(/\s+/g, " ");
      const row = h(
        "details",
        { class: `tool-item ${status}` },
        h(
          "summary",
          null,
          h("span", { class: "tool-label" }, "Result"),
          h("span", { class: "tool-name" }, String(item.tool)),
          h("span", { class: `tool-status ${status}` }, status),
          h("span", { class: "tool-preview" }, preview.length > 90 ? `${preview.slice(0, 90)}…` : preview),
        ),
        h("pre", { class: "tool-output" }, text.length > RESULT_CHARS ? `${text.slice(0, RESULT_CHARS)}… (${text.length - RESULT_CHARS} more characters)` : text),
      );
      const card = cards[i];
      if (card) {
        card.classList.remove("running", "waiting");
        card.classList.add(status);
        card.querySelector(".call-state").textContent = status === "success" ? "done" : "failed";
        card.append(row);
      } else {
        loose.append(row);
      }
    });
    if (loose.childElementCount) this.add(loose);
    if (own) this.calls = this.calls.filter((c) => c !== own);
    if (own?.classList.contains("background")) return; // not a step of the running turn
    this.boundary(); // the next step starts after the results
  }

  renderMarkdown() {
    const block = this.respond;
    this.respond = null;
    if (!block || !block.isConnected) return;
    block.classList.remove("live");
    const rendered = markdown(block.textContent);
    if (rendered.textContent.replace(/\s/g, "") === "") return;
    block.replaceChildren(...rendered.childNodes);
  }

  discardStep() {
    for (const node of this.step) node.remove();
    this.respond = null;
    this.think = null;
    this.boundary();
  }

  addError(ev) {
    const node = h(
      "div",
      { class: "error", role: "alert", dataset: { ts: ev.timestamp } },
      icon("alert"),
      h("span", { class: "error-code" }, ev.code || "internal"),
      h("span", { class: "error-text" }, ev.content),
    );
    this.add(node);
  }

  configured(ev) {
    // A configuration change is shown where it happened, small: it applies from the next step.
    const parts = Object.keys(ev.config ?? {}).filter((k) => k !== "tools" || (ev.config.tools ?? []).length);
    const what = parts.length ? parts.join(", ") : "defaults";
    const node = this.marker("config", `Configuration: ${what}`);
    if (this.turn && this.running) this.add(node);
    else if (this.root.querySelector(".turn")) this.root.append(node);
  }

  /** A guardrail rule tripped: what it did, never what it matched. */
  guardrail(ev) {
    const rule = `Guardrail “${ev.rule}”`;
    if (ev.on === "input") {
      // Logged before the message's turn starts (or instead of it): between turns.
      const text =
        ev.action === "redact"
          ? `${rule}: part of your message was redacted before the model saw it.`
          : `${rule}: your message was blocked; it never reached the model.`;
      this.note(text, "guardrail");
      return;
    }
    const did = ev.action === "redact" ? "part of the answer was redacted" : "the rest of the answer was withheld";
    this.add(this.marker("guardrail", `${rule}: ${did}.`));
  }

  marker(kind, text) {
    return h("p", { class: `marker ${kind}` }, text);
  }

  /** An unlogged note between turns (a refused frame, a connection problem). */
  note(text, kind = "") {
    this.root.querySelector(".empty")?.remove();
    const stick = this.atBottom();
    const node = h("p", { class: `marker note ${kind}`, role: kind === "bad" ? "alert" : null }, text);
    this.root.append(node);
    this.scroll(stick);
    return node;
  }

  /**
   * A call waits for the user's decision: its exact arguments (all of them, as
   * the digest covers them) with Allow / Deny. A card the page did not render
   * (a session resumed past its call) gets a card of its own.
   */
  approval(ev) {
    let card = this.callsById.get(ev.id);
    if (!card) {
      card = h("div", { class: "call", dataset: { callId: ev.id, ts: ev.timestamp } },
        h("div", { class: "call-head" }, icon("tool"), h("span", { class: "call-kind" }, "Tool"), h("code", { class: "tool-name" }, ev.name),
          h("span", { class: "call-state", "aria-live": "polite" }, "")),
        h("div", { class: "approval-slot" }));
      this.callsById.set(ev.id, card);
      this.add(card);
    }
    card.classList.add("waiting");
    card.querySelector(".call-state").textContent = "waiting for your approval";
    const slot = card.querySelector(".approval-slot");
    const args = JSON.stringify(ev.args ?? {}, null, 2);
    const box = h(
      "div",
      { class: "question approval", role: "group", "aria-label": `Approve ${ev.name}`, dataset: { callId: ev.id, digest: ev.digest } },
      h("span", { class: "question-text" }, `Allow ${ev.name} with exactly these arguments?`),
      h("pre", { class: "approval-args" }, args),
    );
    const buttons = [["Allow", "allow"], ["Deny", "deny"]].map(([label, decision]) =>
      h("button", { type: "button", class: `answer ${decision === "allow" ? "primary" : "danger"}`, onclick: () => decide(decision) }, label),
    );
    const decide = async (decision) => {
      for (const b of buttons) b.disabled = true;
      try {
        await this.hooks.approve(ev.id, ev.digest, decision);
      } catch {
        // Refused (shown as a note) or not connected: the call still waits, so may the user.
        if (!box.classList.contains("settled")) for (const b of buttons) b.disabled = false;
      }
    };
    box.append(...buttons);
    slot.replaceChildren(box);
  }

  /** The logged decision on a call: its approval box says what was decided, and by whom. */
  approved(ev) {
    const card = this.callsById.get(ev.id);
    const box = card?.querySelector(".question.approval");
    if (!card || !box || box.classList.contains("settled")) return;
    card.classList.remove("waiting");
    card.querySelector(".call-state").textContent = "";
    if (ev.decision === "allow") card.classList.add("running");
    const what = ev.reason === "timeout" ? "denied: nobody decided in time" : ev.decision === "allow" ? "allowed" : "denied";
    this.settleQuestion(box, "");
    box.append(h("span", { class: "question-answer" }, what));
    box.dataset.decision = ev.decision;
  }

  // ------------------------------------------------------------------ scrolling

  atBottom() {
    const r = this.root;
    return r.scrollHeight - r.scrollTop - r.clientHeight < 80;
  }

  /** Follow the stream only while the reader is at the bottom. */
  scroll(stick) {
    if (stick) this.root.scrollTop = this.root.scrollHeight;
  }
}
