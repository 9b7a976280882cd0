"""The web view on a deployment with API keys, in headless Chromium: the pages ask for
a key, say when one is refused, keep it in the tab's sessionStorage, and then work
(list, create, chat). Its server cycles streams every ~2 s, so the page also has to
ride out reconnects. A module of its own: a keyed server cannot share the database
of tests/test_web_view.py's open one."""

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
import pytest
import pytest_asyncio

from tests.support.api import auth, text_body
from tests.support.browser import (
    browser_fixture,
    open_chat,
    page_fixture,
    send,
    turn_done,
    wait_converged,
)
from tests.support.servers import KeyedServer, keyed_server_fixture

if TYPE_CHECKING:
    from playwright.async_api import Page

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

keyed_server = keyed_server_fixture(
    "web-view-keyed", SCRIPTED_DELAY_MS="10", SSE_CYCLE_SECONDS="2"
)
browser = browser_fixture()
page = page_fixture()

WRONG_KEY = "evm_" + "0" * 64
STORED_KEY = "() => sessionStorage.getItem('evermirror.apiKey')"


@pytest_asyncio.fixture(loop_scope="module")
async def api(keyed_server: KeyedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=keyed_server.url, headers=auth(keyed_server.api_key), timeout=10
    ) as client:
        yield client


async def enter_key(page: "Page", key: str) -> None:
    await page.wait_for_selector("#key", state="visible")
    await page.fill("#key-input", key)
    await page.press("#key-input", "Enter")


async def test_the_list_asks_for_the_key_then_creates_and_opens_a_session(
    page: "Page", keyed_server: KeyedServer, api: httpx.AsyncClient
) -> None:
    await page.goto(f"{keyed_server.url}/sessions")
    await enter_key(page, WRONG_KEY)
    await page.wait_for_selector("#key-error:text('That key was refused')")
    assert await page.evaluate(STORED_KEY) is None
    await enter_key(page, keyed_server.api_key)
    await page.wait_for_selector("#key", state="hidden")
    await page.wait_for_selector("#range:text('0 sessions')")
    await page.fill("#new-title", "keyed")
    await page.click("#create button")
    await page.wait_for_url("**/chat")
    # The key carried over in the tab's sessionStorage: no second prompt.
    await page.wait_for_selector('#status[data-status="live"]')
    assert await page.is_hidden("#key")
    assert await page.locator("#title").text_content() == "keyed"
    session_id = page.url.split("/")[-2]
    await send(page, "hello with a key")
    await turn_done(page, 2)
    shown = await wait_converged(page, api, session_id)
    assert [m["text"] for m in shown] == ["hello with a key"] * 2
    assert await page.evaluate(STORED_KEY) == keyed_server.api_key


async def test_the_chat_page_asks_for_the_key_in_a_new_tab(
    page: "Page", keyed_server: KeyedServer, api: httpx.AsyncClient
) -> None:
    created = await api.post("/v1/sessions", json={"title": "direct"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    await page.goto(created.json()["view_url"])
    await enter_key(page, keyed_server.api_key)
    await page.wait_for_selector('#status[data-status="live"]')
    await send(page, "/scenario citations")
    await turn_done(page, 2)
    await wait_converged(page, api, session_id)
    # A reload keeps the key (the same tab).
    await open_chat(page, keyed_server.url, session_id)
    assert await page.is_hidden("#key")


# Every value the connection indicator takes, in order.
WATCH_STATUS = """() => {
  window.statuses = [];
  const status = document.querySelector('#status');
  new MutationObserver(() => window.statuses.push(status.dataset.status))
    .observe(status, { attributes: true, attributeFilter: ['data-status'] });
}"""


async def test_the_chat_page_rides_out_stream_cycles(
    page: "Page", keyed_server: KeyedServer, api: httpx.AsyncClient
) -> None:
    created = await api.post("/v1/sessions", json={"title": "cycles"})
    session_id = created.json()["id"]
    key = json.dumps(keyed_server.api_key)
    await page.context.add_init_script(
        f"sessionStorage.setItem('evermirror.apiKey', {key})"
    )
    await open_chat(page, keyed_server.url, session_id)
    await page.evaluate(WATCH_STATUS)
    # A reply that streams across several cycles, and a message posted elsewhere
    # while the page reconnects: the page ends with exactly what the API lists.
    await send(page, "/scenario long 300")
    await page.wait_for_function(
        "() => window.statuses.includes('reconnecting')", timeout=10_000
    )
    response = await api.post(
        f"/v1/sessions/{session_id}/messages", json=text_body("posted elsewhere")
    )
    assert response.status_code == 201, response.text
    shown = await wait_converged(page, api, session_id, within=30)
    # (The second message steered the running turn: its echo joins the reply.)
    texts = [(m["role"], m["text"]) for m in shown]
    assert ("user", "posted elsewhere") in texts
    assert texts[1][1].startswith("".join(f"chunk{i} " for i in range(300)))
    # Streams cycle every ~2 s, so any one instant may fall inside a reconnect: the
    # page has to come back to live, and it does within a cycle.
    await page.wait_for_selector('#status[data-status="live"]', timeout=5_000)
