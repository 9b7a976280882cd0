"""Size caps: every free-text and JSON field has a documented cap (a fixed one in the
OpenAPI document, or a setting), every list response stops at MAX_LIST_BYTES and says
where the rest continues, and no error detail echoes a huge input."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.db.session import Database
from app.schemas import (
    MAX_LABEL_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    MAX_URL_CHARS,
)
from app.settings import Settings
from tests.support.api import create_session, post_message, text_body
from tests.support.database import table_rows
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle

MAX_TEXT = 300
LIST_BYTES = 6000
HEX32 = "0123456789abcdef0123456789abcdef"


@dataclass
class Api:
    client: httpx.AsyncClient
    database: Database
    sid: str

    async def unchanged(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        before = await table_rows(self.database)
        response = await asyncio.wait_for(
            self.client.request(method, url, **kwargs), 20
        )
        assert await table_rows(self.database) == before, (
            f"{method} {url} -> {response.status_code} changed the database"
        )
        return response


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """Small configurable caps: MAX_TEXT_CHARS and MAX_LIST_BYTES."""
    small = make_settings(
        settings.database_url, max_text_chars=MAX_TEXT, max_list_bytes=LIST_BYTES
    )
    async with running_app(small) as running:
        sid = await create_session(running.client, "caps")
        yield Api(running.client, running.app.state.app.database, sid)


# ---- field caps ----------------------------------------------------------------------------


def message_body(field: str, value: Any) -> dict[str, Any]:
    """A message body with `value` in `field`."""
    parts = {
        "image.url": {"type": "image", "url": value},
        "image.media_type": {"type": "image", "base64": "AA==", "media_type": value},
        "file.filename": {
            "type": "file",
            "file_id": f"file_{HEX32}",
            "filename": value,
        },
    }
    if field in parts:
        return {"message": {"content": [parts[field]]}}
    actor = {"actor_id": "a", "source": "s"}
    if field.startswith("external_actor."):
        return text_body(external_actor={**actor, field.split(".")[1]: value})
    if field.startswith("controls."):
        return text_body(controls={field.split(".")[1]: value})
    return text_body(**{field: value})


# (field, the longest accepted value, where a too long one is named)
MESSAGE_CAPS: list[tuple[str, int, str]] = [
    ("image.url", MAX_URL_CHARS, "message.content.0.image.url"),
    ("image.media_type", MAX_LABEL_CHARS, "message.content.0.image.media_type"),
    ("file.filename", MAX_LABEL_CHARS, "message.content.0.file.filename"),
    ("external_actor.actor_id", MAX_LABEL_CHARS, "external_actor.actor_id"),
    ("external_actor.source", MAX_LABEL_CHARS, "external_actor.source"),
    ("external_actor.actor_name", MAX_LABEL_CHARS, "external_actor.actor_name"),
    ("controls.locale", MAX_LABEL_CHARS, "controls.locale"),
    ("controls.speed", MAX_LABEL_CHARS, "controls.speed"),
    ("client_message_id", 200, "client_message_id"),
]


@pytest.mark.parametrize(("field", "cap", "where"), MESSAGE_CAPS)
async def test_message_field_over_its_cap_is_422(
    api: Api, field: str, cap: int, where: str
) -> None:
    url = f"/v1/sessions/{api.sid}/messages"
    response = await api.unchanged(
        "POST", url, json=message_body(field, "x" * (cap + 1))
    )
    problem = assert_problem(response, 422, code="validation_error")
    assert problem["detail"].startswith(f"{where}: "), problem
    assert str(cap) in problem["detail"]
    response = await api.client.post(url, json=message_body(field, "x" * cap))
    assert response.status_code == 201, response.text
    await wait_idle(api.client, api.sid)


async def test_message_tags_are_capped_in_number_and_length(api: Api) -> None:
    url = f"/v1/sessions/{api.sid}/messages"
    for tags, where in (
        (["t"] * (MAX_TAGS + 1), "tags: "),
        (["ok", "x" * (MAX_TAG_CHARS + 1)], "tags.1: "),
    ):
        response = await api.unchanged("POST", url, json=text_body(tags=tags))
        problem = assert_problem(response, 422, code="validation_error")
        assert problem["detail"].startswith(where), problem
    tags = ["x" * MAX_TAG_CHARS] * MAX_TAGS
    response = await api.client.post(url, json=text_body(tags=tags))
    assert response.status_code == 201, response.text
    assert response.json()["metadata"]["tags"] == tags
    await wait_idle(api.client, api.sid)


SESSION_CAPS: list[tuple[str, int]] = [
    ("title", MAX_TITLE_CHARS),
    ("locale", MAX_LABEL_CHARS),
    ("agent_name", MAX_LABEL_CHARS),
    ("harness_name", MAX_LABEL_CHARS),
    # Configurable: MAX_TEXT_CHARS.
    ("goal", MAX_TEXT),
    ("system_prompt", MAX_TEXT),
]


# The fields a session echoes on the wire (agent and harness names are not).
ECHOED = {"title", "locale", "goal", "system_prompt"}


@pytest.mark.parametrize(("field", "cap"), SESSION_CAPS)
async def test_session_field_over_its_cap_is_422(
    api: Api, field: str, cap: int
) -> None:
    routes = [("POST", "/v1/sessions")]
    if field in ("title", "goal", "locale"):
        routes.append(("PATCH", f"/v1/sessions/{api.sid}"))
    for method, url in routes:
        response = await api.unchanged(method, url, json={field: "x" * (cap + 1)})
        problem = assert_problem(response, 422, code="validation_error")
        assert problem["detail"].startswith(f"{field}: "), problem
        assert str(cap) in problem["detail"]
        response = await api.client.request(method, url, json={field: "y" * cap})
        assert response.status_code in (200, 201), response.text
        if field in ECHOED:
            assert response.json()[field] == "y" * cap


async def test_message_text_is_capped_by_max_text_chars(api: Api) -> None:
    url = f"/v1/sessions/{api.sid}/messages"
    response = await api.unchanged("POST", url, json=text_body("x" * (MAX_TEXT + 1)))
    problem = assert_problem(response, 422, code="validation_error")
    assert problem["detail"].startswith("message.content.0.text: "), problem


# ---- list responses: a byte cap and a way to page on ---------------------------------------


async def test_sessions_list_stops_at_the_byte_cap_and_pages_on(api: Api) -> None:
    """Sessions of ~1 KB each under a 6 KB cap: a page of 20 holds only a few; its
    `limit` says how many, and both `next_url` and `offset + limit` walk every session
    exactly once, newest first."""
    client = api.client
    created = [api.sid]
    for index in range(11):
        response = await client.post(
            "/v1/sessions", json={"title": f"big {index}", "goal": "g" * MAX_TEXT}
        )
        assert response.status_code == 201, response.text
        created.append(response.json()["id"])
    newest_first = created[::-1]

    first = await client.get("/v1/sessions", params={"limit": 20})
    assert first.status_code == 200
    page = first.json()
    assert len(first.content) <= LIST_BYTES + 500, len(first.content)
    assert 0 < len(page["data"]) < len(created)
    assert page["limit"] == len(page["data"])
    assert page["total"] == len(created)

    seen: list[str] = []
    url: str | None = "/v1/sessions?limit=20"
    while url is not None:
        body = (await client.get(url)).json()
        assert body["data"], body
        seen.extend(s["id"] for s in body["data"])
        url = body.get("next_url")
    assert seen == newest_first

    seen = []
    offset = 0
    while offset < len(created):
        body = (
            await client.get("/v1/sessions", params={"offset": offset, "limit": 20})
        ).json()
        seen.extend(s["id"] for s in body["data"])
        offset += body["limit"]
    assert seen == newest_first


async def test_a_session_larger_than_the_cap_is_still_listed(api: Api) -> None:
    """A page always holds at least one item, so paging makes progress."""
    big = "m" * (LIST_BYTES // 4)
    for _ in range(2):
        response = await api.client.post(
            "/v1/sessions", json={"metadata": {"a": big, "b": big, "c": big, "d": big}}
        )
        assert response.status_code == 201, response.text
    body = (await api.client.get("/v1/sessions")).json()
    assert len(body["data"]) == 1
    assert body["limit"] == 1
    assert "next_url" in body
    assert body["total"] == 3


async def test_messages_page_stops_at_the_byte_cap_and_pages_on(api: Api) -> None:
    client = api.client
    for index in range(8):
        await post_message(client, api.sid, f"{index} " + "w" * (MAX_TEXT - 10))
        await wait_idle(client, api.sid)
    everything: list[int] = []
    url = f"/v1/sessions/{api.sid}/messages"
    params: dict[str, Any] = {"limit": 200}
    pages = 0
    while True:
        pages += 1
        response = await client.get(url, params=params)
        assert response.status_code == 200
        assert len(response.content) <= LIST_BYTES + 2000, len(response.content)
        page = response.json()
        sequences = [m["sequence"] for m in page["data"]]
        assert sequences == sorted(sequences)
        assert sequences
        assert page["start_sequence"] == sequences[0]
        everything = sequences + everything
        if not page["has_more"]:
            break
        assert page["next_before_sequence"] == sequences[0]
        params = {"limit": 200, "before_sequence": page["next_before_sequence"]}
    assert pages > 1
    assert len(everything) == 16 == page["total"]
    assert len(set(everything)) == len(everything)
    # Both paths answer the same page: the hot path (canonical query) and FastAPI.
    hot = await client.get(url, params={"limit": 200})
    routed = await client.get(url, params={"limit": "0200"})
    assert hot.content == routed.content
    assert hot.json()["has_more"] is True


async def test_events_stop_at_the_byte_cap_and_page_on(api: Api) -> None:
    client = api.client
    for index in range(6):
        await post_message(client, api.sid, f"{index} " + "e" * (MAX_TEXT - 10))
        await wait_idle(client, api.sid)
    url = f"/v1/sessions/{api.sid}/events"
    last_sequence = (await client.get(f"/v1/sessions/{api.sid}/messages")).json()[
        "cursor"
    ]

    # Forward, without `limit`: continue with `after_sequence`.
    forward: list[int] = []
    params: dict[str, Any] = {}
    pages = 0
    while True:
        response = await client.get(url, params=params)
        assert response.status_code == 200
        assert len(response.content) <= LIST_BYTES + 2000, len(response.content)
        body = response.json()
        forward.extend(e["sequence"] for e in body["data"])
        pages += 1
        if "has_more" not in body:
            assert "next_after_sequence" not in body
            break
        assert body["has_more"] is True
        assert body["next_after_sequence"] == body["data"][-1]["sequence"]
        params = {"after_sequence": body["next_after_sequence"]}
    assert pages > 1
    assert forward == list(range(1, int(last_sequence) + 1))

    # The last N: continue backwards with `before_sequence`.
    backward: list[int] = []
    params = {"limit": 1000}
    while True:
        response = await client.get(url, params=params)
        body = response.json()
        assert response.headers["x-total-count"]
        backward = [e["sequence"] for e in body["data"]] + backward
        if "has_more" not in body:
            break
        assert body["next_before_sequence"] == body["data"][0]["sequence"]
        params = {"limit": 1000, "before_sequence": body["next_before_sequence"]}
    assert backward == forward


async def test_lists_under_the_cap_keep_their_plain_shape(api: Api) -> None:
    await post_message(api.client, api.sid, "small")
    await wait_idle(api.client, api.sid)
    events = (await api.client.get(f"/v1/sessions/{api.sid}/events")).json()
    assert set(events) == {"data"}
    sessions = (await api.client.get("/v1/sessions")).json()
    assert sessions["limit"] == 20
    assert "next_url" not in sessions


# ---- error details do not echo huge inputs --------------------------------------------------

HUGE = 60_000


async def test_problem_details_do_not_echo_huge_inputs(api: Api) -> None:
    huge = "z" * HUGE
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("GET", f"/v1/sessions/{huge}", {}, 400),
        ("GET", f"/v1/sessions/sess{huge}_x", {}, 400),
        ("GET", f"/v1/{huge}", {}, 404),
        ("PUT", f"/v1/sessions/{api.sid}/{huge}", {}, 404),
        ("GET", "/v1/sessions", {"params": {"status": huge}}, 400),
        ("GET", f"/v1/sessions/{api.sid}/events", {"params": {"types": huge}}, 400),
        (
            "GET",
            f"/v1/sessions/{api.sid}/events",
            {"params": {"since_id": f"x{huge}_1"}},
            400,
        ),
        ("POST", "/v1/sessions", {"json": {"metadata": {huge + "\x00": 1}}}, 422),
        # 30 offending tags: the problem lists 20 of them.
        ("POST", "/v1/sessions", {"json": {"tags": ["\x00" + "t" * 20_000] * 30}}, 422),
    ]
    for method, url, kwargs, status in cases:
        response = await api.unchanged(method, url, **kwargs)
        problem = assert_problem(response, status)
        assert len(response.content) < 8000, (url[:80], len(response.content))
        assert len(problem["detail"]) <= 1000
        assert "instance" not in problem or len(problem["instance"]) <= 2048
        assert len(problem.get("errors", ())) <= 20
