// `session.sync()` against a real server: the newest window, older pages, a `reset`,
// and convergence to exactly `GET .../messages` while its stream is cut at random
// moments of streaming turns.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Evermirror } from "../src/index.js";
import { recordingFetch, startServer, waitIdle } from "./server.js";

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

function client(options = {}) {
  return new Evermirror({ baseUrl: server.url, apiKey: server.apiKey, retryMs: 20, ...options });
}

async function listed(session) {
  return (await session.messages({ limit: 200 })).items;
}

/** Until the view shows exactly what the server lists. */
async function converged(view, session) {
  await waitIdle(session);
  const expected = await listed(session);
  try {
    await view.waitFor((messages) => isDeepEqual(messages, expected), { timeoutMs: 10_000 });
  } catch {
    assert.deepEqual(view.messages, expected, `status ${view.status}`);
  }
  return expected;
}

function isDeepEqual(a, b) {
  try {
    assert.deepStrictEqual(a, b);
    return true;
  } catch {
    return false;
  }
}

/** Records every live text the view showed, to check each against the final text. */
function recordLiveText(view) {
  const shown = [];
  view.onChange(() => {
    for (const message of view.messages) {
      for (const part of message.content) {
        if (typeof part.text === "string") shown.push([message.id, part.part_id, part.text]);
      }
    }
  });
  return shown;
}

/** Every text the view showed is a prefix of the committed text of its part: no text
 * was applied twice, out of place, or invented. */
function assertPrefixes(shown, messages) {
  const final = new Map();
  for (const m of messages) {
    for (const p of m.content) {
      const text = typeof p.text === "string" ? p.text : p.text?.text;
      final.set(`${m.id}/${p.part_id}`, text);
    }
  }
  for (const [messageId, partId, text] of shown) {
    const committed = final.get(`${messageId}/${partId}`);
    assert.equal(typeof committed, "string", `${messageId}/${partId} never committed`);
    assert.ok(committed.startsWith(text), `shown ${JSON.stringify(text)} is not a prefix of ${JSON.stringify(committed)}`);
  }
}

describe("sync()", { timeout: 90_000 }, () => {
  test("loads the newest window, then follows a turn live", async () => {
    const session = await client().createSession();
    await session.send("an earlier turn");
    await waitIdle(session);
    const view = await session.sync();
    assert.equal(view.status, "live");
    assert.deepEqual(view.messages, await listed(session));
    const shown = recordLiveText(view);
    await session.send("/scenario long 30");
    const expected = await converged(view, session);
    assertPrefixes(shown, expected);
    // The reply was seen while it streamed, not only as its final snapshot.
    const reply = expected.at(-1);
    const partial = shown.filter(([id, , text]) => id === reply.id && text !== reply.content[0].text);
    assert.ok(partial.length > 3, `only ${partial.length} partial renders`);
    view.close();
    await view.done;
    assert.equal(view.status, "closed");
  });

  test("a refused view rejects with the typed error; a deleted session closes it", async () => {
    await assert.rejects(client().session("session_00000000000000000000000000000000").sync(), {
      status: 404,
      code: "session_not_found",
    });
    const session = await client().createSession();
    const view = await session.sync();
    await session.delete();
    await view.done;
    assert.equal(view.status, "closed");
    assert.equal(view.error?.code, "session_not_found");
    await assert.rejects(view.waitFor(() => true), { code: "session_not_found" });
  });

  test("loadOlder() pages back; live Mutations leave older pages alone", async () => {
    const session = await client().createSession();
    for (let turn = 0; turn < 4; turn += 1) {
      await session.send(`turn ${turn}`);
      await waitIdle(session);
    }
    const view = await session.sync({ limit: 3 });
    assert.equal(view.messages.length, 3);
    assert.equal(view.hasMore, true);
    assert.equal(await view.loadOlder(), 3);
    assert.equal(await view.loadOlder(), 2);
    assert.equal(view.hasMore, false);
    assert.equal(await view.loadOlder(), 0);
    await session.send("one more");
    await converged(view, session);
    assert.equal(view.messages.length, 10);
    view.close();
  });

  test("a reset (a cursor the server cannot honour) reloads and converges", async () => {
    let connections = 0;
    const base = recordingFetch({ dropStreams: () => (connections++ === 0 ? 150 : undefined) });
    // The reconnect claims a cursor from the future: the server answers `reset`.
    const fetchImpl = (url, init = {}) => {
      const headers = new Headers(init.headers);
      if (connections === 1 && headers.has("last-event-id")) headers.set("last-event-id", "999999");
      return base(url, { ...init, headers });
    };
    const session = await client({ fetch: fetchImpl }).createSession();
    const view = await session.sync();
    await session.send("/scenario long 40");
    await converged(view, session);
    const [, spoiled, ...later] = base.streams();
    assert.equal(spoiled.headers.get("last-event-id"), "999999");
    // After the reset the view starts over without a cursor, then resumes with one.
    assert.equal(later[0].headers.get("last-event-id"), null);
    view.close();
  });

  test("converges to GET .../messages despite random disconnects while turns stream", async () => {
    // A few seeds, each a different schedule of cuts; a failure names its seed.
    const seed = Number(process.env.SYNC_SEED ?? Date.now() % 100_000);
    let state = seed;
    const random = () => {
      state = (state * 1103515245 + 12345) % 2 ** 31;
      return state / 2 ** 31;
    };
    const fetchImpl = recordingFetch({ dropStreams: () => 10 + Math.floor(random() * 150) });
    const session = await client({ fetch: fetchImpl }).createSession();
    const view = await session.sync();
    const shown = recordLiveText(view);
    const scenarios = ["/scenario long 40", "/scenario tool", "/scenario reasoning", "/scenario long 25"];
    // Every scenario once, then more turns until the stream was cut at least four times: how
    // long a turn takes depends on the machine, the cuts must not.
    for (let turn = 0; turn < 4 || (fetchImpl.streams().length < 5 && turn < 16); turn += 1) {
      await session.send(scenarios[turn % scenarios.length]);
      const expected = await converged(view, session);
      assertPrefixes(shown, expected);
    }
    const streams = fetchImpl.streams();
    assert.ok(streams.length >= 5, `seed ${seed}: only ${streams.length} connections`);
    for (const request of streams.slice(1)) {
      assert.equal(request.url.searchParams.get("after"), null, `seed ${seed}`);
    }
    view.close();
    await view.done;
  });
});
