// The AI SDK's own client code against a running evermirror (EVERMIRROR_URL, with
// EVERMIRROR_KEY as its API key): DefaultChatTransport posts and resumes, its parser
// validates every chunk against the SDK's schema (an invalid one fails the read), and
// readUIMessageStream builds the UI message as useChat would.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { DefaultChatTransport, readUIMessageStream } from "ai";

const BASE = process.env.EVERMIRROR_URL;
const KEY = process.env.EVERMIRROR_KEY;
const headers = { Authorization: `Bearer ${KEY}` };
const transport = new DefaultChatTransport({ api: `${BASE}/v1/chat`, headers });

function userMessage(text) {
  return { id: randomUUID(), role: "user", parts: [{ type: "text", text }] };
}

async function send(chatId, messages, abortSignal) {
  return transport.sendMessages({
    chatId,
    messages,
    trigger: "submit-message",
    messageId: undefined,
    abortSignal,
  });
}

// The last state of the UI message the chunks build (`message`: the one it continues).
async function finalMessage(stream, message) {
  let last;
  for await (const snapshot of readUIMessageStream({
    stream,
    message,
    terminateOnError: true,
  })) {
    last = snapshot;
  }
  return last;
}

function textOf(message) {
  return message.parts
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
}

async function api(path, init = {}) {
  const response = await fetch(`${BASE}${path}`, {
    ...init,
    headers: { ...headers, "content-type": "application/json", ...init.headers },
  });
  assert.ok(response.ok, `${path}: ${response.status} ${await response.clone().text()}`);
  return response.json();
}

async function agentText(sessionId) {
  for (let i = 0; i < 100; i++) {
    const session = await api(`/v1/sessions/${sessionId}`);
    if (session.status === "idle") break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const page = await api(`/v1/sessions/${sessionId}/messages?limit=200`);
  const agent = page.data.filter((m) => m.role === "agent").at(-1);
  return agent.content
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
}

test("a turn read through the SDK's transport and parser", async () => {
  const session = await api("/v1/sessions", { method: "POST", body: "{}" });
  const stream = await send(session.id, [userMessage("hello from the sdk")]);
  const message = await finalMessage(stream);
  assert.equal(message.role, "assistant");
  assert.equal(textOf(message), "hello from the sdk");
  assert.equal(textOf(message), await agentText(session.id));
});

test("a connection cut mid-turn resumes to the same message", async () => {
  const session = await api("/v1/sessions", { method: "POST", body: "{}" });
  const cut = new AbortController();
  const stream = await send(session.id, [userMessage("/scenario long 60")], cut.signal);
  const reader = stream.getReader();
  let deltas = 0;
  let messageId;
  while (deltas < 5) {
    const { value, done } = await reader.read();
    assert.ok(!done, "the turn ended before the cut");
    if (value.type === "start") messageId = value.messageId;
    if (value.type === "text-delta") deltas += 1;
  }
  cut.abort();
  await reader.cancel().catch(() => {});

  const resumed = await transport.reconnectToStream({ chatId: session.id });
  assert.ok(resumed, "the turn still runs, so there is a stream to resume");
  const message = await finalMessage(resumed);
  assert.equal(message.id, messageId);
  const expected = Array.from({ length: 60 }, (_, i) => `chunk${i} `).join("");
  assert.equal(textOf(message), expected);
  assert.equal(await agentText(session.id), expected);
  // Nothing runs any more: the SDK's reconnect gets null (a 204).
  assert.equal(await transport.reconnectToStream({ chatId: session.id }), null);
});

test("an approval asked, answered and the turn gone on", async () => {
  const session = await api("/v1/sessions", {
    method: "POST",
    body: JSON.stringify({
      tools: [
        {
          name: "lookup",
          type: "builtin",
          policy: "requires_approval",
          parameters: { type: "object" },
        },
      ],
    }),
  });
  const asking = userMessage('/scenario call lookup {"query": "sdk"}');
  const asked = await finalMessage(await send(session.id, [asking]));
  const tool = asked.parts.find((p) => p.type === "tool-lookup");
  assert.equal(tool.state, "approval-requested");
  assert.deepEqual(tool.input, { query: "sdk" });

  // What useChat's addToolApprovalResponse does to the part, then sent back.
  tool.state = "approval-responded";
  tool.approval = { ...tool.approval, approved: true };
  const stream = await send(session.id, [asking, asked]);
  const done = await finalMessage(stream, structuredClone(asked));
  assert.equal(done.id, asked.id);
  const answered = done.parts.find((p) => p.type === "tool-lookup");
  assert.equal(answered.state, "output-available");
  assert.deepEqual(answered.output, { query: "sdk", answer: 42 });
  assert.match(textOf(done), /returned/);
  assert.equal(done.parts.filter((p) => p.type === "tool-lookup").length, 1);
});

test("a client-side tool's output sent back", async () => {
  const session = await api("/v1/sessions", {
    method: "POST",
    body: JSON.stringify({
      tools: [{ name: "get_location", type: "client_side", parameters: { type: "object" } }],
    }),
  });
  const asking = userMessage("/scenario call get_location {}");
  const asked = await finalMessage(await send(session.id, [asking]));
  const tool = asked.parts.find((p) => p.type === "tool-get_location");
  assert.equal(tool.state, "input-available");
  // What useChat's addToolOutput does to the part.
  tool.state = "output-available";
  tool.output = { city: "Riga" };
  const done = await finalMessage(
    await send(session.id, [asking, asked]),
    structuredClone(asked),
  );
  assert.match(textOf(done), /Riga/);
});
