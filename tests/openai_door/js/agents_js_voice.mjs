// The @openai/agents-realtime SDK, unmodified, speaking through the gateway's OpenAI door
// as a microphone does (24 kHz PCM16 in 20 ms pieces at real-time pace, server VAD,
// spoken answers), then reading its own history.
// Usage: node agents_js_voice.mjs ws://HOST:PORT/openai/v1/realtime?model=MODEL MODEL
// Prints one JSON line: {"ok": bool, "history": [[type, role], ...], "errors": [...]}.
import { RealtimeAgent, RealtimeSession } from "@openai/agents-realtime";

const [url, model] = process.argv.slice(2);
const errors = [];
const RATE = 24000;

const agent = new RealtimeAgent({ name: "assistant", instructions: "Be brief." });
const session = new RealtimeSession(agent, {
  transport: "websocket",
  model,
  config: {
    outputModalities: ["audio"],
    audio: { input: { turnDetection: { type: "server_vad" } }, output: { voice: "alloy" } },
  },
});
session.on("error", (e) => errors.push(String(e?.error?.message ?? e?.error ?? e)));

function speech() {
  // 0.2 s of silence, 1 s of a 440 Hz tone, 1 s of silence (for the VAD to hear the end).
  const samples = new Int16Array(Math.round(RATE * 2.2));
  const start = Math.round(RATE * 0.2);
  for (let i = 0; i < RATE; i++) samples[start + i] = Math.round(8000 * Math.sin((2 * Math.PI * 440 * i) / RATE));
  return samples;
}

const timeout = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, reason: "timeout", errors, history: shown() }));
  process.exit(1);
}, 40000);

function shown() {
  return session.history.map((item) => [item.type, item.role ?? ""]);
}

await session.connect({ apiKey: "unused", url });
const done = new Promise((resolve) => session.transport.on("turn_done", resolve));
const pcm = speech();
const piece = RATE / 50; // 20 ms
const began = Date.now();
for (let at = 0, n = 0; at < pcm.length; at += piece, n++) {
  const wait = began + n * 20 - Date.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  session.sendAudio(pcm.slice(at, at + piece).buffer);
}
await done;
clearTimeout(timeout);
session.close();
console.log(JSON.stringify({ ok: true, errors, history: shown() }));
