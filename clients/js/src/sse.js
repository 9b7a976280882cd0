// A `text/event-stream` parser (the WHATWG rules) and one connection of a stream over
// `fetch`, so that streams can carry an `Authorization` header, which `EventSource`
// cannot.

/**
 * Incremental parser: feed it decoded text, get back the events it completed.
 * Comments (`: ping`) dispatch nothing; the last event ID persists across events, as
 * in a browser.
 */
export class SSEParser {
  constructor() {
    this.buffer = "";
    this.lastEventId = "";
    // The server's `retry:` hint in milliseconds; it applies from the moment it is read.
    this.retryMs = undefined;
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.hasId = false;
  }

  /** @returns {{type: string, data: string, id: string, hasId: boolean}[]} */
  feed(text) {
    this.buffer += text;
    const out = [];
    // A CR at the very end may be the first half of CRLF: keep it for the next chunk.
    const pattern = /\r\n|\r(?!$)|\n/g;
    let start = 0;
    let match;
    while ((match = pattern.exec(this.buffer)) !== null) {
      const event = this.line(this.buffer.slice(start, match.index));
      start = match.index + match[0].length;
      if (event) out.push(event);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  line(line) {
    if (line === "") {
      const event =
        this.data.length > 0
          ? {
              type: this.event || "message",
              data: this.data.join("\n"),
              id: this.lastEventId,
              hasId: this.hasId,
            }
          : undefined;
      this.reset();
      return event;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id") {
      if (!value.includes("\0")) {
        this.lastEventId = value;
        this.hasId = true;
      }
    } else if (name === "retry" && /^\d+$/.test(value)) this.retryMs = Number(value);
    return undefined;
  }
}

/**
 * Reads one HTTP response body as SSE until it ends. Calls `onEvent` for each event
 * and `onActivity` for every chunk (heartbeats included), so a caller can tell a dead
 * connection from a quiet one.
 */
export async function readEvents(response, parser, onEvent, onActivity, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  // Cancelling the reader ends a pending read even where a `fetch` does not tie its
  // body to the abort signal (polyfills, test doubles).
  const cancel = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", cancel, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      onActivity();
      for (const event of parser.feed(decoder.decode(value, { stream: true }))) {
        if (onEvent(event) === false) return;
      }
    }
  } finally {
    signal?.removeEventListener("abort", cancel);
    // Releases the connection whether the body ended, failed or the caller stopped.
    cancel();
  }
}
