// The evermirror client: the seed's session surface (`messages()`, `subscribe()`,
// `sync()`), tool results and approvals over the service's HTTP API, on `fetch` alone,
// for browsers and Node >= 18.

import {
  EvermirrorError,
  EvermirrorTimeout,
  errorOf,
  follow,
  reconnectDelay,
  retryable,
  sleep,
} from "./errors.js";
import { SSEParser, readEvents } from "./sse.js";
import { SyncView } from "./sync.js";

export { EvermirrorError, EvermirrorTimeout, SSEParser, SyncView };

export class Evermirror {
  /**
   * @param {object} options
   * @param {string} options.baseUrl  the service's address, without `/v1`
   * @param {string} [options.apiKey]  sent as `Authorization: Bearer <key>`
   * @param {string} [options.orgId]  sent as `X-Org-Id`
   */
  constructor({
    baseUrl,
    apiKey,
    orgId,
    fetch: fetchImpl,
    timeoutMs = 30_000,
    retryMs = 1_000,
    maxRetryMs = 30_000,
    idleTimeoutMs = 90_000,
  } = {}) {
    if (!baseUrl) throw new TypeError("Evermirror: baseUrl is required");
    this.baseUrl = String(baseUrl).replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.orgId = orgId;
    // Called through a closure: a bare `fetch` reference loses its `this` in browsers.
    this.fetch = fetchImpl ?? ((...args) => globalThis.fetch(...args));
    this.timeoutMs = timeoutMs;
    this.retryMs = retryMs;
    this.maxRetryMs = maxRetryMs;
    this.idleTimeoutMs = idleTimeoutMs;
  }

  /** A handle on one session; no request is made. */
  session(id) {
    return new Session(this, id);
  }

  /** `POST /v1/sessions`: a new session, as a handle whose `info` is the created session. */
  async createSession(body = {}, { signal } = {}) {
    const info = await this.request("POST", "/sessions", { body, signal });
    return new Session(this, info.id, info);
  }

  /** `GET /v1/sessions`: upstream's page `{data, total, offset, limit, next_url?}`. */
  listSessions(query = {}, { signal } = {}) {
    return this.request("GET", "/sessions", { query, signal });
  }

  /** `GET /v1/search`: messages whose text holds every word of `q`, best first. */
  search(q, query = {}, { signal } = {}) {
    return this.request("GET", "/search", { query: { ...query, q }, signal });
  }

  headers(extra = {}) {
    const headers = { ...extra };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    if (this.orgId) headers["X-Org-Id"] = this.orgId;
    return headers;
  }

  url(path, query = {}) {
    const url = new URL(`${this.baseUrl}/v1${path}`);
    for (const [name, value] of Object.entries(query)) {
      if (value === undefined || value === null || value === false) continue;
      url.searchParams.set(name, String(value));
    }
    return url.toString();
  }

