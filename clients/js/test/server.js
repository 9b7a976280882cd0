// A real evermirror server for a test file: `python -m app serve` on a free loopback
// port, on a scratch database (PostgreSQL beside TEST_DATABASE_URL when it is set, else
// a SQLite file), with one API key, so every call of the client carries it.
//
// EVERMIRROR_PYTHON names the interpreter (default: the checkout's .venv/bin/python);
// the checkout is put first on PYTHONPATH so its `app` is the one served.

import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as delay } from "node:timers/promises";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const ORG = "org_00000000000000000000000000000001";

function python() {
  return process.env.EVERMIRROR_PYTHON || join(ROOT, ".venv/bin/python");
}

function pythonEnv(extra = {}) {
  const path = [ROOT, process.env.PYTHONPATH].filter(Boolean).join(":");
  return { ...process.env, PYTHONPATH: path, ...extra };
}

/** Runs `python args...` to completion; resolves with its stdout. */
function run(args, { timeoutMs = 60_000 } = {}) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(python(), args, { cwd: ROOT, env: pythonEnv() });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk) => (stdout += chunk));
    child.stderr.on("data", (chunk) => (stderr += chunk));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      if (code === 0) resolvePromise(stdout);
      else reject(new Error(`python ${args.join(" ")} exited ${code}: ${stderr}`));
    });
  });
}

function freePort() {
  // Random, below the kernel's ephemeral range (32768 up), where an outgoing
  // connection could take the port before the server binds it; the kernel's own
  // sequential assignment would make concurrent runs collide. A taken port makes the
  // server exit, and we try another.
  return 20_000 + Math.floor(Math.random() * 12_000);
}

/**
 * Starts a server; `env` configures it (e.g. SSE_CYCLE_SECONDS). Resolves with
 * `{url, apiKey, stop()}`.
 */
export async function startServer({ env = {} } = {}) {
  const directory = await mkdtemp(join(tmpdir(), "evermirror-js-"));
  const where = process.env.TEST_DATABASE_URL
    ? ["--postgresql"]
    : ["--sqlite", join(directory, "db.sqlite")];
  const created = JSON.parse(
    await run(["-m", "tests.scratch_db", "create", ...where, "--key-org", ORG]),
  );
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const port = freePort();
    const log = join(directory, `server-${port}.log`);
    const { openSync } = await import("node:fs");
    const out = openSync(log, "w");
    const child = spawn(python(), ["-m", "app", "serve", "--port", String(port)], {
      cwd: ROOT,
      env: pythonEnv({
        DATABASE_URL: created.database_url,
        SCRIPTED_DELAY_MS: "10",
        SSE_HEARTBEAT_SECONDS: "1",
        RUNNER_SWEEP_SECONDS: "1",
        LOG_LEVEL: "info",
        ...env,
      }),
      stdio: ["ignore", out, out],
    });
    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 30_000;
    let exited = false;
    child.on("exit", () => (exited = true));
    while (Date.now() < deadline && !exited) {
      // Only our own server logs that it bound this port.
      const text = await readFile(log, "utf8").catch(() => "");
      if (text.includes(`Uvicorn running on ${url}`)) {
        return {
          url,
          apiKey: created.api_key,
          log,
          async stop() {
            child.kill("SIGTERM");
            const killer = setTimeout(() => child.kill("SIGKILL"), 10_000);
            if (!exited) await new Promise((r) => child.on("exit", r));
            clearTimeout(killer);
            await run(["-m", "tests.scratch_db", "drop", created.database_url]);
            await rm(directory, { recursive: true, force: true });
          },
        };
      }
      await delay(50);
    }
    child.kill("SIGKILL");
    const text = await readFile(log, "utf8").catch(() => "");
    if (!exited) throw new Error(`server did not start in time: ${text}`);
  }
  throw new Error("no server of our own could start");
}

/** Polls `check` until it is truthy; throws after `timeoutMs`. */
export async function waitUntil(check, what, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await delay(25);
  }
}

/** Until the session has no running turn. */
export function waitIdle(session, timeoutMs = 20_000) {
  return waitUntil(
    async () => (await session.get()).status === "idle",
    `session ${session.id} to be idle`,
    timeoutMs,
  );
}

/**
 * A `fetch` that records every request (url, headers) and, when `dropStreams` is
 * given, aborts each Mutation stream connection after `dropStreams()` milliseconds,
 * as a network failure would.
 */
export function recordingFetch({ dropStreams } = {}) {
  const requests = [];
  const fetchImpl = async (url, init = {}) => {
    const headers = new Headers(init.headers);
    requests.push({ url: new URL(url), method: init.method ?? "GET", headers });
    const isStream = new URL(url).pathname.endsWith("/messages/stream");
    if (!isStream || !dropStreams) return fetch(url, init);
    const controller = new AbortController();
    init.signal?.addEventListener("abort", () => controller.abort(init.signal.reason), {
      once: true,
    });
    const response = await fetch(url, { ...init, signal: controller.signal });
    const after = dropStreams();
    if (after !== undefined) setTimeout(() => controller.abort(new Error("dropped")), after);
    return response;
  };
  fetchImpl.requests = requests;
  fetchImpl.streams = () => requests.filter((r) => r.url.pathname.endsWith("/messages/stream"));
  return fetchImpl;
}
