// The client's requests, errors and `subscribe()` against a real server (keyed, so every
// request proves the Bearer key is sent; cycling its streams every second, so the
// reconnects are exercised as they happen in production).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Evermirror, EvermirrorError } from "../src/index.js";
import { recordingFetch, startServer, waitIdle, waitUntil } from "./server.js";

let server;
before(async () => {
  server = await startServer({ env: { SSE_CYCLE_SECONDS: "1" } });
});
after(async () => {
  await server?.stop();
});

function client(options = {}) {
  return new Evermirror({ baseUrl: server.url, apiKey: server.apiKey, retryMs: 50, ...options });
}

const MISSING = "session_00000000000000000000000000000000";

describe("requests", { timeout: 60_000 }, () => {
  test("createSession, send and messages(): the seed's page fields, walked back", async () => {
    const session = await client().createSession({ title: "pages" });
    assert.match(session.id, /^session_[0-9a-f]{32}$/);
    assert.equal(session.info.title, "pages");
    for (const word of ["one", "two", "three"]) {
      const sent = await session.send(word);
      assert.equal(sent.role, "user");
      assert.equal(sent.delivery, "started");
      await waitIdle(session);
    }
    const page = await session.messages({ limit: 4 });
    assert.deepEqual(Object.keys(page).sort(), [
      "cursor",
      "end_sequence",
      "has_more",
      "items",
      "next_before_sequence",
      "start_sequence",
      "total",
    ]);
    assert.equal(page.total, 6);
    assert.equal(page.items.length, 4);
    assert.equal(page.has_more, true);
    assert.equal(page.start_sequence, page.items[0].sequence);
    assert.equal(page.end_sequence, page.items[3].sequence);
    assert.equal(page.next_before_sequence, page.start_sequence);

    const older = await session.messages({ limit: 4, before_sequence: page.next_before_sequence });
    assert.equal(older.items.length, 2);
    assert.equal(older.has_more, false);
    assert.equal(older.next_before_sequence, undefined);
    const texts = [...older.items, ...page.items].map((m) => m.content[0].text);
    assert.deepEqual(texts, ["one", "one", "two", "two", "three", "three"]);

    // The same data as the raw wire, only `data` renamed to `items`.
    const raw = await fetch(`${server.url}/v1/sessions/${session.id}/messages?limit=4`, {
      headers: { Authorization: `Bearer ${server.apiKey}` },
    }).then((r) => r.json());
    assert.deepEqual(page.items, raw.data);
  });

  test("pin, archive, rate and feedback()", async () => {
    const session = await client().createSession({ title: "marks" });
    await session.send("rate this");
    await waitIdle(session);
    await session.pin();
    await session.archive();
    let info = await session.get();
    assert.equal(info.is_pinned, true);
    assert.equal(typeof info.archived_at, "string");
    const listed = await client().listSessions({ archived_only: true });
    assert.deepEqual(listed.data.map((s) => s.id), [session.id]);
    const found = await client().search("RATE this", { limit: 1 });
    assert.deepEqual(found.data.map((h) => h.session_id), [session.id]);
    assert.match(found.data[0].snippet_html, /<mark>rate<\/mark> <mark>this<\/mark>/);
    assert.equal(typeof found.next_url, "string");
    await session.pin(false);
    await session.archive(false);
    info = await session.get();
    assert.equal(info.is_pinned, false);
    assert.equal(info.archived_at, undefined);
    const agent = (await session.messages()).items[1].id;
    const rated = await session.rate(agent, { rating: "good", comment: "clear" });
    assert.deepEqual([rated.rating, rated.comment], ["good", "clear"]);
    assert.deepEqual((await session.feedback()).map((f) => f.message_id), [agent]);
    await session.rate(agent, { rating: null });
    assert.deepEqual(await session.feedback(), []);
  });

  test("send with client_message_id is idempotent; a different body is a typed 409", async () => {
    const session = await client().createSession();
    const first = await session.send("hello", { client_message_id: "c-1" });
    const again = await session.send("hello", { client_message_id: "c-1" });
    assert.equal(again.delivery, "duplicate");
    assert.equal(again.id, first.id);
    await assert.rejects(session.send("other", { client_message_id: "c-1" }), (error) => {
      assert.ok(error instanceof EvermirrorError);
      assert.equal(error.status, 409);
      assert.equal(error.code, "client_message_id_conflict");
      return true;
    });
    await waitIdle(session);
  });

  test("sendAndWait() resolves with the finished turn, or a timeout", async () => {
    const session = await client().createSession({ title: "wait" });
    const done = await session.sendAndWait("hello and wait");
    assert.equal(done.status, "completed");
    assert.equal(done.message.delivery, "started");
    const page = await session.messages();
    assert.deepEqual(done.messages, [page.items.at(-1)]);
    const failed = await session.sendAndWait("/scenario fail");
    assert.equal(failed.status, "failed");
    assert.equal(failed.error.code, "model_error");
    const late = await session.sendAndWait("/scenario long 100000", { timeout_ms: 100 });
    assert.equal(late.status, "timeout");
    await session.cancel();
    await waitIdle(session);
    await assert.rejects(session.sendAndWait("never stored", { timeout_ms: 0 }), (error) => {
      assert.ok(error instanceof EvermirrorError);
      assert.equal(error.code, "invalid_parameter");
      return true;
    });
  });

  test("cancel() stops the running turn", async () => {
    const session = await client().createSession();
    await session.send("/scenario long 500");
    // Cancelled while the reply streams (a turn cancelled before its reply began has
    // no agent message at all).
    await waitUntil(
      async () => (await session.messages()).items.at(-1).state === "streaming",
      "the reply to stream",
    );
    const answer = await session.cancel();
    assert.equal(answer.status, "cancelled");
    await waitIdle(session);
    const { items } = await session.messages();
    const agent = items.at(-1);
    assert.equal(agent.role, "agent");
    assert.equal(agent.state, "done");
    assert.ok(agent.content.some((part) => part.type === "error"), JSON.stringify(agent));
    assert.equal((await session.cancel()).status, "no_op");
  });

  test("errors carry the problem+json fields", async () => {
    await assert.rejects(client().session(MISSING).messages(), (error) => {
      assert.ok(error instanceof EvermirrorError);
      assert.equal(error.name, "EvermirrorError");
      assert.equal(error.status, 404);
      assert.equal(error.code, "session_not_found");
      assert.equal(error.title, "Not Found");
      assert.equal(error.detail, `Session ${MISSING} not found`);
      assert.equal(error.message, error.detail);
      assert.equal(error.type, "https://docs.everruns.com/errors/session_not_found");
      assert.match(error.requestId, /^[0-9a-f]{32}$/);
      return true;
    });
    await assert.rejects(client().session("sess_1").get(), { status: 400, code: "invalid_id" });
    const session = await client().createSession();
    await assert.rejects(session.send([]), (error) => {
      assert.equal(error.status, 422);
      assert.equal(error.code, "validation_error");
      assert.ok(Array.isArray(error.errors) && error.errors.length > 0, JSON.stringify(error.problem));
      return true;
    });
    // This deployment has a key: a client without one is refused.
    await assert.rejects(client({ apiKey: undefined }).listSessions(), {
      status: 401,
      code: "unauthorized",
    });
  });
});

