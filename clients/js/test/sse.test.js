// The parser, and what the stream connection does with frames a test server cannot be
// made to send at will (a `disconnecting` frame, `retry:` hints, split chunks), on a
// scripted `fetch`: no server needed.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Evermirror, SSEParser } from "../src/index.js";

describe("SSEParser", () => {
  test("follows the WHATWG rules across arbitrary chunk boundaries", () => {
    const text =
      ": ping\r\n\r\nevent: message\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n" +
      "retry: 250\nevent: delta\ndata:x\n\ndata: plain\n\nid: bad\0id\ndata: y\n\n";
    // Every split point gives the same events: CR LF pairs may be cut in two.
    for (let cut = 0; cut <= text.length; cut += 1) {
      const parser = new SSEParser();
      const events = [...parser.feed(text.slice(0, cut)), ...parser.feed(text.slice(cut))];
      assert.deepEqual(
        events.map((e) => [e.type, e.data, e.id, e.hasId]),
        [
          ["message", '{"a":\n1}', "7", true],
          ["delta", "x", "7", false],
          ["message", "plain", "7", false],
          ["message", "y", "7", false],
        ],
        `cut at ${cut}`,
      );
      assert.equal(parser.retryMs, 250);
    }
  });
});

/** A fetch whose every stream answer is `body` and then stays open. */
function scriptedFetch(bodies) {
  const requests = [];
  const fetchImpl = async (url, init = {}) => {
    requests.push({ url: new URL(url), headers: new Headers(init.headers), at: Date.now() });
    const body = bodies[Math.min(requests.length - 1, bodies.length - 1)];
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(body));
      },
    });
    return new Response(stream, { status: 200, headers: { "content-type": "text/event-stream" } });
  };
  fetchImpl.requests = requests;
  return fetchImpl;
}

async function until(check, what, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

const SNAPSHOT = JSON.stringify({ message: { id: "message_1", sequence: 1, revision: 1 } });

describe("the stream connection", () => {
  test("a disconnecting frame means: reconnect now, after its retry_ms, from the cursor", async () => {
    const fetchImpl = scriptedFetch([
      `retry: 5000\nevent: message\nid: 12\ndata: ${SNAPSHOT}\n\n` +
        'event: disconnecting\ndata: {"reason":"connection_cycle","retry_ms":60}\n\n',
      ": ping\n\n",
    ]);
    const client = new Evermirror({ baseUrl: "http://evermirror.test", fetch: fetchImpl });
    const seen = [];
    const subscription = client.session("session_x").subscribe((m) => seen.push(m), { after: "0" });
    // The server keeps the first body open: only the frame makes the client move on.
    await until(() => fetchImpl.requests.length >= 2, "the reconnect");
    subscription.close();
    await subscription.done;
    const [first, second] = fetchImpl.requests;
    assert.equal(first.url.searchParams.get("after"), "0");
    assert.equal(second.url.searchParams.get("after"), null);
    assert.equal(second.headers.get("last-event-id"), "12");
    // retry_ms of the frame, not the 5 s of `retry:`, and not at once either.
    const pause = second.at - first.at;
    assert.ok(pause >= 55 && pause < 2000, `${pause} ms`);
    assert.deepEqual(
      seen.map((m) => [m.type, m.cursor]),
      [["message", "12"]],
    );
  });

  test("a clean close reconnects after the server's retry: hint", async () => {
    const bodies = [`retry: 80\nevent: message\nid: 3\ndata: ${SNAPSHOT}\n\n`];
    const requests = [];
    const fetchImpl = async (url, init = {}) => {
      requests.push({ headers: new Headers(init.headers), at: Date.now() });
      // Ends at once, as a server closing its connection cycle would.
      return new Response(bodies[0], { status: 200, headers: { "content-type": "text/event-stream" } });
    };
    const client = new Evermirror({ baseUrl: "http://evermirror.test", fetch: fetchImpl, retryMs: 5000 });
    const subscription = client.session("session_x").subscribe(() => {});
    await until(() => requests.length >= 3, "two reconnects");
    subscription.close();
    await subscription.done;
    const pause = requests[1].at - requests[0].at;
    assert.ok(pause >= 75 && pause < 2000, `${pause} ms`);
    assert.equal(requests[1].headers.get("last-event-id"), "3");
  });

  test("a 503 is retried after its Retry-After; a 401 ends the subscription", async () => {
    const answers = [
      new Response('{"title":"Service Unavailable","status":503,"code":"unavailable"}', {
        status: 503,
        headers: { "retry-after": "1", "content-type": "application/problem+json" },
      }),
      new Response('{"title":"Unauthorized","status":401,"code":"unauthorized"}', {
        status: 401,
        headers: { "content-type": "application/problem+json" },
      }),
    ];
    const at = [];
    const fetchImpl = async () => {
      at.push(Date.now());
      return answers.shift();
    };
    const client = new Evermirror({ baseUrl: "http://evermirror.test", fetch: fetchImpl, retryMs: 10 });
    const subscription = client.session("session_x").subscribe(() => {});
    await assert.rejects(subscription.done, { status: 401, code: "unauthorized" });
    assert.equal(at.length, 2);
    assert.ok(at[1] - at[0] >= 990, `${at[1] - at[0]} ms`);
  });
});
