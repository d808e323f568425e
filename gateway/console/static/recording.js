// The console's view of a session's flight recording (GET /v1/sessions/ID/recording,
// JSON Lines paged by bytes): a timeline of what crossed every wire — upstream frames,
// the clients' commands, tool runs with their durations, logged events with the
// latencies a user feels (first token, end of turn) — and the file to download for
// `gateway replay`. Recorded content is untrusted: it only ever becomes text.

import { fmtBytes, fmtMs, h } from "/static/dom.js";

/** The most of a recording the page reads (the rest: download it from the API). */
export const MAX_RECORDING_BYTES = 16 * 1024 * 1024;
/** Timeline rows drawn at most; the download has them all. */
export const MAX_ROWS = 2000;

/** Every page of `sid`'s recording, up to MAX_RECORDING_BYTES: {text, truncated}. Throws an
 * Error whose message is the API's own (it says what to do), or why the call failed. */
export async function fetchRecording(api, sid, token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const base = `${api}/v1/sessions/${encodeURIComponent(sid)}/recording`;
  let text = "";
  let offset = 0;
  for (;;) {
    const response = await fetch(`${base}?offset=${offset}`, { headers, cache: "no-store" });
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try {
        message = (await response.json()).error?.message ?? message;
      } catch {
        // not JSON
      }
      throw new Error(message);
    }
    const page = await response.text();
    text += page;
    const next = Number(response.headers.get("X-Next-Offset"));
    const more = response.headers.get("X-Has-More") === "true";
    if (!more || !page || !Number.isFinite(next) || next <= offset) return { text, truncated: false };
    if (text.length >= MAX_RECORDING_BYTES) return { text, truncated: true };
    offset = next;
  }
}

/** JSON Lines → records; a line that does not parse is kept as a record saying so. */
export function parseRecording(text) {
  const records = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    try {
      records.push(JSON.parse(line));
    } catch {
      records.push({ kind: "unreadable", t: undefined, line: line.slice(0, 200) });
    }
  }
  return records;
}

const FIRST_OUTPUT = new Set(["think", "respond", "call", "audio", "transcript"]);

/** Records → timeline rows {at (ms from the first record), kind, label, detail, note}. */
export function timelineRows(records) {
  const start = records.find((r) => typeof r.t === "number")?.t ?? 0;
  const rows = [];
  let turnAt = null; // when the running turn's user event was logged
  let firstSeen = false;
  for (const r of records) {
    const at = typeof r.t === "number" ? (r.t - start) * 1000 : null;
    const row = { at, kind: r.kind ?? "?", label: "", detail: "", note: "" };
    switch (r.kind) {
      case "header":
        row.label = `recording of ${r.session_id} on ${r.node}`;
        row.detail = `${r.provider}${r.model ? ` · ${r.model}` : ""} · audio ${r.audio ?? "user"}`;
        break;
      case "node":
        row.label = `taken over by ${r.node}`;
        row.detail = `${r.provider}${r.model ? ` · ${r.model}` : ""}`;
        break;
      case "connect":
        row.label = `upstream #${r.connection} opened`;
        row.detail = `${r.provider}${r.model ? ` · ${r.model}` : ""}`;
        break;
      case "upstream": {
        // OpenAI's frames name their type; Gemini's are one key ({"serverContent": …}).
        const frame = r.frame && typeof r.frame === "object" ? r.frame : {};
        const type = r.elided || frame.type || Object.keys(frame)[0] || "frame";
        row.label = `${r.dir === "out" ? "→ provider" : "← provider"} ${type}`;
        row.detail = `#${r.connection}${r.bytes ? ` · ${fmtBytes(r.bytes)}` : ""}`;
        break;
      }
      case "client":
        row.label = `client ${r.message?.type ?? "frame"}`;
        row.detail = r.refused ? `refused: ${r.refused}` : `after seq ${r.seq}`;
        break;
      case "audio":
        row.label = "client audio";
        row.detail = `${r.rate} Hz · after seq ${r.seq}`;
        break;
      case "tool":
        row.label = `tool ${r.name} (${r.runs_on ?? "gateway"})`;
        row.detail = `${r.status}`;
        row.note = fmtMs(r.duration_ms);
        break;
      case "event": {
        const ev = r.event ?? {};
        row.label = `event ${ev.type ?? "?"}`;
        row.detail = ev.seq !== undefined ? `seq ${ev.seq}` : "";
        if (ev.type === "user" && at !== null) {
          turnAt = at;
          firstSeen = false;
        } else if (turnAt !== null && at !== null) {
          if (!firstSeen && FIRST_OUTPUT.has(ev.type)) {
            firstSeen = true;
            row.note = `first output +${fmtMs(at - turnAt)}`;
          } else if (ev.type === "end" || ev.type === "cancelled") {
            row.note = `turn ${fmtMs(at - turnAt)}`;
            turnAt = null;
          }
        }
        break;
      }
      case "cut":
        row.label = "recording cut";
        row.detail = `it reached its limit of ${fmtBytes(r.limit)}: what followed was not kept`;
        break;
      default:
        row.label = r.kind === "unreadable" ? "a line that is not JSON" : `record ${r.kind}`;
        row.detail = r.line ?? "";
    }
    rows.push(row);
  }
  return rows;
}

/** Draw `rows` into the list element `ol` (at most MAX_ROWS of them). */
export function renderTimeline(ol, rows) {
  ol.replaceChildren(
    ...rows.slice(0, MAX_ROWS).map((row) =>
      h(
        "li",
        { class: `tl tl-${row.kind}` },
        h("span", { class: "tl-at mono", text: row.at === null ? "–" : `+${(row.at / 1000).toFixed(3)} s` }),
        h("span", { class: "tl-label", text: row.label }),
        h("span", { class: "tl-detail", text: row.detail }),
        row.note ? h("span", { class: "tl-note", text: row.note }) : null,
      ),
    ),
  );
  if (rows.length > MAX_ROWS) {
    ol.append(h("li", { class: "tl tl-more", text: `${rows.length - MAX_ROWS} more records: download the recording to see them all` }));
  }
}

/** Save the recording's JSON Lines as a file (the input of `gateway replay`). */
export function downloadRecording(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/x-ndjson" }));
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
