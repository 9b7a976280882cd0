// Tool results and approvals against a real server: `submitToolResults()` answering a
// client-side tool call, and `interactions()` / `respond()` deciding the approval of a
// built-in tool with policy `requires_approval`, each through to the end of the turn.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Evermirror, EvermirrorError } from "../src/index.js";
import { startServer, waitIdle, waitUntil } from "./server.js";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

function client() {
  return new Evermirror({ baseUrl: server.url, apiKey: server.apiKey, retryMs: 50 });
}

// The scripted model's built-in tool, asking before it runs.
const GUARDED = {
  type: "builtin",
  name: "lookup",
  description: "Look something up",
  parameters: { type: "object" },
  policy: "requires_approval",
};
const ASK = '/scenario call lookup {"query": "tea"}';
const WEATHER = {
  type: "client_side",
  name: "get_weather",
  description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

const partsOf = (message, type) => message.content.filter((part) => part.type === type);
const textOf = (message) => partsOf(message, "text").map((part) => part.text).join("");
const toolStatuses = (message) => partsOf(message, "tool_call").map((part) => part.status);

/** The session's one pending approval, once its turn asks for it. */
async function pendingApproval(session) {
  const [pending] = await waitUntil(async () => {
    const found = await session.interactions({ status: "pending" });
    return found.length > 0 ? found : undefined;
  }, "a pending approval");
  return pending;
}

async function lastAgent(session) {
  const { items } = await session.messages();
  const agent = items.at(-1);
  assert.equal(agent.role, "agent");
  return agent;
}

describe("approvals", { timeout: 60_000 }, () => {
  test("respond() approves a pending approval; the tool runs and the turn completes", async () => {
    const session = await client().createSession({ tools: [GUARDED], approval_mode: "ask" });
    await session.send(ASK);
    const pending = await pendingApproval(session);
    assert.match(pending.interaction_id, /^interaction_[0-9a-f]{32}$/);
    assert.equal(pending.interaction_type, "approval");
    assert.equal(pending.status, "pending");
    assert.deepEqual(pending.request.tool_call, {
      id: pending.tool_call_id,
      name: "lookup",
      arguments: { query: "tea" },
    });
    // The turn holds the wait: its message is open, the tool waits for the decision.
    const waiting = await lastAgent(session);
    assert.equal(waiting.id, pending.message_id);
    assert.equal(waiting.state, "streaming");
    assert.deepEqual(toolStatuses(waiting), ["awaiting_approval"]);

    const decided = await session.respond(pending.interaction_id, { decision: "approve" });
    assert.equal(decided.interaction_id, pending.interaction_id);
    assert.equal(decided.status, "approved");
    assert.deepEqual(decided.response, { decision: "approve" });
    assert.ok(decided.resolved_at);

    await waitIdle(session);
    const final = await lastAgent(session);
    assert.equal(final.state, "done");
    assert.deepEqual(toolStatuses(final), ["completed"]);
    assert.equal(partsOf(final, "interaction")[0].status, "approved");
    const quoted = 'The lookup tool returned {"query": "tea", "answer": 42}.';
    assert.ok(textOf(final).endsWith(quoted), textOf(final));
    assert.deepEqual(await session.interactions({ status: "pending" }), []);
    assert.deepEqual(await session.interactions(), [decided]);
  });

  test("respond() denies with a reason the model sees; deciding again is a typed 409", async () => {
    const session = await client().createSession({ tools: [GUARDED], approval_mode: "ask" });
    await session.send(ASK);
    const pending = await pendingApproval(session);
    const denied = await session.respond(pending.interaction_id, {
      decision: "deny",
      reason: "not now",
    });
    assert.equal(denied.status, "denied");
    assert.deepEqual(denied.response, { decision: "deny", reason: "not now" });

    await waitIdle(session);
    const final = await lastAgent(session);
    assert.deepEqual(toolStatuses(final), ["failed"]);
    assert.equal(partsOf(final, "tool_result")[0].error, "The user denied this tool call: not now");
    assert.ok(
      textOf(final).endsWith("The lookup tool failed: The user denied this tool call: not now"),
      textOf(final),
    );

    const again = session.respond(pending.interaction_id, { decision: "approve" });
    await assert.rejects(again, (error) => {
      assert.ok(error instanceof EvermirrorError);
      assert.equal(error.status, 409);
      assert.equal(error.code, "interaction_resolved");
      assert.ok(error.detail.includes(pending.interaction_id), error.detail);
      return true;
    });
    // The refusal changed nothing.
    assert.deepEqual(await session.interactions(), [denied]);
    await assert.rejects(session.respond("interaction_x", { decision: "approve" }), {
      status: 400,
      code: "invalid_id",
    });
  });
});

describe("client-side tools", { timeout: 60_000 }, () => {
  test("submitToolResults() answers a client-side call; the turn goes on with its result", async () => {
    const session = await client().createSession({ tools: [WEATHER] });
    await session.send('/scenario call get_weather {"city": "Kyiv"}');
    await waitUntil(
      async () => (await session.get()).status === "waitingfortoolresults",
      "the session to wait for the tool result",
    );
    const [call] = partsOf(await lastAgent(session), "tool_call");
    assert.equal(call.name, "get_weather");
    assert.deepEqual(call.arguments, { city: "Kyiv" });
    assert.equal(call.status, "awaiting_client");

    const result = { sky: "clear", temperature: 21 };
    const answer = await session.submitToolResults([{ tool_call_id: call.id, result }]);
    assert.deepEqual(answer, { accepted: 1, status: "active" });

    await waitIdle(session);
    const final = await lastAgent(session);
    assert.equal(final.state, "done");
    assert.deepEqual(toolStatuses(final), ["completed"]);
    const [stored] = partsOf(final, "tool_result");
    assert.equal(stored.tool_call_id, call.id);
    assert.deepEqual(stored.result, result);
    // The scripted model quotes the result as Python's json.dumps writes it.
    const quoted = 'The get_weather tool returned {"sky": "clear", "temperature": 21}.';
    assert.ok(textOf(final).endsWith(quoted), textOf(final));
  });

  test("submitToolResults() when nothing waits is the typed 409", async () => {
    const session = await client().createSession({ tools: [WEATHER] });
    const stray = session.submitToolResults([{ tool_call_id: "call_x", result: 1 }]);
    await assert.rejects(stray, (error) => {
      assert.ok(error instanceof EvermirrorError);
      assert.equal(error.status, 409);
      assert.equal(error.code, "not_waiting_for_tool_results");
      assert.match(error.detail, /not waiting for tool results/);
      return true;
    });
    assert.equal((await session.get()).status, "started");
  });
});

describe("sendAndWait() and the client", { timeout: 60_000 }, () => {
  test("answers waiting as soon as the turn waits for tool results or an approval", async () => {
    const session = await client().createSession({ tools: [WEATHER, GUARDED] });
    const tools = await session.sendAndWait('/scenario call get_weather {"city": "Oslo"}');
    assert.equal(tools.status, "waiting");
    assert.equal(tools.waiting_for, "tool_results");
    const [call] = partsOf(tools.messages.at(-1), "tool_call");
    assert.equal(call.name, "get_weather");
    await session.submitToolResults([{ tool_call_id: call.id, result: "ok" }]);
    await waitIdle(session);
    const ask = await session.sendAndWait(ASK);
    assert.equal(ask.status, "waiting");
    assert.equal(ask.waiting_for, "approval");
    const pending = await pendingApproval(session);
    await session.respond(pending.interaction_id, { decision: "approve" });
    await waitIdle(session);
    const done = await session.sendAndWait("and now");
    assert.equal(done.status, "completed");
    assert.equal(done.waiting_for, undefined);
  });
});
