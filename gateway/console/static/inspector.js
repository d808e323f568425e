// The event inspector: every frame on the wire, both ways, with its seq and time.
//
// Frames come from the client's onFrame hook: the JSON ones parsed, binary
// audio as a size (runs of audio frames are one row that counts them, or a
// microphone's 50 frames a second would bury everything else; a run ends at a
// JSON frame the same way, or after AUDIO_RUN_MS). Rows are added
// once per animation frame; the list keeps the newest MAX_ROWS in the DOM and
// every frame (up to MAX_FRAMES) in memory for copy and download.
import { copyText, download, fmtBytes, fmtClock, fmtCount, h, icon, toast } from "/static/dom.js";

const MAX_ROWS = 1500;
const MAX_FRAMES = 50000;
const PREVIEW_CHARS = 120;
const AUDIO_RUN_MS = 5000;

export class Inspector {
  constructor(root, { session }) {
    this.root = root;
    this.session = session; // () => {session_id, node, provider}
    this.frames = [];
    this.dropped = 0;
    this.types = new Map(); // type → count
    this.queue = []; // frames not rendered yet
    this.paused = false;
    this.pausedNew = 0;
    this.scheduled = false;
    this.audioRuns = { in: null, out: null }; // the rows counting the current runs of audio
    this.build();
  }

  build() {
    this.typeSelect = h("select", { "aria-label": "Filter by type", onchange: () => this.refilter() }, h("option", { value: "" }, "All types"));
    this.dirSelect = h(
      "select",
      { "aria-label": "Filter by direction", onchange: () => this.refilter() },
      h("option", { value: "" }, "Both ways"),
      h("option", { value: "in" }, "↓ received"),
      h("option", { value: "out" }, "↑ sent"),
    );
    this.search = h("input", { type: "search", placeholder: "Search frames", "aria-label": "Search frames", oninput: () => this.refilter() });
    this.pauseButton = h("button", { type: "button", class: "tool-button", "aria-pressed": "false", onclick: () => this.togglePause() }, icon("pause"), h("span", null, "Pause"));
    const copyButton = h("button", { type: "button", class: "tool-button", onclick: () => this.copy(), title: "Copy the frames shown, as JSON" }, icon("copy"), h("span", null, "Copy"));
    const downloadButton = h("button", { type: "button", class: "tool-button", onclick: () => this.download(), title: "Download every frame of this session as JSON" }, icon("download"), h("span", null, "Download"));
    const clearButton = h("button", { type: "button", class: "tool-button icon-only", onclick: () => this.clear(), title: "Clear the list", "aria-label": "Clear the list" }, icon("trash"));
    this.count = h("span", { class: "inspector-count", "aria-live": "polite" }, "no frames yet");
    this.list = h("ol", { class: "frames", "aria-label": "Frames on the wire" });
    this.emptyHint = h(
      "div",
      { class: "frames-empty" },
      h("p", null, "Every frame on the WebSocket shows here: ↑ what this page sends, ↓ what the gateway sends back, with its seq and time."),
      h("p", null, "Click a row for its JSON."),
    );
    this.root.replaceChildren(
      h("div", { class: "inspector-bar" }, h("div", { class: "filters" }, this.typeSelect, this.dirSelect, this.search), h("div", { class: "actions" }, this.pauseButton, copyButton, downloadButton, clearButton)),
      h("div", { class: "inspector-sub" }, this.count, h("span", { class: "legend" }, h("span", { class: "dir in" }, "↓"), " in ", h("span", { class: "dir out" }, "↑"), " out")),
      h("div", { class: "frames-scroll" }, this.emptyHint, this.list),
    );
    this.scroller = this.root.querySelector(".frames-scroll");
  }

  /** A frame from the client's onFrame hook. */
  add(frame) {
    const now = Date.now();
    if (frame.binary) {
      const run = this.audioRuns[frame.dir];
      if (run && now - run.t < AUDIO_RUN_MS && now - run.last < 1500) {
        run.count += 1;
        run.bytes += frame.bytes;
        run.last = now;
        if (frame.seq !== undefined) run.seq = frame.seq;
        this.updateAudioRow(run);
        return;
      }
      const entry = { n: this.frames.length + this.dropped + 1, dir: frame.dir, t: now, last: now, type: "audio", binary: true, count: 1, bytes: frame.bytes, seq: frame.seq };
      this.audioRuns[frame.dir] = entry;
      this.push(entry);
      return;
    }
    this.audioRuns[frame.dir] = null;
    const data = frame.data ?? {};
    const entry = {
      n: this.frames.length + this.dropped + 1,
      dir: frame.dir,
      t: now,
      type: String(data.type ?? "?"),
      seq: typeof data.seq === "number" ? data.seq : undefined,
      seqFrom: data.seq_from,
      bytes: frame.bytes,
      verdict: frame.verdict,
      data,
    };
    this.push(entry);
  }

