"""The streams and the docs in a real browser: headless Chromium (Debian's `chromium`,
driven by Playwright) against a server process on each lane.

A page on another origin (a tiny static server on loopback, listed in CORS_ORIGINS)
uses the browser's own `EventSource` on both streams, as docs/streams.md describes: live text
with astral characters is applied delta by delta at `offset == text.length`; after a
connection cycle the browser reconnects within the server's `retry:` (not its default
3 s), and its `Last-Event-ID` wins over the `?after=0` / `?after_sequence=0` it re-sends,
so nothing is replayed. The page reads a messages page's `ETag` and revalidates it. And
`/docs` and `/redoc` render with every request outside 127.0.0.1 refused.

Skipped, with the reason, where /usr/bin/chromium or playwright is missing; CI installs
both and sets REQUIRE_CHROMIUM=1, which turns the skip into a failure."""

import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.api import (
    ASTRAL_TEXT,
    create_session,
    list_messages,
    post_message,
    text_of,
)
from tests.support.lanes import LANES, lane_database_url
from tests.support.servers import Server, start_server
from tests.support.waits import wait_idle

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route

CHROMIUM = Path("/usr/bin/chromium")
# Short cycles, so a test sees a reconnect; the server's `retry:` is its default, 100 ms.
CYCLE = 2.0
# A browser without `retry:` waits 3 s; with it, 100 ms plus the connect.
RECONNECT_WITHIN_MS = 1000


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return f"needs Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "needs the playwright package (pip install -e '.[dev]')"
    return None


MISSING = _missing()
if MISSING is not None and os.environ.get("REQUIRE_CHROMIUM"):
    raise RuntimeError(f"REQUIRE_CHROMIUM is set, but this test module {MISSING}")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


# ---- a page on another origin, and a server that allows it -------------------------------


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><meta charset=utf-8><title>client page</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module", params=LANES)
def live_server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    page_origin: str,
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("chromium")
    server = start_server(
        lane_database_url(request, directory),
        directory,
        SSE_CYCLE_SECONDS=str(CYCLE),
        CORS_ORIGINS=page_origin,
    )
    yield server
    server.stop()


