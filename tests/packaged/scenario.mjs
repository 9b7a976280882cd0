// The clients' shared scenario, for the JavaScript client as installed from its
// `npm pack` tarball: page and walk back, sync through a turn, tool results, an
// approval, send-and-wait and cancel. `node scenario.mjs BASE_URL`; prints `ok`.
import assert from "node:assert/strict";
import { Evermirror } from "evermirror-client";

const WEATHER = {
  type: "client_side",
  name: "get_weather",
  description: "The weather",
  parameters: { type: "object" },
};
const GUARDED = {
  type: "builtin",
  name: "lookup",
  description: "Look something up",
  parameters: { type: "object" },
  policy: "requires_approval",
};
const textOf = (message) =>
  message.content.filter((part) => part.type === "text").map((part) => part.text).join("");

async function until(check, what) {
  const deadline = Date.now() + 30_000;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `no ${what} within 30 s`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
const idle = (session) =>
  until(async () => (await session.get()).status === "idle", "idle session");

const client = new Evermirror({ baseUrl: process.argv[2] });
const session = await client.createSession({ title: "packed", tools: [WEATHER, GUARDED] });
for (let index = 0; index < 3; index += 1) {
  const done = await session.sendAndWait(`message ${index}`);
  assert.equal(done.status, "completed");
}
// Page, then walk back to the first message.
let page = await session.messages({ limit: 4 });
let items = [...page.items];
while (page.has_more) {
  page = await session.messages({ limit: 4, before_sequence: page.next_before_sequence });
  items = [...page.items, ...items];
}
assert.deepEqual(
  items.map(textOf),
  [0, 1, 2].flatMap((index) => [`message ${index}`, `message ${index}`]),
);
// A live view through a turn.
const view = await session.sync();
await session.send("seen live");
const messages = await view.waitFor(
  (ms) => ms.length === 8 && ms.at(-1).role === "agent" && ms.at(-1).state === "done",
);
assert.equal(textOf(messages.at(-1)), "seen live");
view.close();
// A client-side tool: send-and-wait answers waiting, the result goes back.
const waiting = await session.sendAndWait('/scenario call get_weather {"city": "Oslo"}');
assert.equal(waiting.status, "waiting");
assert.equal(waiting.waiting_for, "tool_results");
const [call] = waiting.messages.at(-1).content.filter((part) => part.type === "tool_call");
const answer = await session.submitToolResults([{ tool_call_id: call.id, result: "sunny" }]);
assert.equal(answer.accepted, 1);
await idle(session);
// An approval, decided.
const asked = await session.sendAndWait('/scenario call lookup {"query": "tea"}');
assert.equal(asked.waiting_for, "approval");
const [pending] = await session.interactions({ status: "pending" });
const decided = await session.respond(pending.interaction_id, { decision: "approve" });
assert.equal(decided.status, "approved");
await idle(session);
// Cancel a turn while its reply streams.
await session.send("/scenario long 500");
await until(async () => {
  const [last] = (await session.messages({ limit: 1 })).items;
  return last.role === "agent" && last.state === "streaming";
}, "streaming reply");
assert.equal((await session.cancel()).status, "cancelled");
await idle(session);
console.log("ok");
