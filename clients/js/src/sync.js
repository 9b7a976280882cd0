// `session.sync()`: a live view of a session's newest messages that follows the seed's
// reconnect-and-sync rules:
//   1. subscribe and buffer every Mutation before loading the snapshot;
//   2. merge complete `message` snapshots by message_id + revision (keep the higher);
//   3. apply `part` and `delta` only while the stream is continuous (a part extends the
//      exact revision held, a delta starts where its part's text ends);
//   4. after a disconnect or a `reset`, keep what is shown as provisional, resubscribe,
//      buffer, reload the snapshot and apply the buffer: deltas are never replayed.
// Live Mutations update the newest window only; older pages loaded with `loadOlder()`
// are never rewritten by them.

import { EvermirrorError, reconnectDelay, retryable, sleep } from "./errors.js";

function bySequence(a, b) {
  return a.sequence - b.sequence;
}

export class SyncView {
  constructor(session, { limit, include_internal, signal, onChange }) {
    this.session = session;
    this.limit = limit;
    this.include_internal = include_internal;
    // "connecting" (before the first snapshot), "live", "reconnecting" (what is shown
    // is provisional), "closed".
    this.status = "connecting";
    this.error = undefined;
    // message id -> the newest committed snapshot held.
    this.committed = new Map();
    // message id -> {revision, parts: Map<part_id, part>, stale: Set<part_id>}: the
    // live projection of a streaming message, extending committed `revision`.
    this.live = new Map();
    // Sequences below this belong to older pages; live Mutations leave them alone.
    this.windowStart = 0;
    // Where `loadOlder()` continues; undefined when nothing older exists.
    this.olderBefore = undefined;
    this.cursor = undefined;
    this.listeners = new Set();
    if (onChange) this.listeners.add(onChange);
    this.rendered = [];
    this.dirty = true;
    this.notifyScheduled = false;
    this.controller = new AbortController();
    if (signal) {
      if (signal.aborted) this.controller.abort();
      else signal.addEventListener("abort", () => this.close(), { once: true });
    }
    this.ready = new Promise((resolve, reject) => {
      this.resolveReady = resolve;
      this.rejectReady = reject;
    });
    this.ready.catch(() => {});
    this.done = this.run();
  }

  /** The messages in sequence order, live parts included. Unchanged messages keep
   * their identity between changes. */
  get messages() {
    if (this.dirty) {
      this.dirty = false;
      this.rendered = [...this.committed.values()].sort(bySequence).map((message) => {
        const live = this.live.get(message.id);
        if (!live || live.revision !== message.revision || live.parts.size === 0) return message;
        const held = new Set(message.content.map((part) => part.part_id));
        const extra = [...live.parts.values()]
          .filter((part) => !held.has(part.part_id))
          .sort(bySequence);
        return extra.length ? { ...message, content: [...message.content, ...extra] } : message;
      });
    }
    return this.rendered;
  }

  /** Whether older messages than those held exist (see `loadOlder()`). */
  get hasMore() {
    return this.olderBefore !== undefined;
  }

