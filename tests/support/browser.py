"""Headless Chromium for the web view's tests: Playwright driving Debian's `chromium`
(Playwright's own browser download is not used), one browser per test module, a fresh
context (its own sessionStorage) per test, and what the chat page shows, read in the
shape a test compares with `GET .../messages`."""

import asyncio
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import pytest_asyncio

from tests.support.api import text_of

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_INSTALLED = CHROMIUM.is_file()

# Every message the chat page shows, in order; a message's text is its text parts'
# `.text-body`'s `data-source`, the stored text exactly (shown as Markdown when done).
RENDERED = """() => [...document.querySelectorAll("#list > .message")].map((m) => ({
  id: m.dataset.messageId,
  sequence: Number(m.dataset.sequence),
  role: m.dataset.role,
  state: m.dataset.state,
  text: [...m.querySelectorAll(':scope > .part[data-type="text"] > .text-body')]
    .map((t) => t.dataset.source).join(""),
}))"""


def browser_fixture() -> Any:
    """A module's `browser` fixture (`browser = browser_fixture()`): headless Chromium,
    launched once for the module, skipped (saying why) where it is not installed.
    Playwright's async API, on the module's event loop: the tests of such a module
    run on it too (`pytest.mark.asyncio(loop_scope="module")`), and synchronous
    fixtures (server processes) stay free to run their own loops."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def browser() -> AsyncIterator["Browser"]:
        if not CHROMIUM_INSTALLED:
            why = (
                f"the web view's browser tests need Chromium at {CHROMIUM} "
                "(Debian: apt-get install chromium)"
            )
            # CI (.ci/run) installs it and sets REQUIRE_CHROMIUM: a skip would hide it.
            if os.environ.get("REQUIRE_CHROMIUM"):
                pytest.fail(why)
            pytest.skip(why)
        async_api = pytest.importorskip(
            "playwright.async_api",
            reason="the web view's browser tests need the playwright package",
        )
        async with async_api.async_playwright() as playwright:
            launched = await playwright.chromium.launch(executable_path=str(CHROMIUM))
            yield launched
            await launched.close()

    return browser


def page_fixture() -> Any:
    """A module's `page` fixture (`page = page_fixture()`): a page of `browser` in a
    context of its own (its own sessionStorage). Uncaught errors and
    Content-Security-Policy violations (Chromium reports them on the console) fail
    the test."""

    @pytest_asyncio.fixture(loop_scope="module")
    async def page(
        browser: "Browser", request: pytest.FixtureRequest
    ) -> AsyncIterator["Page"]:
        context = await browser.new_context(viewport={"width": 900, "height": 640})
        opened = await context.new_page()
        opened.set_default_timeout(15_000)
        problems: list[str] = []
        opened.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
        opened.on(
            "console",
            lambda message: (
                problems.append(f"console: {message.text}")
                if "Content Security Policy" in message.text
                else None
            ),
        )
        yield opened
        await keep_screenshot(opened, request.node.name)
        await context.close()
        assert problems == [], problems

    return page


async def keep_screenshot(page: "Page", test_name: str) -> None:
    """The page as a test left it, as a PNG in SCREENSHOTS_DIR when that is set (.ci/run
    sets it, so a run's screenshots can be kept as artifacts where the runner keeps
    files)."""
    directory = os.environ.get("SCREENSHOTS_DIR")
    if not directory or page.is_closed():
        return
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)
    await page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)


async def rendered(page: "Page") -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = await page.evaluate(RENDERED)
    return shown


async def api_messages(
    client: httpx.AsyncClient,
    session_id: str,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every message of the session, oldest first, in the shape of `rendered`."""
    messages: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 200}
    while True:
        response = await client.get(
            f"/v1/sessions/{session_id}/messages", params=params, headers=headers
        )
        assert response.status_code == 200, response.text
        body = response.json()
        messages[:0] = body["data"]
        if not body["has_more"]:
            break
        params = {**params, "before_sequence": body["next_before_sequence"]}
    return [
        {
            "id": m["id"],
            "sequence": m["sequence"],
            "role": m["role"],
            "state": m["state"],
            "text": text_of(m),
        }
        for m in messages
    ]


async def wait_converged(
    page: "Page",
    client: httpx.AsyncClient,
    session_id: str,
    *,
    headers: dict[str, str] | None = None,
    within: float = 20.0,
    open_ok: bool = False,
) -> list[dict[str, Any]]:
    """Waits until no message streams (unless `open_ok`: a message that waits, as a
    tool awaiting approval keeps its message open) and the page shows exactly what
    the API lists, in order; returns it."""
    deadline = time.monotonic() + within
    while True:
        expected = await api_messages(client, session_id, headers)
        shown = await rendered(page)
        if shown == expected and (
            open_ok or all(m["state"] == "done" for m in expected)
        ):
            return shown
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the page did not converge within {within}s:\n"
                f"shown:    {shown}\nexpected: {expected}"
            )
        await asyncio.sleep(0.1)


async def open_chat(
    page: "Page", base_url: str, session_id: str, query: str = ""
) -> None:
    """Opens the session's chat view and waits until it is live."""
    await page.goto(f"{base_url}/sessions/{session_id}/chat{query}")
    await page.wait_for_selector('#status[data-status="live"]')


async def send(page: "Page", text: str) -> None:
    """Types `text` in the message box and sends it with Enter; returns once posted."""
    await page.fill("#text", text)
    await page.press("#text", "Enter")
    await page.wait_for_function("() => document.querySelector('#text').value === ''")


async def turn_done(page: "Page", messages: int) -> None:
    """Waits until the page shows at least `messages` messages, none streaming."""
    await page.wait_for_function(
        "(n) => document.querySelectorAll('#list > .message').length >= n"
        " && !document.querySelector('#list > .message[data-state=\"streaming\"]')",
        arg=messages,
    )