@pytest.fixture
async def api(live_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
        yield client


@pytest.fixture
async def browser() -> AsyncIterator["Browser"]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            # Chromium's sandbox cannot start as root (CI runs as root).
            args=["--no-sandbox"] if os.geteuid() == 0 else [],
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def loopback_only(page: "Page") -> list[str]:
    """Refuse every request that leaves 127.0.0.1; returns the list of the refused."""
    refused: list[str] = []

    async def route(route: "Route") -> None:
        url = route.request.url
        if urlsplit(url).hostname == "127.0.0.1" or url.startswith(("data:", "blob:")):
            await route.continue_()
        else:
            refused.append(url)
            await route.abort()

    await page.route("**/*", route)
    return refused


# ---- the EventSource client of docs/streams.md, in the page ---------------------------------------

# Both streams, each on `?after=0`-style URLs an EventSource re-sends unchanged on every
# reconnect. The Mutation stream is applied by the seed's rules: snapshots by
# message_id + revision, parts and deltas only on the revision held, a delta only where
# the text ends (`part.text.length === d.offset`).
SUBSCRIBE = """([base, sid]) => {
  const s = window.s = {
    messages: {}, live: {}, texts: {}, seen: [], applied: 0, dropped: [],
    opens: [], errors: [], disconnecting: [],
    sse: { opens: [], errors: [], disconnecting: [], ids: [], connected: 0 },
  };
  const es = new EventSource(`${base}/v1/sessions/${sid}/messages/stream?after=0`);
  es.onopen = () => s.opens.push(performance.now());
  es.onerror = () => s.errors.push(performance.now());
  es.addEventListener("message", (e) => {
    const { message } = JSON.parse(e.data);
    s.seen.push(`${message.id}@${message.revision}`);
    const held = s.messages[message.id];
    if (!held || held.revision < message.revision) {
      s.messages[message.id] = message;
      delete s.live[message.id];
    }
  });
  es.addEventListener("part", (e) => {
    const p = JSON.parse(e.data);
    if (s.messages[p.message_id]?.revision === p.revision) {
      (s.live[p.message_id] ??= {})[p.part.part_id] = { ...p.part };
    }
  });
  es.addEventListener("delta", (e) => {
    const d = JSON.parse(e.data);
    const part = s.live[d.message_id]?.[d.part_id];
    if (s.messages[d.message_id]?.revision === d.revision && part
        && part.text.length === d.offset) {
      part.text += d.text;
      s.texts[d.part_id] = part.text;
      s.applied += 1;
    } else {
      s.dropped.push(d);
    }
  });
  es.addEventListener("disconnecting", (e) =>
    s.disconnecting.push([performance.now(), JSON.parse(e.data).reason]));
  const sse = new EventSource(`${base}/v1/sessions/${sid}/sse?after_sequence=0`);
  sse.onopen = () => s.sse.opens.push(performance.now());
  sse.onerror = () => s.sse.errors.push(performance.now());
  sse.addEventListener("connected", () => { s.sse.connected += 1; });
  sse.addEventListener("disconnecting", (e) =>
    s.sse.disconnecting.push([performance.now(), JSON.parse(e.data).reason]));
  for (const type of ["input.message", "output.message.completed", "session.idled"]) {
    sse.addEventListener(type, (e) => s.sse.ids.push(e.lastEventId));
  }
}"""

POST = """async ([base, sid, text]) => {
  const response = await fetch(`${base}/v1/sessions/${sid}/messages`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ message: { content: [{ type: "text", text }] } }),
  });
  return response.status;
}"""


def reconnect_gap(stream: dict[str, Any]) -> float:
    """Milliseconds from the first close to the next open."""
    closed = stream["errors"][0]
    reopened = next(t for t in stream["opens"] if t > closed)
    return float(reopened - closed)


async def test_eventsource_applies_astral_deltas_and_reconnects_within_retry(
    browser: "Browser", api: httpx.AsyncClient, page_origin: str, live_server: Server
) -> None:
    # A first turn, so that the Mutation stream's replay (`?after=0`) shows when it
    # has read its position: `open` only means the headers came, and a turn posted
    # before the stream is positioned may commit before it, its deltas then older
    # than the snapshot the replay sends (and rightly dropped by the client).
    sid = await create_session(api, "chromium")
    await post_message(api, sid, "warm up")
    await wait_idle(api, sid)
    page = await browser.new_page()
    refused = await loopback_only(page)
    await page.goto(page_origin)
    await page.evaluate(SUBSCRIBE, [live_server.url, sid])
    await page.wait_for_function(
        "Object.keys(s.messages).length === 2 && s.sse.connected", timeout=10_000
    )
    # A cross-origin JSON POST: preflighted, then allowed.
    assert await page.evaluate(POST, [live_server.url, sid, ASTRAL_TEXT]) == 201
    await page.wait_for_function(
        """Object.values(s.messages).filter(
             (m) => m.role === "agent" && m.state === "done").length === 2""",
        timeout=20_000,
    )
    # Then through one connection cycle of each stream, and the reconnect after it.
    await page.wait_for_function(
        "s.opens.length >= 2 && s.sse.opens.length >= 2",
        timeout=int((CYCLE * 1.2 + 5) * 1000),
    )
    await page.wait_for_timeout(300)
    state: dict[str, Any] = await page.evaluate("s")
    await page.close()
    assert refused == []

    # Live text with emoji, a ZWJ family, a flag, a combining mark and CJK: every
    # delta applied where the browser's text ended, and it built the committed text.
    listed = await list_messages(api, sid)
    agent = listed["data"][-1]
    assert text_of(agent) == ASTRAL_TEXT
    assert state["dropped"] == [], state["dropped"]
    assert state["applied"] == len(ASTRAL_TEXT.split(" "))
    assert list(state["texts"].values()) == [ASTRAL_TEXT]
    assert state["messages"][agent["id"]] == agent

    # Each stream said `disconnecting` before its close and was back within `retry:`.
    for stream in (state, state["sse"]):
        when, reason = stream["disconnecting"][0]
        assert reason == "connection_cycle"
        assert when <= stream["errors"][0]
        assert reconnect_gap(stream) < RECONNECT_WITHIN_MS, stream
    # The reconnects sent Last-Event-ID, which won over `?after=0` and
    # `?after_sequence=0`: no snapshot and no durable event came twice.
    assert len(state["seen"]) == len(set(state["seen"])), state["seen"]
    assert len(state["sse"]["ids"]) == len(set(state["sse"]["ids"])) == 6


async def test_a_cross_origin_page_reads_the_etag_and_revalidates(
    browser: "Browser", api: httpx.AsyncClient, page_origin: str, live_server: Server
) -> None:
    sid = await create_session(api, "chromium etag")
    page = await browser.new_page()
    await page.goto(page_origin)
    result = await page.evaluate(
        """async (url) => {
          const first = await fetch(url, { cache: "no-store" });
          const etag = first.headers.get("ETag");
          const again = await fetch(url, {
            cache: "no-store", headers: { "If-None-Match": etag },
          });
          return {
            status: first.status, etag, requestId: first.headers.get("X-Request-Id"),
            revalidated: again.status, etagAgain: again.headers.get("ETag"),
          };
        }""",
        f"{live_server.url}/v1/sessions/{sid}/messages",
    )
    await page.close()
    assert result["status"] == 200
    assert result["etag"], result
    assert result["requestId"], result
    assert result["revalidated"] == 304, result
    assert result["etagAgain"] == result["etag"]


async def test_docs_and_redoc_render_with_no_network_beyond_loopback(
    browser: "Browser", api: httpx.AsyncClient, live_server: Server
) -> None:
    """Every operation of the document is listed by Swagger UI and by ReDoc, from the
    service's own assets, with every request that leaves 127.0.0.1 refused."""
    document = (await api.get("/openapi.json")).json()
    operations = [
        op
        for item in document["paths"].values()
        for op in item.values()
        if "summary" in op
    ]
    page = await browser.new_page()
    refused = await loopback_only(page)
    console: list[str] = []
    page.on("console", lambda message: console.append(message.text))
    page.on("pageerror", lambda error: console.append(f"page error: {error}"))
    await page.goto(f"{live_server.url}/docs")
    await page.wait_for_selector(".opblock-summary", timeout=20_000)
    assert await page.locator(".opblock").count() == len(operations)
    await page.goto(f"{live_server.url}/redoc")
    heading = page.locator("h2", has_text="List Sessions").first
    await heading.wait_for(timeout=20_000)
    sections = page.locator("[data-section-id^='operation/']")
    assert await sections.count() == len(operations)
    await page.close()
    assert refused == []
    # The pages' Content-Security-Policy kept ReDoc's cdn.redoc.ly logo from being
    # requested at all, and blocked nothing else; no script failed.
    assert all("cdn.redoc.ly/redoc/logo-mini.svg" in text for text in console), console
