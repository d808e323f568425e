// The JavaScript client against a live gateway (started by tests/client/test_js_client.py).
// GATEWAY_URL: a gateway with a paced simulator; TOOL_SERVER_URL: a scripted server
// that asks for a client tool; FREE_PORT: nothing listens there.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  ApprovalRefusedError,
  Client,
  CommandRefusedError,
  ConfigureRefusedError,
  RefusedError,
  TurnTracker,
  UnreachableError,
  classifySeq,
  normalizeUrl,
} from "../../../gateway/console/static/client.js";

const URL = process.env.GATEWAY_URL;

function assertContiguous(events, first) {
  let expected = first;
  for (const ev of events) {
    const start = ev.seq_from ?? ev.seq;
    assert.equal(start, expected, `${ev.type} starts at ${start}, expected ${expected}`);
    expected = ev.seq + 1;
  }
}

const answerOf = (events) => events.filter((e) => e.type === "respond").map((e) => e.content).join("");

function sized(base, chars) {
  return `${base} `.repeat(Math.ceil(chars / (base.length + 1))).slice(0, chars);
}

test("a turn yields its events from the user echo to the metric", async () => {
  const c = new Client(URL);
  await c.connect();
  try {
    const events = [];
    for await (const ev of c.send("hello")) events.push(ev);
    assert.equal(events[0].type, "user");
    assert.equal(answerOf(events), "Echo: hello");
    assert.deepEqual(events.slice(-2).map((e) => e.type), ["end", "metric"]);
    assert.equal(c.lastSeq, events.at(-1).seq);
  } finally {
    c.close();
  }
});

test("a turn completes through two dropped connections, every event once", async () => {
  const c = new Client(URL, { backoffInitial: 10 });
  await c.connect();
  try {
    const message = sized("resume me", 400);
    const before = c.lastSeq;
    const events = [];
    let responds = 0;
    for await (const ev of c.send(message)) {
      events.push(ev);
      if (ev.type === "respond" && [5, 40].includes(++responds)) c.dropConnection();
    }
    assert.equal(c.reconnects, 2);
    assertContiguous(events, before + 1);
    assert.equal(answerOf(events), `Echo: ${message}`);
    assert.equal(events.at(-1).type, "metric");
  } finally {
    c.close();
  }
});

test("cancel ends the turn with cancelled and its metric, and the next turn runs", async () => {
  const c = new Client(URL);
  await c.connect();
  try {
    const events = [];
    for await (const ev of c.send(sized("long", 2000))) {
      events.push(ev);
      if (ev.type === "respond" && events.filter((e) => e.type === "respond").length === 1) {
        await c.cancel();
      }
    }
    assert.equal(events.at(-2).type, "cancelled");
    assert.equal(events.at(-1).type, "metric");
    assert.ok(events.at(-1).step.output > 0);
    const next = [];
    for await (const ev of c.send("again")) next.push(ev);
    assert.equal(answerOf(next), "Echo: again");
  } finally {
    c.close();
  }
});

test("nothing listening fails at once with a clear message", async () => {
  const c = new Client(`ws://127.0.0.1:${process.env.FREE_PORT}/v1/realtime`);
  await assert.rejects(c.connect(), (err) => err instanceof UnreachableError && /gateway serve/.test(err.message));
});

test("an unknown session is a final refusal with the server's text", async () => {
  const c = new Client(URL, { sessionId: "nope", after: 0 });
  await assert.rejects(c.connect(), (err) => err instanceof RefusedError && err.status === 404 && err.serverMessage.length > 0);
});

test("client tools answer calls that run on the client", async () => {
  const c = new Client(process.env.TOOL_SERVER_URL);
  c.tool("shout", ({ text }) => String(text).toUpperCase());
  await c.connect();
  try {
    const events = [];
    for await (const ev of c.send("use the tool")) events.push(ev);
    // The scripted server echoes the tool_result it received as the answer.
    const answer = JSON.parse(answerOf(events));
    assert.deepEqual(answer, { type: "tool_result", id: "c1", status: "success", content: "HI" });
  } finally {
    c.close();
  }
});

test("pure rules: seq verdicts, turn ends, URLs", () => {
  assert.equal(classifySeq("think", 5, 4), "new");
  assert.equal(classifySeq("respond", 9, 4, 5), "new");
  assert.equal(classifySeq("respond", 9, 6, 5), "gap");
  assert.equal(classifySeq("think", 4, 4), "duplicate");
  assert.equal(classifySeq("error", 4, 4), "reply");
  assert.equal(classifySeq("think", 7, 4), "gap");
  const shapes = [
    [["user", "respond", "end", "metric"], 3],
    [["user", "respond", "metric", "end"], 3],
    [["user", "error:upstream", "end"], 2],
    [["user", "error:upstream", "metric"], 2],
    // A malformed block is handed back to the model: the turn goes on to its end.
    [["user", "error:malformed_execute", "metric", "result", "respond", "end", "metric"], 6],
  ];
  for (const [kinds, at] of shapes) {
    const t = new TurnTracker();
    const ends = kinds.map((k) => t.feed(...k.split(":")));
    assert.equal(ends.indexOf(true), at, kinds.join(","));
  }
  const t = new TurnTracker();
  t.feed("user");
  t.feed("cancelled");
  assert.ok(t.closing && !t.done);
  assert.ok(t.endsBefore("user"));
  assert.equal(normalizeUrl("http://h:1"), "ws://h:1/v1/realtime");
  assert.equal(normalizeUrl("h:1/x"), "ws://h:1/x");
});