describe("subscribe()", { timeout: 60_000 }, () => {
  test("delivers a turn's Mutations, continuous per part", async () => {
    const session = await client().createSession();
    const mutations = [];
    const statuses = [];
    const subscription = session.subscribe((m) => mutations.push(m), {
      onStatus: (s) => statuses.push(s),
    });
    await waitUntil(() => subscription.status === "open", "the stream to open");
    await session.send("/scenario long 20");
    await waitUntil(
      () => mutations.some((m) => m.type === "message" && m.message.role === "agent" && m.message.state === "done"),
      "the agent's final snapshot",
    );
    subscription.close();
    await subscription.done;
    assert.equal(subscription.status, "closed");
    assert.deepEqual(statuses.slice(0, 1), ["open"]);
    assert.equal(statuses.at(-1), "closed");

    const messageFrames = mutations.filter((m) => m.type === "message");
    for (const m of messageFrames) assert.match(m.cursor, /^\d+$/);
    assert.equal(subscription.lastEventId, messageFrames.at(-1).cursor);
    const parts = mutations.filter((m) => m.type === "part");
    const deltas = mutations.filter((m) => m.type === "delta");
    assert.ok(parts.length >= 1 && deltas.length >= 1, JSON.stringify(mutations.map((m) => m.type)));
    // Rebuilding the live text from part + deltas gives the committed text (a stream
    // that cycled meanwhile restarts the part with its text so far).
    let text = "";
    for (const m of mutations) {
      if (m.type === "part" && m.part.type === "text") text = m.part.text;
      if (m.type === "delta") {
        assert.equal(m.offset, text.length, "a delta starts where the text ends");
        text += m.text;
      }
    }
    const final = messageFrames.at(-1).message;
    assert.equal(text, final.content.find((p) => p.type === "text").text);
  });

  test("reconnects after the server cycles the stream, resuming with Last-Event-ID only", async () => {
    const fetchImpl = recordingFetch();
    const session = await client({ fetch: fetchImpl }).createSession();
    await session.send("before");
    await waitIdle(session);
    const mutations = [];
    const subscription = session.subscribe((m) => mutations.push(m), { after: "0" });
    // SSE_CYCLE_SECONDS=1 (±20 %): within 4 s the stream is closed and reopened twice.
    await waitUntil(() => fetchImpl.streams().length >= 3, "two reconnects", 10_000);
    await session.send("after");
    await waitUntil(
      () => mutations.filter((m) => m.type === "message" && m.message.state === "done").length >= 4,
      "the second turn's snapshots",
    );
    subscription.close();
    await subscription.done;

    const [first, ...reconnects] = fetchImpl.streams();
    assert.equal(first.url.searchParams.get("after"), "0");
    assert.equal(first.headers.get("last-event-id"), null);
    assert.equal(first.headers.get("authorization"), `Bearer ${server.apiKey}`);
    for (const request of reconnects) {
      // The cursor travels in the header only, so it is honoured whichever of the two
      // a server prefers; `after=0` again would replay the whole session.
      assert.equal(request.url.searchParams.get("after"), null, request.url.href);
      assert.match(request.headers.get("last-event-id"), /^\d+$/);
    }
    // Nothing was replayed twice: each message revision arrived once.
    const seen = mutations
      .filter((m) => m.type === "message")
      .map((m) => `${m.message.id}@${m.message.revision}`);
    assert.equal(new Set(seen).size, seen.length, seen.join(" "));
  });

  test("a refused stream ends the subscription with the typed error, without retrying", async () => {
    const fetchImpl = recordingFetch();
    const errors = [];
    const subscription = client({ fetch: fetchImpl })
      .session(MISSING)
      .subscribe(() => {}, { onError: (e) => errors.push(e) });
    await assert.rejects(subscription.done, { status: 404, code: "session_not_found" });
    assert.equal(subscription.status, "closed");
    assert.equal(errors.length, 1);
    assert.equal(fetchImpl.streams().length, 1);
  });

  test("a dropped connection reconnects by itself", async () => {
    let drops = 2;
    const fetchImpl = recordingFetch({ dropStreams: () => (drops-- > 0 ? 100 : undefined) });
    const session = await client({ fetch: fetchImpl }).createSession();
    const statuses = [];
    const mutations = [];
    const subscription = session.subscribe((m) => mutations.push(m), {
      onStatus: (s) => statuses.push(s),
    });
    await waitUntil(() => fetchImpl.streams().length >= 3, "two reconnects");
    await waitUntil(() => subscription.status === "open", "the stream to reopen");
    await session.send("still here");
    await waitUntil(
      () => mutations.some((m) => m.type === "message" && m.message.role === "agent" && m.message.state === "done"),
      "the reply after the reconnects",
    );
    subscription.close();
    await subscription.done;
    assert.deepEqual(statuses.slice(0, 4), ["open", "reconnecting", "open", "reconnecting"]);
  });
});
