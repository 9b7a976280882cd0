// One AG-UI run through @ag-ui/client's HttpAgent (`npm install @ag-ui/client`), the
// agent CopilotKit and other AG-UI frontends wrap: the reply printed as its text
// events arrive, then the assistant message the agent built.
//
//   BASE_URL=http://127.0.0.1:8000 API_KEY=evm_... node examples/ag_ui.mjs "hello there"
import { randomUUID } from "node:crypto";

import { HttpAgent } from "@ag-ui/client";

const base = process.env.BASE_URL ?? "http://127.0.0.1:8000";
// Any thread id of the frontend's own names a session, created on first use.
const threadId = `example-${randomUUID()}`;
const agent = new HttpAgent({
  url: `${base}/v1/ag-ui`,
  headers: { Authorization: `Bearer ${process.env.API_KEY}` },
  threadId,
});
console.log(`thread: ${threadId}`);
agent.addMessage({ id: randomUUID(), role: "user", content: process.argv[2] ?? "hello" });
await agent.runAgent(
  {},
  { onTextMessageContentEvent: ({ event }) => process.stdout.write(event.delta) },
);
console.log();
const reply = agent.messages.filter((m) => m.role === "assistant").at(-1);
console.log(`agent: ${reply.content}`);