  /** Calls `listener(view)` after every change; returns a function that removes it. */
  onChange(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  changed() {
    this.dirty = true;
    if (this.notifyScheduled) return;
    this.notifyScheduled = true;
    // Coalesced: a burst (a buffer applied after a reload) is one notification.
    queueMicrotask(() => {
      this.notifyScheduled = false;
      for (const listener of [...this.listeners]) {
        try {
          listener(this);
        } catch (error) {
          console.error(error);
        }
      }
    });
  }

  setStatus(status) {
    if (this.status !== status) {
      this.status = status;
      this.changed();
    }
  }

  /** Resolves with `messages` once `predicate(messages, view)` holds. */
  waitFor(predicate, { timeoutMs = 30_000 } = {}) {
    return new Promise((resolve, reject) => {
      let remove = () => {};
      const timer = setTimeout(() => {
        remove();
        reject(new Error(`SyncView.waitFor: not within ${timeoutMs} ms`));
      }, timeoutMs);
      const check = () => {
        if (this.status === "closed") {
          clearTimeout(timer);
          remove();
          reject(this.error ?? new Error("SyncView closed"));
        } else if (predicate(this.messages, this)) {
          clearTimeout(timer);
          remove();
          resolve(this.messages);
        }
      };
      remove = this.onChange(check);
      check();
    });
  }

  /** Loads the page before the oldest message held; returns how many were added. */
  async loadOlder({ limit = this.limit } = {}) {
    const before = this.olderBefore;
    if (before === undefined) return 0;
    const page = await this.session.messages({
      limit,
      before_sequence: before,
      include_internal: this.include_internal,
    });
    // A reload that found a hole meanwhile restarted the older pages: drop this one.
    if (this.olderBefore !== before) return 0;
    let added = 0;
    for (const message of page.items) {
      if (!this.committed.has(message.id)) {
        this.committed.set(message.id, message);
        added += 1;
      }
    }
    this.olderBefore = page.has_more ? page.next_before_sequence : undefined;
    this.changed();
    return added;
  }

  close() {
    this.controller.abort();
  }

  // ---- merging ------------------------------------------------------------------

  /** Rule 2: a snapshot replaces what is held only with a higher revision. */
  mergeMessage(message) {
    if (message.sequence < this.windowStart) return;
    const held = this.committed.get(message.id);
    if (held && held.revision >= message.revision) return;
    this.committed.set(message.id, message);
    const live = this.live.get(message.id);
    if (live && live.revision < message.revision) this.live.delete(message.id);
    this.changed();
  }

  /** Rule 3: a part starts (or restarts, with its text so far) the live projection of
   * the revision it extends. */
  applyPart({ message_id, revision, part }) {
    const held = this.committed.get(message_id);
    if (!held || held.revision > revision || !part || typeof part.part_id !== "string") return;
    let live = this.live.get(message_id);
    if (!live || live.revision < revision) {
      live = { revision, parts: new Map(), stale: new Set() };
      this.live.set(message_id, live);
    } else if (live.revision > revision) {
      return;
    }
    live.parts.set(part.part_id, part);
    live.stale.delete(part.part_id);
    this.changed();
  }

  /** Rule 3: a delta applies only where its part's text ends (offsets count UTF-16
   * code units, which is what String.length counts). */
  applyDelta({ message_id, revision, part_id, offset, text }) {
    const live = this.live.get(message_id);
    if (!live || live.revision !== revision || live.stale.has(part_id)) return;
    const part = live.parts.get(part_id);
    if (!part || typeof part.text !== "string" || typeof text !== "string") return;
    const length = part.text.length;
    if (offset > length) {
      // A gap: this part cannot continue until a part frame or its snapshot.
      live.stale.add(part_id);
      return;
    }
    if (offset + text.length <= length) return; // already held
    live.parts.set(part_id, { ...part, text: part.text + text.slice(length - offset) });
    this.changed();
  }

  apply(mutation) {
    switch (mutation.type) {
      case "message":
        if (mutation.message) this.mergeMessage(mutation.message);
        if (mutation.cursor !== undefined) this.advance(mutation.cursor);
        break;
      case "part":
        this.applyPart(mutation);
        break;
      case "delta":
        this.applyDelta(mutation);
        break;
      default:
        // Kinds this view does not render (turn, session, warning, ...).
        break;
    }
  }

  advance(cursor) {
    if (/^\d+$/.test(String(cursor)) && (this.cursor === undefined || Number(cursor) > Number(this.cursor))) {
      this.cursor = String(cursor);
    }
  }

  /** Rule 4's reload: the newest page replaces the newest window (by revision, so a
   * page a moment older than what the stream already gave never goes backwards). */
  loadPage(page) {
    const newestHeld = Math.max(-1, ...[...this.committed.values()].map((m) => m.sequence));
    if (!this.loadedOnce) {
      this.loadedOnce = true;
      this.olderBefore = page.has_more ? page.next_before_sequence : undefined;
    } else if (page.has_more && newestHeld < page.start_sequence) {
      // More messages arrived while offline than one page holds: what is held is no
      // longer adjacent to the page. The older pages start over from it.
      this.committed.clear();
      this.olderBefore = page.next_before_sequence;
    }
    this.windowStart = page.has_more ? page.start_sequence : 0;
    for (const message of page.items) {
      const held = this.committed.get(message.id);
      if (!held || held.revision < message.revision) this.committed.set(message.id, message);
    }
    if (page.cursor !== undefined) this.advance(page.cursor);
    this.changed();
  }

  // ---- the connection loop --------------------------------------------------------

  async run() {
    const signal = this.controller.signal;
    let failures = 0;
    try {
      while (!signal.aborted) {
        const connection = new AbortController();
        const stop = () => connection.abort();
        signal.addEventListener("abort", stop, { once: true });
        // Mutations wait here until the snapshot is loaded; then it is undefined.
        const state = { buffer: [], reset: false, loading: undefined };
        let end;
        try {
          end = await this.session.connect({
            cursor: this.cursor,
            include_internal: this.include_internal,
            signal: connection.signal,
            onOpen: () => {
              state.loading = this.reload(connection, state);
            },
            onMutation: (mutation) => {
              if (mutation.type === "reset") {
                // The server cannot continue from our cursor: start over without it.
                state.reset = true;
                connection.abort();
              } else if (state.buffer) state.buffer.push(mutation);
              else this.apply(mutation);
            },
          });
        } catch (error) {
          if (!retryable(error)) throw error;
          end = { kind: "error", retryAfter: error.retryAfter };
        } finally {
          signal.removeEventListener("abort", stop);
          // The connection is over: a snapshot still loading must not go live on it.
          connection.abort();
        }
        const live = state.loading ? await state.loading : false;
        if (this.error) throw this.error;
        if (signal.aborted) break;
        // What is shown stays, marked provisional, until the next reload replaces it.
        if (this.status === "live") this.setStatus("reconnecting");
        if (state.reset) {
          this.cursor = undefined;
          end = { kind: "closed", retryMs: 0 };
        }
        if (live) failures = 0;
        if (end.kind === "error" || !live) failures += 1;
        await sleep(
          reconnectDelay(this.session.client, {
            failures,
            hintMs: end.retryMs,
            retryAfterSeconds: end.retryAfter,
          }),
          signal,
        );
      }
    } catch (error) {
      this.error = error;
    } finally {
      this.live.clear();
      this.status = "closed";
      this.rejectReady(this.error ?? new Error("SyncView closed"));
      this.changed();
    }
  }

  /** Once the stream is open (and buffering): load the snapshot, then apply the buffer
   * and go live, as one step. Resolves with whether it went live. */
  async reload(connection, state) {
    let page;
    try {
      page = await this.session.messages({
        limit: this.limit,
        include_internal: this.include_internal,
        signal: connection.signal,
      });
    } catch (error) {
      // The session is gone or the key revoked: as final as a refused stream.
      if (error instanceof EvermirrorError && !retryable(error)) {
        this.error = error;
      }
      connection.abort();
      return false;
    }
    this.loadPage(page);
    if (connection.signal.aborted) return false;
    // The live parts shown before a disconnect give way to what this connection sends:
    // the server opens every stream with the live parts so far.
    this.live.clear();
    const buffer = state.buffer;
    state.buffer = undefined;
    for (const mutation of buffer) this.apply(mutation);
    this.setStatus("live");
    this.resolveReady(this);
    return true;
  }
}
