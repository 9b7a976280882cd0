// One chat turn through the Vercel AI SDK's own transport (`npm install ai`), as
// useChat sends and reads it: the reply printed as it streams, then the whole message
// the SDK built from the chunks.
//
//   BASE_URL=http://127.0.0.1:8000 API_KEY=evm_... node examples/ai_sdk.mjs "hello there"
import { randomUUID } from "node:crypto";

import { DefaultChatTransport, readUIMessageStream } from "ai";

const base = process.env.BASE_URL ?? "http://127.0.0.1:8000";
const transport = new DefaultChatTransport({
  api: `${base}/v1/chat`,
  headers: { Authorization: `Bearer ${process.env.API_KEY}` },
});
const text = process.argv[2] ?? "hello from the ai sdk";

// Any id of the frontend's own names a session, created on first use.
const chatId = `example-${randomUUID()}`;
console.log(`chat: ${chatId}`);
const stream = await transport.sendMessages({
  chatId,
  messages: [{ id: randomUUID(), role: "user", parts: [{ type: "text", text }] }],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
});
let printed = "";
let message;
for await (const snapshot of readUIMessageStream({ stream, terminateOnError: true })) {
  message = snapshot;
  const shown = message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
  process.stdout.write(shown.slice(printed.length));
  printed = shown;
}
console.log();
console.log(`agent: ${printed}`);