  push(entry) {
    this.frames.push(entry);
    if (this.frames.length > MAX_FRAMES) {
      this.frames.shift();
      this.dropped += 1;
    }
    const seen = this.types.get(entry.type) ?? 0;
    this.types.set(entry.type, seen + 1);
    if (!seen) this.addTypeOption(entry.type);
    if (this.paused) {
      this.pausedNew += 1;
      this.updateCount();
      return;
    }
    this.queue.push(entry);
    this.schedule();
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  flush() {
    if (!this.queue.length) return;
    const stick = this.scroller.scrollHeight - this.scroller.scrollTop - this.scroller.clientHeight < 40;
    const fragment = document.createDocumentFragment();
    for (const entry of this.queue.splice(0)) {
      if (this.matches(entry)) fragment.append(this.row(entry));
    }
    this.list.append(fragment);
    while (this.list.childElementCount > MAX_ROWS) this.list.firstElementChild.remove();
    this.emptyHint.hidden = this.frames.length > 0;
    this.updateCount();
    if (stick) this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  row(entry) {
    const summary = h(
      "summary",
      null,
      h("span", { class: `dir ${entry.dir}`, title: entry.dir === "in" ? "received" : "sent" }, entry.dir === "in" ? "↓" : "↑"),
      h("span", { class: "f-time", title: new Date(entry.t).toISOString() }, fmtClock(entry.t / 1000)),
      h("span", { class: "f-seq", title: entry.verdict && entry.verdict !== "new" ? `seq ${entry.verdict}` : "seq" }, this.seqText(entry)),
      h("span", { class: `f-type t-${entry.type.replace(/[^a-z_]/g, "")}` }, entry.type),
      h("span", { class: "f-preview" }, this.preview(entry)),
    );
    const node = h("li", { class: `frame ${entry.dir}${entry.verdict === "duplicate" ? " dup" : ""}`, dataset: { type: entry.type } }, h("details", { ontoggle: (e) => this.expand(e.target, entry) }, summary));
    entry.node = node;
    return node;
  }

  seqText(entry) {
    if (entry.seq === undefined) return "";
    const base = entry.seqFrom !== undefined ? `${entry.seqFrom}–${entry.seq}` : String(entry.seq);
    return entry.verdict === "duplicate" ? `${base} dup` : base;
  }

  preview(entry) {
    if (entry.binary) {
      const ms = Math.round((entry.bytes - (entry.dir === "in" ? 8 * entry.count : 0)) / 48); // PCM16 at 24 kHz
      return `${fmtCount(entry.count)} frame${entry.count === 1 ? "" : "s"} · ${fmtBytes(entry.bytes)} · ~${(ms / 1000).toFixed(1)} s${entry.dir === "out" ? " (mic)" : " (speech)"}`;
    }
    const d = entry.data;
    let text = "";
    if (typeof d.content === "string") text = d.content;
    else if (d.type === "session") text = `${d.session_id} ${d.resumed ? "resumed" : "new"} · ${d.provider} · ${d.node}`;
    else if (d.type === "metric") text = `step ${d.step?.input}/${d.step?.output} · total ${d.total?.input}/${d.total?.output}`;
    else if (d.type === "error") text = `${d.code}: ${d.content}`;
    else if (d.type === "configured" || d.type === "configure") text = JSON.stringify(d.config ?? d).slice(0, 200);
    else {
      const { type, seq, timestamp, ...rest } = d;
      text = Object.keys(rest).length ? JSON.stringify(rest) : "";
    }
    if (d.type === "error" && d.code) text = `${d.code}: ${d.content}`;
    text = text.replace(/\s+/g, " ");
    return text.length > PREVIEW_CHARS ? `${text.slice(0, PREVIEW_CHARS)}…` : text;
  }

  expand(details, entry) {
    if (!details.open || details.querySelector(".f-json")) return;
    const json = entry.binary
      ? JSON.stringify({ binary: true, direction: entry.dir, frames: entry.count, bytes: entry.bytes, seq: entry.seq }, null, 2)
      : JSON.stringify(entry.data, null, 2);
    details.append(
      h(
        "div",
        { class: "f-body" },
        h("pre", { class: "f-json" }, json),
        h("button", { type: "button", class: "tool-button small", onclick: async () => toast((await copyText(json)) ? "Frame copied" : "Copy failed", "") }, icon("copy"), "Copy JSON"),
      ),
    );
  }

  /** Shown again (a tab): rows that came while hidden are in; follow the newest. */
  reveal() {
    this.flush();
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  updateAudioRow(run) {
    const preview = run.node?.querySelector(".f-preview");
    if (preview) preview.textContent = this.preview(run);
    if (run.node && run.seq !== undefined) run.node.querySelector(".f-seq").textContent = String(run.seq);
  }

  addTypeOption(type) {
    const options = [...this.typeSelect.options].slice(1).map((o) => o.value);
    options.push(type);
    options.sort();
    const index = options.indexOf(type) + 1;
    this.typeSelect.insertBefore(h("option", { value: type }, type), this.typeSelect.options[index] ?? null);
  }

  matches(entry) {
    const type = this.typeSelect.value;
    if (type && entry.type !== type) return false;
    const dir = this.dirSelect.value;
    if (dir && entry.dir !== dir) return false;
    const q = this.search.value.trim().toLowerCase();
    if (q) {
      const text = entry.binary ? "audio" : JSON.stringify(entry.data).toLowerCase();
      if (!text.includes(q)) return false;
    }
    return true;
  }

  visible() {
    return this.frames.filter((f) => this.matches(f));
  }

  refilter() {
    this.queue = [];
    const shown = this.visible().slice(-MAX_ROWS);
    this.list.replaceChildren(...shown.map((f) => this.row(f)));
    this.updateCount();
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  togglePause() {
    if (!this.paused) this.flush(); // what came before the pause is shown
    this.paused = !this.paused;
    this.pauseButton.setAttribute("aria-pressed", String(this.paused));
    this.pauseButton.replaceChildren(icon(this.paused ? "play" : "pause"), h("span", null, this.paused ? "Resume" : "Pause"));
    this.root.classList.toggle("paused", this.paused);
    if (!this.paused) {
      this.pausedNew = 0;
      this.refilter();
    }
    this.updateCount();
  }

  updateCount() {
    const n = this.frames.length + this.dropped;
    const bytes = this.frames.reduce((sum, f) => sum + (f.bytes || 0), 0);
    let text = n ? `${n.toLocaleString()} frame${n === 1 ? "" : "s"} · ${fmtBytes(bytes)}` : "no frames yet";
    const shown = this.list.childElementCount;
    if (this.typeSelect.value || this.dirSelect.value || this.search.value.trim()) text += ` · ${shown} shown`;
    if (this.paused) text += ` · paused${this.pausedNew ? `, ${this.pausedNew} new` : ""}`;
    this.count.textContent = text;
  }

  exportable(frames) {
    return frames.map((f) => ({
      n: f.n,
      direction: f.dir,
      time: new Date(f.t).toISOString(),
      ...(f.binary ? { binary: true, frames: f.count, bytes: f.bytes, seq: f.seq } : { frame: f.data }),
      ...(f.verdict && f.verdict !== "new" ? { verdict: f.verdict } : {}),
    }));
  }

  async copy() {
    const frames = this.exportable(this.visible());
    const ok = await copyText(JSON.stringify(frames, null, 2));
    toast(ok ? `Copied ${frames.length} frame${frames.length === 1 ? "" : "s"}` : "The clipboard refused the copy", ok ? "" : "bad");
  }

  download() {
    const s = this.session();
    download(`rtgw-frames-${s.session_id ?? "none"}.json`, {
      session_id: s.session_id,
      node: s.node,
      provider: s.provider,
      exported_at: new Date().toISOString(),
      dropped: this.dropped,
      frames: this.exportable(this.frames),
    });
  }

  clear() {
    this.frames = [];
    this.dropped = 0;
    this.queue = [];
    this.audioRuns = { in: null, out: null };
    this.list.replaceChildren();
    this.emptyHint.hidden = false;
    this.updateCount();
  }
}

