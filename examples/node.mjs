// One turn from Node >= 18 with the JavaScript client (clients/js): a live view of the
// session prints the reply as it streams, then the committed reply.
//
//   BASE_URL=http://127.0.0.1:8000 API_KEY=evm_... node examples/node.mjs "hello there"
//
// From npm, the import is `import { Evermirror } from "evermirror-client"`.
import { Evermirror } from "../clients/js/src/index.js";

const client = new Evermirror({
  baseUrl: process.env.BASE_URL ?? "http://127.0.0.1:8000",
  apiKey: process.env.API_KEY,
});
const text = process.argv[2] ?? "hello from node";

const textOf = (message) =>
  message.content.filter((part) => part.type === "text").map((part) => part.text).join("");

const session = await client.createSession({ title: "node example" });
console.log(`session: ${session.id}`);
const view = await session.sync();
let printed = "";
view.onChange(() => {
  const last = view.messages.at(-1);
  if (last?.role !== "agent") return;
  const shown = textOf(last);
  if (shown.startsWith(printed)) process.stdout.write(shown.slice(printed.length));
  printed = shown;
});
await session.send(text);
const messages = await view.waitFor((ms) => ms.at(-1)?.role === "agent" && ms.at(-1).state === "done");
view.close();
console.log(`\nagent: ${textOf(messages.at(-1))}`);
