"""The web view (app/web): the session list and the chat page, driven in headless
Chromium against a real server on each lane. What a page shows must equal
`GET .../messages`, while a reply streams, after a reload mid-turn and after paging
back; every part type renders; whatever a message holds renders as text. The
routes themselves are static pages outside the API: not in the OpenAPI document, with
a Content-Security-Policy, and the API's problem+json errors around them unchanged."""

import asyncio
import base64
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import pytest_asyncio

from app.db.session import Database
from app.ids import DEFAULT_ORG_ID, format_id
from app.journal import checkpoint
from app.journal.actions import action_part, append_actions
from app.journal.sessions import lock_session
from app.journal.tool_calls import tool_transition
from app.sessions import schemas as session_schemas, service as sessions_service
from app.settings import Settings
from app.web import router as web
from tests.support.api import text_body
from tests.support.browser import (
    api_messages,
    browser_fixture,
    open_chat,
    page_fixture,
    rendered,
    send,
    turn_done,
    wait_converged,
)
from tests.support.lanes import ROOT
from tests.support.problems import assert_problem
from tests.support.servers import Server, live_server_fixture
from tests.support.waits import wait_idle, wait_until
from tests.test_approvals import ASK, GUARDED

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

# Slow enough that a long reply streams for seconds, fast enough for short turns.
live_server = live_server_fixture("web-view", SCRIPTED_DELAY_MS="10")
browser = browser_fixture()
page = page_fixture()

# A 1x1 PNG, for an image part carried as base64.
PIXEL = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8cfc0f01f0005050201a5b1e2e60000000049454e44ae426082"
    )
).decode()