  /** One JSON request; a failure status throws EvermirrorError. */
  async request(method, path, { query, body, signal, timeoutMs = this.timeoutMs } = {}) {
    const controller = new AbortController();
    const unfollow = follow(signal, controller);
    const timer = setTimeout(
      () => controller.abort(new EvermirrorTimeout(method, path, timeoutMs)),
      timeoutMs,
    );
    try {
      const headers = this.headers({ Accept: "application/json" });
      if (body !== undefined) headers["Content-Type"] = "application/json";
      const response = await this.fetch(this.url(path, query), {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw await errorOf(response);
      if (response.status === 204) return undefined;
      return await response.json();
    } catch (error) {
      // fetch rejects with the abort reason only on some platforms; name the timeout.
      if (controller.signal.aborted && controller.signal.reason instanceof EvermirrorTimeout) {
        throw controller.signal.reason;
      }
      throw error;
    } finally {
      clearTimeout(timer);
      unfollow();
    }
  }
}

export class Session {
  constructor(client, id, info = undefined) {
    this.client = client;
    this.id = id;
    // The session as last read (createSession, get, update); undefined until then.
    this.info = info;
  }

  path(suffix = "") {
    return `/sessions/${encodeURIComponent(this.id)}${suffix}`;
  }

  async get({ signal } = {}) {
    this.info = await this.client.request("GET", this.path(), { signal });
    return this.info;
  }

  async update(patch, { signal } = {}) {
    this.info = await this.client.request("PATCH", this.path(), { body: patch, signal });
    return this.info;
  }

  async delete({ signal } = {}) {
    await this.client.request("DELETE", this.path(), { signal });
  }

  /** `PUT` (true) or `DELETE` (false) `.../pin`: the session's `is_pinned`. */
  async pin(pinned = true, { signal } = {}) {
    await this.client.request(pinned ? "PUT" : "DELETE", this.path("/pin"), { signal });
  }

  /** `PUT` (true) or `DELETE` (false) `.../archive`: out of the default session list. */
  async archive(archived = true, { signal } = {}) {
    await this.client.request(archived ? "PUT" : "DELETE", this.path("/archive"), { signal });
  }

  /** This key's feedback on a message: `rating` good, bad or null, and an optional
   * comment; no rating and no comment remove it. */
  rate(messageId, { rating = null, comment, signal } = {}) {
    const path = this.path(`/messages/${encodeURIComponent(messageId)}/feedback`);
    return this.client.request("PUT", path, { body: { rating, comment }, signal });
  }

  /** This key's feedback on the session's messages, in their order. */
  async feedback({ signal } = {}) {
    return (await this.client.request("GET", this.path("/feedback"), { signal })).data;
  }

  /** The seed's `SessionMessagePage`, plus `cursor`: the stream position it was read at. */
  async messages({ limit, before_sequence, include_internal, signal } = {}) {
    const body = await this.client.request("GET", this.path("/messages"), {
      query: { limit, before_sequence, include_internal },
      signal,
    });
    const page = { items: body.data, total: body.total, has_more: body.has_more };
    for (const name of ["start_sequence", "end_sequence", "next_before_sequence", "cursor"]) {
      if (body[name] !== undefined && body[name] !== null) page[name] = body[name];
    }
    return page;
  }

  message(messageId, { signal } = {}) {
    return this.client.request("GET", this.path(`/messages/${encodeURIComponent(messageId)}`), {
      signal,
    });
  }

  /**
   * Posts a user message: `text`, or an array of content parts. The answer is the stored
   * message with `delivery` (`started`, `steered` or `duplicate`).
   */
  send(text, { signal, ...options } = {}) {
    const body = messageBody(text, options);
    return this.client.request("POST", this.path("/messages"), { body, signal });
  }

  /**
   * Posts a user message and resolves when its turn ends (`?wait=true`):
   * `{status: "completed" | "failed" | "waiting" | "timeout", message, messages, error?,
   * waiting_for?}`, where `message` is the posted message as stored and `messages` the
   * turn's agent messages; `waiting` comes as soon as the turn waits for this client
   * (`waiting_for`: `tool_results` or `approval`).
   * `timeout_ms` is how long the service waits (its default: 120,000).
   */
  sendAndWait(text, { timeout_ms, signal, ...options } = {}) {
    const body = messageBody(text, options);
    const query = { wait: "true" };
    if (timeout_ms !== undefined) query.timeout_ms = timeout_ms;
    // The request lasts as long as the wait, and a little longer.
    const timeoutMs = (timeout_ms ?? WAIT_DEFAULT_MS) + this.client.timeoutMs;
    return this.client.request("POST", this.path("/messages"), { query, body, signal, timeoutMs });
  }

  /** Stops the running turn: `{status: "cancelled" | "no_op", message}`. */
  cancel({ signal } = {}) {
    return this.client.request("POST", this.path("/cancel"), { signal });
  }

  /**
   * Answers client-side tool calls (the session is `waitingfortoolresults`):
   * `[{tool_call_id, result?, error?}]`. Resolves with `{accepted, status}`; a 409
   * `not_waiting_for_tool_results` when nothing waits.
   */
  submitToolResults(results, { signal } = {}) {
    const body = { tool_results: results };
    return this.client.request("POST", this.path("/tool-results"), { body, signal });
  }

  /** The session's interactions (approvals), oldest first; `status` filters them. */
  async interactions({ status, signal } = {}) {
    const page = await this.client.request("GET", this.path("/interactions"), {
      query: { status },
      signal,
    });
    return page.data;
  }

  /**
   * Approves or denies a pending approval: `{decision: "approve" | "deny", reason?}`
   * (a denial's reason is what the model sees). Resolves with the interaction as
   * decided; a 409 `interaction_resolved` when it was decided or cancelled before.
   */
  respond(interactionId, { decision, reason, signal } = {}) {
    const body = { decision };
    if (reason !== undefined) body.reason = reason;
    const path = this.path(`/interactions/${encodeURIComponent(interactionId)}`);
    return this.client.request("POST", path, { body, signal });
  }

  /**
   * Follows the Mutation stream, reconnecting by itself: `handler` gets every Mutation
   * (`message`, `part`, `delta`, `turn`, `session`, `reset`, and kinds this client does
   * not know yet).
   */
  subscribe(handler, { after, include_internal = false, signal, onStatus, onError } = {}) {
    return new Subscription(this, handler, { after, include_internal, signal, onStatus, onError });
  }

  /** A live view of the newest messages that follows the seed's four sync rules. */
  async sync({ limit = 50, include_internal = false, signal, onChange } = {}) {
    const view = new SyncView(this, { limit, include_internal, signal, onChange });
    await view.ready;
    return view;
  }

  /**
   * One connection of the Mutation stream. Resolves with how it ended:
   * `{kind: "closed" | "error" | "aborted", retryMs?, error?}`; throws EvermirrorError
   * when the service refused to open it.
   *
   * A reconnect names its cursor in `Last-Event-ID` only, never also in `?after=`, so
   * it is honoured whichever of the two a server prefers.
   */
  async connect({ cursor, after, include_internal, signal, onOpen, onMutation }) {
    const client = this.client;
    const controller = new AbortController();
    const unfollow = follow(signal, controller);
    // No Cache-Control header: a browser would then need a CORS preflight for it;
    // `cache: "no-store"` below keeps the response out of its cache instead.
    const headers = client.headers({ Accept: "text/event-stream" });
    if (cursor !== undefined) headers["Last-Event-ID"] = String(cursor);
    const url = client.url(this.path("/messages/stream"), {
      after: cursor === undefined ? after : undefined,
      include_internal,
    });
    const parser = new SSEParser();
    let idle;
    let idleFired = false;
    const touch = () => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        idleFired = true;
        controller.abort();
      }, client.idleTimeoutMs);
    };
    let retryMs;
    try {
      touch();
      let response;
      try {
        response = await client.fetch(url, {
          headers,
          signal: controller.signal,
          cache: "no-store",
        });
      } catch (error) {
        if (signal?.aborted) return { kind: "aborted" };
        return { kind: "error", error };
      }
      if (!response.ok) throw await errorOf(response);
      onOpen?.();
      try {
        await readEvents(
          response,
          parser,
          (event) => {
            if (event.type === "disconnecting") {
              // The server is about to close: reconnect now, after the pause it asks for.
              const data = safeJson(event.data);
              if (typeof data?.retry_ms === "number") retryMs = data.retry_ms;
              return false;
            }
            const mutation = mutationOf(event);
            if (mutation) onMutation(mutation);
            return undefined;
          },
          touch,
          controller.signal,
        );
      } catch (error) {
        if (signal?.aborted) return { kind: "aborted" };
        return { kind: "error", error: idleFired ? idleError(client) : error };
      }
      if (signal?.aborted) return { kind: "aborted" };
      if (idleFired) return { kind: "error", error: idleError(client) };
      return { kind: "closed", retryMs: retryMs ?? parser.retryMs };
    } finally {
      clearTimeout(idle);
      unfollow();
    }
  }
}

