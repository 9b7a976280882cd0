// AG-UI's own client (@ag-ui/client's HttpAgent) against a running evermirror
// (EVERMIRROR_URL, with EVERMIRROR_KEY as its API key): the agent's event pipeline
// verifies every run (verifyEvents), applies it to its messages, and keeps the
// interrupts a run ends with until the next run answers them.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { HttpAgent } from "@ag-ui/client";

const BASE = process.env.EVERMIRROR_URL;
const headers = { Authorization: `Bearer ${process.env.EVERMIRROR_KEY}` };

function agentOn(threadId) {
  return new HttpAgent({ url: `${BASE}/v1/ag-ui`, headers, threadId });
}

function say(agent, text) {
  agent.addMessage({ id: randomUUID(), role: "user", content: text });
}

function lastAssistantText(agent) {
  return agent.messages.filter((m) => m.role === "assistant" && m.content).at(-1)?.content;
}

async function createSession(body) {
  const response = await fetch(`${BASE}/v1/sessions`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 201);
  return (await response.json()).id;
}

test("a text run", async () => {
  const agent = agentOn(`thread-${randomUUID()}`);
  say(agent, "hello from ag-ui");
  const { newMessages } = await agent.runAgent();
  assert.equal(lastAssistantText(agent), "hello from ag-ui");
  assert.ok(newMessages.some((m) => m.role === "assistant"));
});

test("a frontend tool round trip", async () => {
  const agent = agentOn(`thread-${randomUUID()}`);
  const tools = [
    {
      name: "get_weather",
      description: "The weather where the user is",
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  ];
  say(agent, '/scenario call get_weather {"city": "Riga"}');
  await agent.runAgent({ tools });
  const call = agent.messages.flatMap((m) => m.toolCalls ?? []).at(-1);
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Riga" });
  // The application runs the tool and answers with a tool message.
  agent.addMessage({
    id: randomUUID(),
    role: "tool",
    toolCallId: call.id,
    content: JSON.stringify({ temp: 3 }),
  });
  await agent.runAgent({ tools });
  assert.match(lastAssistantText(agent), /returned \{"temp": 3\}/);
});

test("an approval interrupt, resumed", async () => {
  const sessionId = await createSession({
    tools: [
      {
        name: "lookup",
        type: "builtin",
        policy: "requires_approval",
        parameters: { type: "object" },
      },
    ],
  });
  const agent = agentOn(sessionId);
  let outcome;
  say(agent, '/scenario call lookup {"query": "agui"}');
  await agent.runAgent({}, { onRunFinishedEvent: ({ event }) => (outcome = event.outcome) });
  assert.equal(outcome.type, "interrupt");
  assert.equal(agent.pendingInterrupts.length, 1);
  const [interrupt] = agent.pendingInterrupts;
  assert.equal(interrupt.reason, "tool_approval");
  // A run that leaves the interrupt unanswered is refused by the client itself.
  await assert.rejects(agent.runAgent(), /pending interrupt/);
  await agent.runAgent(
    {
      resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }],
    },
    { onRunFinishedEvent: ({ event }) => (outcome = event.outcome) },
  );
  assert.equal(outcome.type, "success");
  assert.equal(agent.pendingInterrupts.length, 0);
  const result = agent.messages.find((m) => m.role === "tool" && m.toolCallId === interrupt.toolCallId);
  assert.deepEqual(JSON.parse(result.content), { query: "agui", answer: 42 });
  assert.match(lastAssistantText(agent), /returned/);
});
