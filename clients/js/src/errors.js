// What the client's modules share: the typed errors, and the reconnect policy.

/** A problem+json answer (RFC 9457) of the service, or a non-JSON failure status. */
export class EvermirrorError extends Error {
  constructor(status, problem = {}, headers = undefined) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.name = "EvermirrorError";
    this.status = status;
    this.title = problem.title;
    this.detail = problem.detail;
    this.code = problem.code;
    this.type = problem.type;
    this.instance = problem.instance;
    // A 422 names each offending field here ({loc, msg, type}).
    this.errors = problem.errors;
    this.problem = problem;
    this.requestId = headers?.get("x-request-id") ?? undefined;
    const retryAfter = headers?.get("retry-after");
    this.retryAfter = retryAfter && /^\d+$/.test(retryAfter) ? Number(retryAfter) : undefined;
  }
}

/** A request that got no answer within the client's `timeoutMs`. */
export class EvermirrorTimeout extends Error {
  constructor(method, path, ms) {
    super(`${method} ${path}: no answer within ${ms} ms`);
    this.name = "EvermirrorTimeout";
  }
}

export async function errorOf(response) {
  const text = await response.text().catch(() => "");
  let problem = {};
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed === "object") problem = parsed;
  } catch {
    if (text) problem = { title: text.slice(0, 200) };
  }
  return new EvermirrorError(response.status, problem, response.headers);
}

// Statuses after which a stream is worth opening again: the service is busy, restarting
// or briefly unreachable. Any other refusal (401, 404, 400) will not change by waiting.
const RETRYABLE = new Set([408, 429, 500, 502, 503, 504]);

export function retryable(error) {
  return error instanceof EvermirrorError && RETRYABLE.has(error.status);
}

export function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Aborts `controller` when `signal` does (AbortSignal.any is not in Node 18); returns
 * a function that stops following. */
export function follow(signal, controller) {
  if (!signal) return () => {};
  if (signal.aborted) controller.abort(signal.reason);
  const abort = () => controller.abort(signal.reason);
  signal.addEventListener("abort", abort, { once: true });
  return () => signal.removeEventListener("abort", abort);
}

/** The pause before the next connection: the server's hint (`retry:`, or the
 * `disconnecting` frame's `retry_ms`) after a clean close; exponential backoff with
 * jitter while connecting fails; never less than a `Retry-After`. */
export function reconnectDelay(client, { failures, hintMs, retryAfterSeconds }) {
  const base = hintMs ?? client.retryMs;
  let delay = base;
  if (failures > 0) {
    delay = Math.min(client.maxRetryMs, Math.max(base, 1) * 2 ** (failures - 1));
    delay *= 0.5 + Math.random() / 2;
  }
  if (retryAfterSeconds !== undefined) delay = Math.max(delay, retryAfterSeconds * 1000);
  return delay;
}
