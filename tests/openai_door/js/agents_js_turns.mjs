// The @openai/agents-realtime SDK, unmodified, through the gateway's OpenAI door:
// a text turn, then a turn where the model calls a tool this app declares and runs.
// Usage: node agents_js_turns.mjs ws://HOST:PORT/openai/v1/realtime?model=MODEL MODEL
// Prints one JSON line: {"ok": bool, "tool_calls": [...], "errors": [...], "texts": [...]}.
import { RealtimeAgent, RealtimeSession, tool } from "@openai/agents-realtime";
import { z } from "zod";

const [url, model] = process.argv.slice(2);
const toolCalls = [];
const errors = [];

const getWeather = tool({
  name: "get_weather",
  description: "The weather in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    toolCalls.push(city);
    return `sunny in ${city}`;
  },
});

const agent = new RealtimeAgent({ name: "assistant", instructions: "Be brief.", tools: [getWeather] });
const session = new RealtimeSession(agent, {
  transport: "websocket",
  model,
  config: { outputModalities: ["text"], audio: { input: { turnDetection: { type: "server_vad" } } } },
});
session.on("error", (e) => errors.push(String(e?.error?.message ?? e?.error ?? e)));

function assistantTexts() {
  return session.history
    .filter((item) => item.type === "message" && item.role === "assistant")
    .map((item) => item.content.map((c) => c.text ?? c.transcript ?? "").join(""));
}

function turnEnds(count) {
  return new Promise((resolve) => {
    let seen = 0;
    session.transport.on("turn_done", () => {
      seen += 1;
      if (seen >= count) resolve();
    });
  });
}

const timeout = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, reason: "timeout", tool_calls: toolCalls, errors, texts: assistantTexts() }));
  process.exit(1);
}, 40000);

await session.connect({ apiKey: "unused", url });
let done = turnEnds(1);
session.sendMessage("hello");
await done;
done = turnEnds(2); // the call's response, then the answer after the tool's output
session.sendMessage('/tool get_weather {"city": "Paris"}');
await done;
clearTimeout(timeout);
session.close();
console.log(JSON.stringify({ ok: true, tool_calls: toolCalls, errors, texts: assistantTexts() }));