test("configure resolves with its answer, rejects with the gateway's refusal", async () => {
  const frames = [];
  const c = new Client(URL, { onFrame: (f) => frames.push(f) });
  await c.connect();
  try {
    const answer = await c.configure({ instructions: "Be brief." });
    assert.equal(answer.type, "configured");
    assert.equal(answer.config.instructions, "Be brief.");
    await assert.rejects(
      c.configure({ tools: [{ name: "bad", parameters: { type: "string" } }] }),
      (err) => err instanceof ConfigureRefusedError && err.code === "bad_frame",
    );
    // The refusal was configure's: the next turn starts as usual.
    const events = [];
    for await (const ev of c.send("hello")) events.push(ev);
    assert.equal(answerOf(events), "Echo: hello");
    assert.ok((await c.ping()) >= 0);
    // onFrame saw both ways: our frames and the gateway's, the session frame first.
    assert.equal(frames[0].dir, "in");
    assert.equal(frames[0].data.type, "session");
    assert.ok(frames.some((f) => f.dir === "out" && f.data.type === "user"));
    assert.ok(frames.some((f) => f.dir === "in" && f.data.type === "pong"));
  } finally {
    c.close();
  }
});

test("context resolves with its logged event, rejects a bad one with the gateway's refusal", async () => {
  const c = new Client(URL);
  await c.connect();
  try {
    for await (const _ of c.send("hello"));
    const added = await c.context("Greet them again.");
    assert.equal(added.type, "context");
    assert.equal(added.role, "system");
    // reply() is a turn: its events, from its own `reply` event to the answer's end.
    const replied = [];
    for await (const ev of c.reply()) replied.push(ev);
    assert.equal(replied[0].type, "reply");
    assert.ok(replied.some((e) => e.type === "respond"), JSON.stringify(replied));
    assert.equal(replied.at(-1).type, "metric");
    await assert.rejects(
      c.context("x", { role: "tool" }),
      (err) => err instanceof CommandRefusedError && err.code === "bad_frame",
    );
  } finally {
    c.close();
  }
});

test("played is sent, and an unknown_type answer to it stays quiet", async () => {
  const c = new Client(URL);
  await c.connect();
  try {
    assert.equal(c.played(1, 120), true);
    const events = [];
    for await (const ev of c.send("after played")) events.push(ev);
    assert.ok(!events.some((e) => e.type === "error"));
    // An older gateway: the reply is taken, and played() stops sending.
    assert.equal(c._answersOwnFrame({ type: "error", code: "unknown_type", content: "unknown message type 'played'" }), "played");
    assert.equal(c.played(2, 200), false);
  } finally {
    c.close();
  }
});

test("approve runs a waiting call once; a wrong digest or a second approve is refused", async () => {
  const c = new Client(URL);
  await c.connect();
  try {
    await c.configure({ require_approval: ["list"] });
    const events = [];
    for await (const ev of c.send('/tool list {"path": "."}')) {
      events.push(ev);
      if (ev.type !== "approval_required") continue;
      assert.deepEqual([ev.name, ev.args], ["list", { path: "." }]);
      await assert.rejects(c.approve(ev.id, "0".repeat(64), "allow"), (err) => {
        assert.ok(err instanceof ApprovalRefusedError);
        return err.code === "wrong_digest"; // and the call still waits
      });
      const approval = await c.approve(ev.id, ev.digest, "allow");
      assert.deepEqual([approval.type, approval.id, approval.decision], ["approval", ev.id, "allow"]);
      await assert.rejects(c.approve(ev.id, ev.digest, "allow"), (err) => err.code === "unknown_call");
    }
    const pending = events.find((e) => e.type === "approval_required");
    const result = events.find((e) => e.type === "result");
    assert.equal(result.id, pending.id);
    assert.equal(JSON.parse(result.content)[0].status, "success");
  } finally {
    c.close();
  }
});

test("onApproval decides as each call asks", async () => {
  const asked = [];
  const c = new Client(URL, {
    onApproval: async (ev) => {
      asked.push(ev.args.path);
      return ev.args.path === "secret" ? "deny" : "allow";
    },
  });
  await c.connect();
  try {
    await c.configure({ require_approval: ["list"] });
    const denied = [];
    for await (const ev of c.send('/tool list {"path": "secret"}')) denied.push(ev);
    const allowed = [];
    for await (const ev of c.send('/tool list {"path": "."}')) allowed.push(ev);
    assert.deepEqual(asked, ["secret", "."]);
    assert.equal(denied.find((e) => e.type === "approval").decision, "deny");
    assert.equal(allowed.find((e) => e.type === "approval").decision, "allow");
    assert.match(JSON.parse(denied.find((e) => e.type === "result").content)[0].content, /denied/);
  } finally {
    c.close();
  }
});