// How long the service waits for a turn when `sendAndWait` does not say.
const WAIT_DEFAULT_MS = 120_000;

/** The body of `POST .../messages`: a text, or content parts, and the optional fields. */
function messageBody(text, { client_message_id, visibility, controls, metadata, tags }) {
  const content = typeof text === "string" ? [{ type: "text", text }] : text;
  const message = { content };
  if (visibility !== undefined) message.visibility = visibility;
  const body = { message };
  if (client_message_id !== undefined) body.client_message_id = client_message_id;
  if (controls !== undefined) body.controls = controls;
  if (metadata !== undefined) body.metadata = metadata;
  if (tags !== undefined) body.tags = tags;
  return body;
}

function idleError(client) {
  return new Error(`the stream sent nothing for ${client.idleTimeoutMs} ms`);
}

function safeJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** A Mutation of an SSE event: its data, with `type` (the event name) and, on `message`
 * frames, `cursor` (the frame's id). */
function mutationOf(event) {
  const data = safeJson(event.data);
  if (!data || typeof data !== "object") return undefined;
  const mutation = { ...data, type: event.type };
  if (event.type === "message" && event.hasId) mutation.cursor = event.id;
  return mutation;
}

/** `session.subscribe()`: the Mutation stream, reconnected with `Last-Event-ID`. */
export class Subscription {
  constructor(session, handler, { after, include_internal, signal, onStatus, onError }) {
    this.session = session;
    this.handler = handler;
    this.after = after === undefined ? undefined : String(after);
    this.include_internal = include_internal;
    this.onStatus = onStatus;
    this.onError = onError;
    // The cursor of the last `message` frame: where a reconnect resumes.
    this.lastEventId = undefined;
    this.status = "connecting";
    this.error = undefined;
    this.controller = new AbortController();
    this.unfollow = follow(signal, this.controller);
    this.done = this.run();
    // `done` rejects on a refusal; a caller that never awaits it is told by onError.
    this.done.catch(() => {});
  }

  setStatus(status) {
    if (status === this.status) return;
    this.status = status;
    this.onStatus?.(status);
  }

  async run() {
    const signal = this.controller.signal;
    let failures = 0;
    try {
      while (!signal.aborted) {
        let end;
        try {
          end = await this.session.connect({
            cursor: this.lastEventId,
            after: this.after,
            include_internal: this.include_internal,
            signal,
            onOpen: () => {
              failures = 0;
              this.setStatus("open");
            },
            onMutation: (mutation) => {
              if (mutation.cursor !== undefined) this.lastEventId = mutation.cursor;
              try {
                this.handler(mutation);
              } catch (error) {
                if (this.onError) this.onError(error);
                else console.error(error);
              }
            },
          });
        } catch (error) {
          if (!retryable(error)) throw error;
          failures += 1;
          this.setStatus("reconnecting");
          await sleep(reconnectDelay(this.session.client, { failures, retryAfterSeconds: error.retryAfter }), signal);
          continue;
        }
        if (end.kind === "aborted") break;
        if (end.kind === "error") failures += 1;
        this.setStatus("reconnecting");
        await sleep(reconnectDelay(this.session.client, { failures, hintMs: end.retryMs }), signal);
      }
    } catch (error) {
      this.error = error;
      this.onError?.(error);
      throw error;
    } finally {
      this.unfollow();
      this.setStatus("closed");
    }
  }

  close() {
    this.controller.abort();
  }
}
