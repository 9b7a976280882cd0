"""`client_message_id` is a strict idempotency key: the same key with the same body is
the stored message (`delivery: duplicate`, nothing written), with a different body a
409 that names what differs, and nothing written either."""

from typing import Any

import httpx
import pytest

from tests.support.api import create_session
from tests.support.database import table_rows
from tests.support.in_process import Running
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle
from tests.test_approvals import ASK, first_pending, guarded_session

ORIGINAL: dict[str, Any] = {
    "message": {"content": [{"type": "text", "text": "hello"}]},
    "controls": {"locale": "uk-UA", "hints": {"rich": True}},
    "metadata": {"k": "v"},
    "tags": ["a"],
    "external_actor": {"actor_id": "U1", "source": "slack"},
    "client_message_id": "retry-1",
}


async def post(
    client: httpx.AsyncClient, sid: str, body: dict[str, Any]
) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/messages", json=body)


async def stored_session(running: Running) -> tuple[str, dict[str, Any]]:
    client = running.client
    sid = await create_session(client, "idempotency")
    first = await post(client, sid, ORIGINAL)
    assert first.status_code == 201, first.text
    assert first.json()["delivery"] == "started"
    await wait_idle(client, sid)
    return sid, first.json()


async def test_same_key_and_body_is_the_stored_message(running: Running) -> None:
    sid, first = await stored_session(running)
    database = running.app.state.app.database
    before = await table_rows(database)
    # Unknown fields are ignored, so they are no part of "the same body".
    again = await post(running.client, sid, {**ORIGINAL, "unknown": [1, 2]})
    assert again.status_code == 201, again.text
    assert again.json() == {**first, "delivery": "duplicate"}
    assert await table_rows(database) == before


DIFFERENT: list[tuple[str, dict[str, Any], str]] = [
    (
        "text",
        {"message": {"content": [{"type": "text", "text": "hello!"}]}},
        "message.content",
    ),
    (
        "parts",
        {
            "message": {
                "content": [
                    {"type": "text", "text": "hello"},
                    {"type": "text", "text": "more"},
                ]
            }
        },
        "message.content",
    ),
    (
        "visibility",
        {"message": {**ORIGINAL["message"], "visibility": "internal"}},
        "message.visibility",
    ),
    ("controls", {"controls": {"locale": "en-GB"}}, "controls"),
    ("no controls", {"controls": None}, "controls"),
    ("metadata", {"metadata": {"k": "w"}}, "metadata"),
    ("tags", {"tags": ["b"]}, "tags"),
    (
        "actor",
        {"external_actor": {"actor_id": "U2", "source": "slack"}},
        "external_actor",
    ),
]


@pytest.mark.parametrize(
    ("change", "names"),
    [(c, n) for _, c, n in DIFFERENT],
    ids=[i for i, _, _ in DIFFERENT],
)
async def test_same_key_with_another_body_is_409_naming_the_difference(
    running: Running, change: dict[str, Any], names: str
) -> None:
    sid, first = await stored_session(running)
    database = running.app.state.app.database
    before = await table_rows(database)
    response = await post(running.client, sid, {**ORIGINAL, **change})
    problem = assert_problem(response, 409, code="client_message_id_conflict")
    assert "'retry-1'" in problem["detail"], problem
    assert first["id"] in problem["detail"], problem
    assert f"({names} differ)" in problem["detail"], problem
    assert await table_rows(database) == before


async def test_the_409_names_every_field_that_differs(running: Running) -> None:
    sid, _ = await stored_session(running)
    body = {
        **ORIGINAL,
        "message": {"content": [{"type": "text", "text": "other"}]},
        "metadata": {"other": 1},
    }
    problem = assert_problem(await post(running.client, sid, body), 409)
    assert "(message.content, metadata differ)" in problem["detail"], problem


async def test_a_key_is_per_session(running: Running) -> None:
    await stored_session(running)
    other = await create_session(running.client, "other")
    body = {**ORIGINAL, "message": {"content": [{"type": "text", "text": "other"}]}}
    response = await post(running.client, other, body)
    assert response.status_code == 201, response.text
    assert response.json()["delivery"] == "started"
    await wait_idle(running.client, other)


async def test_a_retry_while_its_turn_runs_is_the_stored_message(
    running: Running,
) -> None:
    """Steering a running turn, the checkpoint itself finds a repeated key (no look-up
    first): the same body is the stored message and a different one is 409, and
    neither writes anything."""
    client = running.client
    database = running.app.state.app.database
    sid = await guarded_session(client)
    body = {"message": {"content": [{"type": "text", "text": ASK}]}}
    asking = {**body, "client_message_id": "ask-1"}
    started = await post(client, sid, asking)
    assert started.status_code == 201, started.text
    # The turn waits for an approval: it runs until someone decides.
    await first_pending(client, sid)
    steering = {**ORIGINAL, "client_message_id": "steer-1"}
    first = await post(client, sid, steering)
    assert first.status_code == 201, first.text
    assert first.json()["delivery"] == "steered"
    before = await table_rows(database)

    # The message that started the turn, and one that steered it.
    for retry, original in ((asking, started.json()), (steering, first.json())):
        again = await post(client, sid, retry)
        assert again.status_code == 201, again.text
        assert again.json() == {**original, "delivery": "duplicate"}
        changed = {**retry, "metadata": {"other": 1}}
        problem = assert_problem(
            await post(client, sid, changed), 409, code="client_message_id_conflict"
        )
        assert original["id"] in problem["detail"], problem
    assert await table_rows(database) == before