@pytest_asyncio.fixture(loop_scope="module")
async def api(live_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as client:
        yield client


async def new_session(api: httpx.AsyncClient, title: str = "web view") -> str:
    response = await api.post("/v1/sessions", json={"title": title})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def post(
    api: httpx.AsyncClient, session_id: str, body: dict[str, Any]
) -> dict[str, Any]:
    response = await api.post(f"/v1/sessions/{session_id}/messages", json=body)
    assert response.status_code == 201, response.text
    message: dict[str, Any] = response.json()
    return message


async def streaming_text(page: "Page") -> str:
    """Waits until an agent message shows text while it still streams; that text."""
    handle = await page.wait_for_function(
        """() => {
          const m = document.querySelector('#list > .message[data-role="agent"][data-state="streaming"]');
          const text = m?.querySelector('.part[data-type="text"] > .text-body')?.textContent;
          return text ? text : null;
        }"""
    )
    text: str = await handle.json_value()
    return text


# ---- the routes ----------------------------------------------------------------------


async def test_the_client_served_is_the_client_source() -> None:
    """app/web/client is the JavaScript client's source (a link in a checkout, which
    the build follows: tests/test_ship.py checks the files in a built wheel)."""
    served = list(web.load(web.CLIENT, "client/"))
    assert "client/index.js" in served
    assert (ROOT / "app/web/client/index.js").read_bytes() == (
        ROOT / "clients/js/src/index.js"
    ).read_bytes()


async def test_the_pages_never_parse_data_as_markup() -> None:
    """Belt and braces beside the browser tests: no script of the web view writes
    HTML but for one line, which sets a finished agent text to what markdown-it
    renders with raw HTML off; and the pages carry no inline script or style (the
    policy would refuse them)."""
    markup = r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\("
    for script in web.ASSETS.glob("*.js"):
        source = script.read_text()
        if script.name == "render.js":
            assert re.findall(markup, source) == ["innerHTML"]
            assert "body.innerHTML = markdown.render(text);" in source
            assert "markdownit({ html: false," in source
            continue
        assert not re.search(markup, source), script.name
    for html in web.ASSETS.glob("*.html"):
        source = html.read_text()
        external = r'<script\b[^>]*\bsrc="[^"]+"[^>]*>\s*</script>'
        assert len(re.findall(external, source)) == source.count("<script"), html.name
        assert "style=" not in source, html.name
        assert "<style" not in source, html.name


async def test_pages_are_static_files_outside_the_api(
    live_server: Server, api: httpx.AsyncClient
) -> None:
    created = await api.post("/api/v1/sessions", json={"title": "urls"})
    assert created.status_code == 201, created.text
    session = created.json()
    # view_url and ui_link point at the chat page, never under the API's /api mount.
    chat = f"{live_server.url}/sessions/{session['id']}/chat"
    assert session["view_url"] == session["ui_link"] == chat
    for url in (chat, f"{live_server.url}/sessions"):
        response = await api.get(url)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        policy = response.headers["content-security-policy"]
        assert "script-src 'self';" in policy
        assert "default-src 'none'" in policy
        assert "unsafe-inline" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-cache"
        assert '<script type="module" src="' in response.text
        # Revalidated, not re-sent.
        again = await api.get(url, headers={"If-None-Match": response.headers["etag"]})
        assert again.status_code == 304
        assert again.content == b""
    # The server's own address sends a browser to the session list.
    front = await api.get(f"{live_server.url}/", follow_redirects=False)
    assert front.status_code == 307, front.text
    assert front.headers["location"] == "/sessions"
    # The JavaScript client is served from its source, from the same origin.
    client = await api.get("/web/client/index.js")
    assert client.status_code == 200
    assert client.headers["content-type"] == "text/javascript; charset=utf-8"
    assert client.headers["x-content-type-options"] == "nosniff"
    assert client.content == (ROOT / "clients/js/src/index.js").read_bytes()
    assert (await api.get("/web/chat.js")).status_code == 200
    # Nothing else is reachable through them; the API's errors stay problem+json.
    assert_problem(await api.get("/web/../app/main.py"), 404)
    assert_problem(await api.get("/web/client/index.d.ts"), 404)
    assert_problem(await api.get("/web/missing.js"), 404)
    assert_problem(await api.get("/sessions/"), 404)
    assert_problem(await api.get(f"/sessions/{session['id']}"), 404)
    assert_problem(await api.get("/sessions/sess_1/chat"), 400, code="invalid_id")
    assert_problem(
        await api.get(f"/v1/sessions/{format_id('session', uuid.uuid4())}"),
        404,
        code="session_not_found",
    )
    paths = (await api.get("/openapi.json")).json()["paths"]
    # `/v1` itself is the API's base: the agent card (app/api/agent.py).
    assert all(
        path == "/v1" or path.startswith(("/v1/", "/health", "/ready"))
        for path in paths
    ), list(paths)


# ---- live text, reload, stop ---------------------------------------------------------


async def test_a_posted_message_streams_its_reply_and_ends_as_the_api_lists_it(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    assert await page.is_disabled("#stop")
    await send(page, "/scenario long 150")
    # Text appears while the message still streams (before the turn ends), and the
    # turn can be stopped meanwhile.
    partial = await streaming_text(page)
    assert await page.is_enabled("#stop")
    shown = await wait_converged(page, api, session_id)
    assert [m["role"] for m in shown] == ["user", "agent"]
    assert shown[0]["text"] == "/scenario long 150"
    final = shown[1]["text"]
    assert final == "".join(f"chunk{i} " for i in range(150))
    assert final.startswith(partial)
    assert len(partial) < len(final)
    assert await page.is_disabled("#stop")


async def test_a_reload_mid_turn_shows_the_step_in_progress_and_converges(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    await send(page, "/scenario long 300")
    before = await streaming_text(page)
    await page.reload()
    await page.wait_for_selector('#status[data-status="live"]')
    # The reopened stream starts with the live parts so far: no wait for a commit.
    after = await streaming_text(page)
    assert after.startswith("chunk0 ")
    assert len(after) >= len(before) > 0
    shown = await wait_converged(page, api, session_id)
    assert shown[1]["text"] == "".join(f"chunk{i} " for i in range(300))


async def test_stop_cancels_the_running_turn(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    await send(page, "/scenario long 2000")
    await streaming_text(page)
    await page.click("#stop")
    await wait_converged(page, api, session_id, within=10)
    agent = page.locator('#list > .message[data-role="agent"]')
    assert (await agent.locator(".part.error").count()) == 1
    await wait_idle(api, session_id)
    assert await page.is_disabled("#stop")


# ---- history ---------------------------------------------------------------------------


async def test_scrolling_to_the_top_loads_older_pages_until_the_first_message(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    # Seven turns of long messages (few, long words: each turn is quick): fourteen
    # messages, each taller than a quarter of the screen.
    for turn in range(7):
        word = f"turn{turn}-" + "x" * 60
        await post(api, session_id, text_body(" ".join([word] * 12)))
        await wait_idle(api, session_id)
    expected = await api_messages(api, session_id)
    assert len(expected) == 14
    await open_chat(page, live_server.url, session_id, "?limit=4")
    await page.wait_for_function(
        "() => document.querySelectorAll('#list > .message').length > 0"
    )
    # The newest page only, scrolled to its end.
    assert await rendered(page) == expected[-4:]
    assert await page.evaluate(
        "() => { const b = document.querySelector('#messages');"
        " return b.scrollHeight - b.scrollTop - b.clientHeight < 64 }"
    )
    for shown in (8, 12, 14):
        await page.evaluate(
            "() => { document.querySelector('#messages').scrollTop = 0 }"
        )
        await page.wait_for_function(
            "(n) => document.querySelectorAll('#list > .message').length === n",
            arg=shown,
        )
        assert await rendered(page) == expected[-shown:]
        # What was read stays in view: the older page went in above it.
        assert (
            await page.evaluate("() => document.querySelector('#messages').scrollTop")
            > 0
        )
    await page.wait_for_selector("#older-state:text('Start of the conversation')")
    assert await page.is_hidden("#load-older")
    # New messages still arrive at the end of the whole history.
    await send(page, "and one more")
    await turn_done(page, 16)
    assert len(await wait_converged(page, api, session_id)) == 16


# ---- every part type -------------------------------------------------------------------


async def test_the_scripted_scenarios_render_their_parts(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    for count, text in enumerate(
        (
            "/scenario tool weather in Lisbon",
            "/scenario reasoning",
            "/scenario citations",
            "/scenario fail",
        ),
        start=1,
    ):
        await send(page, text)
        await turn_done(page, 2 * count)
    await wait_converged(page, api, session_id)
    agents = page.locator('#list > .message[data-role="agent"]')

    # A tool call shows its final state, its arguments and its result, once.
    tool = agents.nth(0).locator('.part[data-type="tool_call"]')
    assert await tool.get_attribute("data-status") == "completed"
    assert (await tool.locator(".tool-name").text_content()) == "lookup"
    arguments = json.loads((await tool.locator(".tool-arguments").text_content()) or "")
    assert arguments == {"query": "weather in Lisbon"}
    assert json.loads(
        (await tool.locator(".tool-result pre").text_content()) or ""
    ) == {
        "query": "weather in Lisbon",
        "answer": 42,
    }
    assert (await agents.nth(0).locator('.part[data-type="tool_result"]').count()) == 0

    # Reasoning is collapsed until opened.
    reasoning = agents.nth(1).locator("details.reasoning")
    assert await reasoning.evaluate("(d) => d.open") is False
    assert (await reasoning.locator(".reasoning-body").text_content()) == (
        "Thinking about the question."
    )
    assert not (await reasoning.locator(".reasoning-body").is_visible())
    await reasoning.locator("summary").click()
    assert await reasoning.locator(".reasoning-body").is_visible()

    # A citation marks its span and lists its source, linked.
    cited = agents.nth(2)
    assert (await cited.locator("mark.cited").text_content()) == (
        "The control plane owns durable state."
    )
    source = cited.locator(".sources a")
    assert await source.text_content() == "Architecture Overview"
    assert await source.get_attribute("href") == "https://example.com/architecture"
    assert "entailed" in ((await cited.locator(".sources").text_content()) or "")

    # A failed turn ends with its error part.
    error = agents.nth(3).locator(".part.error")
    assert (await error.locator(".code").text_content()) == "model_error"
    assert (await error.locator(".error-message").text_content()) == (
        "The scripted model failed mid-stream"
    )


async def seed_agent_parts(database_url: str) -> str:
    """A session whose agent parts no HTTP call makes: a tool call awaiting an
    approval the service does not hold (an interaction part, in a message still open)
    and a standalone action message, written by the checkpoint writer as the runner
    would."""
    database = Database.from_settings(Settings(database_url=database_url))
    try:
        async with database.write() as db:
            created = await sessions_service.create_session(
                db,
                organization_id=DEFAULT_ORG_ID,
                data=session_schemas.SessionCreate(title="approvals"),
            )
        session_id = created.id
        async with database.write() as db:
            session = await lock_session(db, session_id)
            assert session is not None
            opened = await checkpoint.open_agent_message(
                db, session, turn_id=uuid.uuid4()
            )
            assert opened.message is not None
            message_id = opened.message.id
        async with database.write() as db:
            session = await lock_session(db, session_id)
            assert session is not None
            message = await checkpoint.get_message_for_update(db, message_id)
            await checkpoint.commit_step(
                db,
                session,
                message,
                step_id="s1",
                parts=[
                    {"type": "text", "text": "I need your approval."},
                    {
                        "type": "tool_call",
                        "id": "call_1",
                        "name": "delete_files",
                        "arguments": {"path": "/tmp/x"},
                    },
                ],
            )
            # The tool waits for approval (its message stays open: a message closes
            # only once its tools are finished), with its interaction part.
            await tool_transition(
                db,
                session,
                message,
                tool_call_id="call_1",
                status="awaiting_approval",
                interaction={
                    "interaction_id": "interaction_1",
                    "kind": "approval",
                    "status": "pending",
                    "prompt": "Delete /tmp/x?",
                },
            )
        async with database.write() as db:
            session = await lock_session(db, session_id)
            assert session is not None
            await append_actions(
                db,
                session,
                turn_id=None,
                parts=[
                    action_part(
                        "approval_mode_changed",
                        "Approval mode set to ask",
                        {"field": "approval_mode", "old": None, "new": "ask"},
                    )
                ],
            )
    finally:
        await database.dispose()
    return format_id("session", session_id)


async def test_interactions_actions_and_user_parts_render(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await seed_agent_parts(live_server.env["DATABASE_URL"])
    await post(
        api,
        session_id,
        {
            "message": {
                "content": [
                    {"type": "context", "tag": "reference", "context": "Earlier <b>"},
                    {"type": "image", "base64": PIXEL, "media_type": "image/png"},
                    {"type": "text", "text": "go ahead"},
                ]
            }
        },
    )
    await wait_idle(api, session_id)
    await open_chat(page, live_server.url, session_id)
    await wait_converged(page, api, session_id, open_ok=True)
    first = page.locator("#list > .message").nth(0)
    tool = first.locator('.part[data-type="tool_call"]')
    assert await tool.get_attribute("data-status") == "awaiting_approval"
    interaction = first.locator('.part[data-type="interaction"]')
    assert await interaction.get_attribute("data-status") == "pending"
    assert (await interaction.locator(".prompt").text_content()) == "Delete /tmp/x?"
    buttons = interaction.locator("button[data-decision]")
    assert await buttons.evaluate_all(
        "(bs) => bs.map((b) => [b.dataset.decision, b.disabled, b.title])"
    ) == [["approve", False, ""], ["deny", False, ""]]
    action = page.locator("#list > .message").nth(1).locator(".part.action")
    assert (await action.locator(".tool-name").text_content()) == (
        "Approval mode set to ask"
    )
    assert await action.get_attribute("data-action-type") == "approval_mode_changed"
    assert (await action.locator(".action-state").text_content()) == "completed"
    assert json.loads((await action.locator("pre").text_content()) or "") == {
        "field": "approval_mode",
        "old": None,
        "new": "ask",
    }
    user = page.locator('#list > .message[data-role="user"]')
    assert (await user.locator(".text-context").text_content()) == "Earlier <b>"
    assert (await user.locator(".part.context .label").text_content()) == "<reference>"
    # A base64 image shows (the policy admits data: images), a 1x1 pixel.
    image = user.locator(".part.attachment img")
    assert await image.evaluate("(img) => img.complete && img.naturalWidth") == 1

    # The seed's interaction is no approval the service holds (its id is not even an
    # interaction id): a decision is refused, the refusal is shown beside the
    # buttons, and they stay usable.
    refused = await api.post(
        f"/v1/sessions/{session_id}/interactions/interaction_1",
        json={"decision": "approve"},
    )
    problem = assert_problem(refused, 400, code="invalid_id")
    await interaction.locator('button[data-decision="approve"]').click()
    await interaction.locator(".error-text").wait_for()
    assert await interaction.locator(".error-text").text_content() == (
        f"Not sent: 400 {problem['title']}: {problem['detail']}"
    )
    assert await buttons.evaluate_all("(bs) => bs.map((b) => b.disabled)") == [
        False,
        False,
    ]
    assert await interaction.get_attribute("data-status") == "pending"


# ---- approvals -----------------------------------------------------------------------

# The scripted model's built-in tool, asking before it runs: GUARDED and ASK, as the
# approvals tests use them.


async def ask_for_approval(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> tuple[str, "Locator"]:
    """A session whose tool needs approval, open in the page, whose turn has asked
    for it: the session's id and the pending interaction as the page shows it."""
    created = await api.post(
        "/v1/sessions",
        json={"title": "approvals", "tools": [GUARDED], "approval_mode": "ask"},
    )
    assert created.status_code == 201, created.text
    session_id: str = created.json()["id"]
    await open_chat(page, live_server.url, session_id)
    await send(page, ASK)
    interaction = page.locator('#list .part[data-type="interaction"]')
    await interaction.locator("button[data-decision]").first.wait_for()
    # What the page shows is the approval the API lists: pending, its tool waiting.
    listed = await api.get(
        f"/v1/sessions/{session_id}/interactions", params={"status": "pending"}
    )
    (pending,) = listed.json()["data"]
    shown_id = await interaction.get_attribute("data-interaction-id")
    assert shown_id == pending["interaction_id"]
    assert await interaction.get_attribute("data-status") == "pending"
    tool = page.locator('#list .part[data-type="tool_call"]')
    assert await tool.get_attribute("data-status") == "awaiting_approval"
    buttons = interaction.locator("button[data-decision]")
    assert await buttons.evaluate_all("(bs) => bs.map((b) => b.disabled)") == [
        False,
        False,
    ]
    await wait_converged(page, api, session_id, open_ok=True)
    return session_id, interaction


async def decided(
    page: "Page", api: httpx.AsyncClient, session_id: str, status: str
) -> list[dict[str, Any]]:
    """Waits until the page shows the finished turn as the API lists it; checks that
    the interaction shows `status`, without buttons, as the API has it; the
    messages shown."""
    shown = await wait_converged(page, api, session_id)
    await wait_idle(api, session_id)
    assert [m["role"] for m in shown] == ["user", "agent"]
    interaction = page.locator('#list .part[data-type="interaction"]')
    assert await interaction.get_attribute("data-status") == status
    assert await interaction.locator("button").count() == 0
    assert await interaction.locator(".error-text").count() == 0
    listed = await api.get(f"/v1/sessions/{session_id}/interactions")
    assert [i["status"] for i in listed.json()["data"]] == [status]
    return shown


async def test_approve_runs_the_tool_and_the_turn_completes(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id, interaction = await ask_for_approval(page, live_server, api)
    await interaction.locator('button[data-decision="approve"]').click()
    shown = await decided(page, api, session_id, "approved")
    assert shown[1]["text"].endswith(
        'The lookup tool returned {"query": "tea", "answer": 42}.'
    )
    tool = page.locator('#list .part[data-type="tool_call"]')
    assert await tool.get_attribute("data-status") == "completed"
    assert json.loads(
        (await tool.locator(".tool-result pre").text_content()) or ""
    ) == {"query": "tea", "answer": 42}
    # The decision in words.
    decision = page.locator('#list .part[data-type="interaction"] .decision')
    assert (await decision.text_content()) == "Approved"


async def test_deny_fails_the_tool_and_the_model_answers_so(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id, interaction = await ask_for_approval(page, live_server, api)
    await interaction.locator('button[data-decision="deny"]').click()
    shown = await decided(page, api, session_id, "denied")
    # The page sends no reason: the model sees the denial alone.
    assert shown[1]["text"].endswith(
        "The lookup tool failed: The user denied this tool call"
    )
    tool = page.locator('#list .part[data-type="tool_call"]')
    assert await tool.get_attribute("data-status") == "failed"
    assert (await tool.locator(".tool-result .error-text").text_content()) == (
        "The user denied this tool call"
    )
    decision = page.locator('#list .part[data-type="interaction"] .decision')
    assert (await decision.text_content()) == "Denied"


# ---- escaping ----------------------------------------------------------------------------

XSS = (
    "<img src=x onerror=\"window.__xss='img'\">"
    "<script>window.__xss='script'</script>"
    "<a href=\"javascript:window.__xss='link'\">click</a> & &amp;"
)


async def test_markup_in_titles_and_messages_renders_as_text(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api, title=XSS)
    await post(api, session_id, text_body(XSS))
    await wait_idle(api, session_id)
    await page.goto(f"{live_server.url}/sessions")
    row = page.locator(f'tr[data-session-id="{session_id}"]')
    assert (await row.locator("a").text_content()) == XSS
    assert (await page.locator("#rows img, #rows script").count()) == 0
    await open_chat(page, live_server.url, session_id)
    shown = await wait_converged(page, api, session_id)
    # The user's text, and the agent's echo of it, word for word.
    assert [m["text"] for m in shown] == [XSS, XSS]
    assert (await page.locator("#title").text_content()) == XSS
    assert (await page.locator("#list img, #list script, #list a").count()) == 0
    await page.locator("#list .text-body").first.click()
    assert await page.evaluate("() => window.__xss") is None


async def test_an_unknown_session_says_so(page: "Page", live_server: Server) -> None:
    missing = format_id("session", uuid.uuid4())
    await page.goto(f"{live_server.url}/sessions/{missing}/chat")
    await page.wait_for_selector("#title:text('Session not found')")
    assert await page.get_attribute("#status", "data-status") == "closed"
    assert f"Session {missing} not found" in (
        await page.locator("#notice").text_content() or ""
    )
    assert await page.is_disabled("#text")
    assert await page.is_disabled("#send")


# ---- feedback, pin and archive ---------------------------------------------------------


async def test_thumbs_rate_an_answer_and_survive_a_reload(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    await send(page, "rate me")
    await wait_converged(page, api, session_id)
    agent = page.locator('#list > .message[data-role="agent"]')
    # Only finished agent messages carry the buttons.
    assert (
        await page.locator('#list > .message[data-role="user"] .feedback').count() == 0
    )
    good = agent.locator('.rate[data-rating="good"]')
    await good.click()
    await page.wait_for_selector('.rate[data-rating="good"][aria-pressed="true"]')

    async def stored() -> list[str | None]:
        answer = await api.get(f"/v1/sessions/{session_id}/feedback")
        return [row["rating"] for row in answer.json()["data"]]

    async def rated_good() -> bool:
        return await stored() == ["good"]

    async def taken_back() -> bool:
        return await stored() == []

    await wait_until(rated_good, "the rating stored")
    await page.reload()
    await page.wait_for_selector('.rate[data-rating="good"][aria-pressed="true"]')
    assert (
        await agent.locator('.rate[data-rating="bad"]').get_attribute("aria-pressed")
        == "false"
    )
    # Pressing the given rating again takes it back.
    await agent.locator('.rate[data-rating="good"]').click()
    await page.wait_for_selector('.rate[data-rating="good"][aria-pressed="false"]')
    await wait_until(taken_back, "the rating taken back")


async def test_the_list_pins_and_archives(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api, title="to archive")
    await page.goto(f"{live_server.url}/sessions")
    row = page.locator(f'tr[data-session-id="{session_id}"]')
    await row.locator("button.mark.pin").click()
    await page.wait_for_selector(
        f'tr[data-session-id="{session_id}"][data-pinned="true"]'
    )
    assert (await api.get(f"/v1/sessions/{session_id}")).json()["is_pinned"] is True
    await page.locator(
        f'tr[data-session-id="{session_id}"] button.mark.archive'
    ).click()
    await page.wait_for_selector(
        f'tr[data-session-id="{session_id}"]', state="detached"
    )
    assert "archived_at" in (await api.get(f"/v1/sessions/{session_id}")).json()
    await page.check("#archived")
    archived = page.locator(f'tr[data-session-id="{session_id}"][data-archived="true"]')
    await archived.wait_for()
    await archived.locator("button.mark.archive").click()
    await page.wait_for_selector(
        f'tr[data-session-id="{session_id}"]', state="detached"
    )
    assert "archived_at" not in (await api.get(f"/v1/sessions/{session_id}")).json()


async def test_search_lists_sessions_by_message_text_and_shows_the_messages(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api, title="fruit")
    await post(api, session_id, text_body(f"buy a mangosteen {XSS}"))
    await wait_idle(api, session_id)
    await new_session(api, title="other")
    await page.goto(f"{live_server.url}/sessions")
    await page.fill("#search-input", "mangosteen")
    await page.click("#search button[type=submit]")
    await page.wait_for_selector("#hits:not([hidden]) #hit-list li")
    rows = page.locator("#rows tr")
    await page.wait_for_function(
        "() => document.querySelectorAll('#rows tr').length === 1"
    )
    assert await rows.first.get_attribute("data-session-id") == session_id
    hits = page.locator("#hit-list li")
    assert await hits.count() == 2  # the message and the agent's echo of it
    assert {await hits.nth(i).get_attribute("data-session-id") for i in range(2)} == {
        session_id
    }
    assert await hits.first.locator("mark").all_text_contents() == ["mangosteen"]
    snippet = await hits.first.locator(".snippet").text_content()
    assert snippet is not None
    assert snippet.startswith("buy a mangosteen <img src=x")
    assert (
        await page.locator(
            "#hit-list img, #hit-list script, #hit-list a[href^=javascript]"
        ).count()
        == 0
    )
    assert await page.evaluate("() => window.__xss") is None
    # A search without a word in it lists by title alone and shows no messages.
    await page.fill("#search-input", "!!!")
    await page.click("#search button[type=submit]")
    await page.wait_for_selector("#hits", state="hidden")


# ---- Markdown ----------------------------------------------------------------------------

MARKDOWN = (
    "# Plan\n\n**bold** and `code`, a [site](https://example.com/a) and "
    "[a trap](javascript:window.__xss='md') <b onclick=\"window.__xss='b'\">raw</b>\n\n"
    "- one\n- two\n\n```\nblock\n```\n\n| a | b |\n|--:|:--|\n| 1 | 2 |"
)


async def test_a_finished_agent_text_renders_as_markdown_and_nothing_else_does(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await post(api, session_id, text_body(MARKDOWN))
    await wait_idle(api, session_id)
    await open_chat(page, live_server.url, session_id)
    shown = await wait_converged(page, api, session_id)
    assert [m["text"] for m in shown] == [MARKDOWN, MARKDOWN]
    agent = page.locator('#list > .message[data-role="agent"] .text-body')
    user = page.locator('#list > .message[data-role="user"] .text-body')
    # The user's words as typed; the agent's rendered.
    assert (await user.text_content()) == MARKDOWN
    assert await agent.get_attribute("class") == "text-body markdown"
    assert (await agent.locator("h1").text_content()) == "Plan"
    assert (await agent.locator("strong").text_content()) == "bold"
    assert (await agent.locator("p code").text_content()) == "code"
    assert (await agent.locator("li").all_text_contents()) == ["one", "two"]
    assert (await agent.locator("pre code").text_content()) == "block\n"
    assert (await agent.locator("td").all_text_contents()) == ["1", "2"]
    assert (await agent.locator("[style]").count()) == 0
    # Links: http(s) only, opening elsewhere; raw HTML shows as text.
    links = agent.locator("a")
    assert (await links.count()) == 1
    assert await links.get_attribute("href") == "https://example.com/a"
    assert await links.get_attribute("target") == "_blank"
    assert await links.get_attribute("rel") == "noopener noreferrer"
    assert (await agent.locator("b, script, img, [onclick]").count()) == 0
    assert '<b onclick="window.__xss=' in (await agent.text_content() or "")
    await agent.locator("p").first.click()
    assert await page.evaluate("() => window.__xss") is None


# ---- settings, delete, client-side tools, an empty session -------------------------------


async def test_settings_rename_and_change_what_the_turn_runs_with(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api, title="before")
    await open_chat(page, live_server.url, session_id)
    await page.click("#settings-toggle")
    assert await page.input_value("#set-title") == "before"
    assert await page.input_value("#set-approval") == "ask"
    # The catalog's models are offered beside the default.
    models = (await api.get("/v1/models")).json()["data"]
    await page.wait_for_function(
        f"() => document.querySelectorAll('#set-model option').length === {len(models) + 1}"
    )
    options = await page.locator("#set-model option").evaluate_all(
        "(os) => os.map((o) => o.value)"
    )
    assert options == ["", *[m["id"] for m in models]]
    await page.fill("#set-title", "after")
    await page.select_option("#set-model", models[0]["id"])
    await page.select_option("#set-approval", "always-allow")
    await page.fill("#set-prompt", "Answer briefly.")
    await page.click("#save-settings")
    await page.wait_for_selector("#settings-state:text('Saved.')")
    assert (await page.locator("#title").text_content()) == "after"
    session = (await api.get(f"/v1/sessions/{session_id}")).json()
    assert session["title"] == "after"
    assert session["approval_mode"] == "always-allow"
    assert session["system_prompt"] == "Answer briefly."
    assert session["model_id"] == models[0]["id"]
    # The changes are Actions in the conversation, shown live.
    actions = page.locator('#list .part[data-type="action"]')
    await actions.first.wait_for()
    await page.wait_for_function(
        "() => document.querySelectorAll('#list .part[data-type=\"action\"]').length === 3"
    )
    kinds = await actions.evaluate_all("(ps) => ps.map((p) => p.dataset.actionType)")
    assert sorted(kinds) == [
        "approval_mode_changed",
        "model_changed",
        "system_prompt_changed",
    ]
    await page.click("#save-settings")
    await page.wait_for_selector("#settings-state:text('Nothing changed.')")


async def test_delete_asks_twice_then_leaves_for_the_list(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    await page.click("#settings-toggle")
    await page.click("#delete-session")
    assert (await api.get(f"/v1/sessions/{session_id}")).status_code == 200
    assert "Really delete" in (
        await page.locator("#delete-session").text_content() or ""
    )
    await page.click("#delete-session")
    await page.wait_for_url(f"{live_server.url}/sessions")
    assert (await api.get(f"/v1/sessions/{session_id}")).status_code == 404


async def test_a_client_side_tool_is_answered_from_its_form(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    tool = {
        "name": "get_location",
        "type": "client_side",
        "parameters": {"type": "object"},
    }
    created = await api.post("/v1/sessions", json={"tools": [tool]})
    session_id = created.json()["id"]
    await open_chat(page, live_server.url, session_id)
    await send(page, "/scenario call get_location {}")
    form = page.locator('#list .part[data-type="tool_call"] .tool-answer')
    await form.wait_for()
    await form.locator("textarea").fill("not json")
    await form.locator(".send-result").click()
    assert "Not JSON" in (await form.locator(".error-text").text_content() or "")
    await form.locator("textarea").fill('{"city": "Riga"}')
    await form.locator(".send-result").click()
    shown = await decided_turn(page, api, session_id)
    assert shown[-1]["text"].endswith('returned {"city": "Riga"}.')
    assert await page.locator(".tool-answer").count() == 0


async def decided_turn(
    page: "Page", api: httpx.AsyncClient, session_id: str
) -> list[dict[str, Any]]:
    await wait_idle(api, session_id)
    return await wait_converged(page, api, session_id)


async def test_an_empty_session_offers_scenarios(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await open_chat(page, live_server.url, session_id)
    await page.wait_for_selector("#empty:not([hidden])")
    await page.click('#empty [data-scenario="/scenario reasoning"]')
    assert await page.input_value("#text") == "/scenario reasoning"
    await page.click("#send")
    await page.wait_for_selector("#empty", state="hidden")


async def opened_turn_details(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> tuple[str, "Locator"]:
    """A turn that ran a tool, shown, its details opened once their events are read:
    the session and the details."""
    session_id = await new_session(api)
    await post(api, session_id, text_body("/scenario tool tea"))
    await wait_idle(api, session_id)
    await open_chat(page, live_server.url, session_id)
    await wait_converged(page, api, session_id)
    details = page.locator("#list .turn-details")
    assert await details.count() == 1
    await details.locator("summary").first.click()
    await details.locator(".turn-events li").first.wait_for()
    return session_id, details


async def test_a_turns_details_come_from_its_events(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id, details = await opened_turn_details(page, live_server, api)
    facts = dict(
        zip(
            await details.locator(".turn-facts dt").all_text_contents(),
            await details.locator(".turn-facts dd").all_text_contents(),
            strict=True,
        )
    )
    assert facts["Model"] == "scripted"
    assert facts["Outcome"] == "completed"
    assert facts["Steps"] == "2"
    assert facts["Tool calls"] == "1"
    turn_id = await details.get_attribute("data-turn-id")
    listed = (
        await api.get(
            f"/v1/sessions/{session_id}/events",
            params={"turn_id": turn_id, "limit": 1000},
        )
    ).json()["data"]
    shown = await details.locator(".turn-events li").evaluate_all(
        "(items) => items.map((i) => i.dataset.type)"
    )
    assert shown == [e["type"] for e in listed]
    assert "tool.completed" in shown
    last = details.locator(".turn-events li").last
    await last.locator("summary").click()
    assert (
        json.loads(await last.locator("pre").text_content() or "") == listed[-1]["data"]
    )


async def test_opened_turn_details_stay_open_when_the_message_updates(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    _, details = await opened_turn_details(page, live_server, api)
    shown = await details.locator(".turn-events li").count()
    # Rating the answer renders its message again.
    await page.locator('#list .rate[data-rating="good"]').click()
    await page.wait_for_selector('.rate[data-rating="good"][aria-pressed="true"]')
    assert await details.evaluate("(node) => node.open")
    assert await details.locator(".turn-events li").count() == shown


# ---- branches ----------------------------------------------------------------------------


async def moved_from(page: "Page", session_id: str) -> str:
    """Waits until the page shows another session's chat; that session's id."""
    chat = re.compile(r"/sessions/(session_[0-9a-f]{32})/chat$")

    def elsewhere(url: str) -> bool:
        found = chat.search(url)
        return found is not None and found.group(1) != session_id

    await page.wait_for_url(elsewhere)
    found = chat.search(page.url)
    assert found is not None
    return found.group(1)


async def test_regenerate_and_edit_move_to_a_branch_that_links_back(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await post(api, session_id, text_body("the question"))
    await wait_idle(api, session_id)
    await open_chat(page, live_server.url, session_id)
    await wait_converged(page, api, session_id)
    assert await page.is_hidden("#branch-of")
    await page.click("#list .message[data-role='agent'] button.regenerate")
    regenerated = await moved_from(page, session_id)
    assert regenerated != session_id
    await wait_idle(api, regenerated)
    shown = await wait_converged(page, api, regenerated)
    assert [m["text"] for m in shown] == ["the question", "the question"]
    source_link = page.locator("#branch-of")
    await source_link.wait_for()
    assert (
        await source_link.get_attribute("href")
    ) == f"../../sessions/{session_id}/chat"
    # Edit: the question goes to the message box; sending asks it in another branch.
    await page.click("#list .message[data-role='user'] button.edit")
    assert await page.input_value("#text") == "the question"
    assert await page.is_visible("#editing")
    await page.fill("#text", "a better question")
    await page.click("#send")
    edited = await moved_from(page, regenerated)
    assert edited not in (session_id, regenerated)
    await wait_idle(api, edited)
    shown = await wait_converged(page, api, edited)
    assert [m["text"] for m in shown] == ["a better question", "a better question"]
    # Each source lists its branch (the edit was made on the regenerated branch).
    for source, branch in ((session_id, regenerated), (regenerated, edited)):
        await page.goto(f"{live_server.url}/sessions/{source}/chat")
        await page.locator("#branches a").first.wait_for()
        listed = await page.locator("#branches a").evaluate_all(
            "(links) => links.map((a) => a.dataset.sessionId)"
        )
        assert listed == [branch]
    # Neither branch changed what it came from.
    for untouched in (session_id, regenerated):
        messages = await api_messages(api, untouched)
        assert [m["text"] for m in messages] == ["the question", "the question"]


async def test_export_downloads_the_session_as_json_lines(
    page: "Page", live_server: Server, api: httpx.AsyncClient
) -> None:
    session_id = await new_session(api)
    await post(api, session_id, text_body("keep this"))
    await wait_idle(api, session_id)
    await open_chat(page, live_server.url, session_id)
    await page.click("#settings-toggle")
    async with page.expect_download() as waiting:
        await page.click("#export-session")
    download = await waiting.value
    assert download.suggested_filename == f"{session_id}.jsonl"
    path = await download.path()
    expected = await api.get(f"/v1/sessions/{session_id}/export")
    assert path is not None
    saved = await asyncio.to_thread(Path(path).read_bytes)
    assert saved == expected.content
    assert (await page.locator("#settings-state").text_content()) == "Exported."
