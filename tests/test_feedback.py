"""Feedback on messages (`PUT .../messages/{id}/feedback`, `GET .../feedback`): stored per
API key (a caller sees and replaces only its own), removed by no rating and no comment,
refused with problem+json for bad input or another organization's session, deleted with
its session, and counted in /metrics."""

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.auth import create_key
from app.db.session import Database
from app.settings import Settings
from tests.support.api import auth, post_message
from tests.support.database import table_rows
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle

ORG = uuid.UUID(hex="c3" * 16)
OTHER_ORG = uuid.UUID(hex="d4" * 16)


@dataclass
class Keyed:
    client: httpx.AsyncClient
    database: Database
    alice: dict[str, str]
    bob: dict[str, str]
    outsider: dict[str, str]
    session: str
    messages: list[str]

    def url(self, message: str) -> str:
        return f"/v1/sessions/{self.session}/messages/{message}/feedback"

    async def mine(self, who: dict[str, str]) -> list[dict[str, Any]]:
        response = await self.client.get(
            f"/v1/sessions/{self.session}/feedback", headers=who
        )
        assert response.status_code == 200, response.text
        data: list[dict[str, Any]] = response.json()["data"]
        return data


@pytest.fixture
async def keyed(settings: Settings) -> AsyncIterator[Keyed]:
    fresh = make_settings(settings.database_url, auth_cache_seconds=0.0)
    async with running_app(fresh) as running:
        database: Database = running.app.state.app.database
        async with database.write() as db:
            _, alice = await create_key(db, organization_id=ORG, name="alice")
            _, bob = await create_key(db, organization_id=ORG, name="bob")
            _, outsider = await create_key(db, organization_id=OTHER_ORG, name="x")
        client = running.client
        created = await client.post("/v1/sessions", json={}, headers=auth(alice))
        sid = created.json()["id"]
        await post_message(client, sid, "rate my answer", headers=auth(alice))
        await wait_idle(client, sid, headers=auth(alice))
        listed = await client.get(f"/v1/sessions/{sid}/messages", headers=auth(alice))
        messages = [m["id"] for m in listed.json()["data"]]
        yield Keyed(
            client, database, auth(alice), auth(bob), auth(outsider), sid, messages
        )


async def test_each_key_has_feedback_of_its_own(keyed: Keyed) -> None:
    user, agent = keyed.messages
    put = await keyed.client.put(
        keyed.url(agent),
        json={"rating": "good", "comment": "clear answer"},
        headers=keyed.alice,
    )
    assert put.status_code == 200, put.text
    body = put.json()
    assert body["rating"] == "good"
    assert body["comment"] == "clear answer"
    assert body["created_at"] == body["updated_at"]
    assert (body["session_id"], body["message_id"]) == (keyed.session, agent)

    bob = await keyed.client.put(
        keyed.url(agent), json={"rating": "bad"}, headers=keyed.bob
    )
    assert bob.status_code == 200
    assert [(f["message_id"], f["rating"]) for f in await keyed.mine(keyed.alice)] == [
        (agent, "good")
    ]
    assert [(f["rating"], f["comment"]) for f in await keyed.mine(keyed.bob)] == [
        ("bad", None)
    ]

    # A second PUT replaces the first (its creation time kept); feedback lists in the
    # messages' order.
    again = await keyed.client.put(
        keyed.url(agent), json={"rating": "bad"}, headers=keyed.alice
    )
    assert again.json()["created_at"] == body["created_at"]
    await keyed.client.put(
        keyed.url(user), json={"rating": None, "comment": "typo"}, headers=keyed.alice
    )
    mine = await keyed.mine(keyed.alice)
    assert [(f["message_id"], f["rating"], f["comment"]) for f in mine] == [
        (user, None, "typo"),
        (agent, "bad", None),
    ]

    # No rating and no comment: removed.
    removed = await keyed.client.put(
        keyed.url(agent), json={"rating": None}, headers=keyed.alice
    )
    assert removed.status_code == 200
    assert removed.json()["rating"] is None
    assert "created_at" not in removed.json()
    assert [f["message_id"] for f in await keyed.mine(keyed.alice)] == [user]
    assert len(await keyed.mine(keyed.bob)) == 1


async def test_bad_input_changes_nothing(keyed: Keyed) -> None:
    agent = keyed.messages[1]
    before = await table_rows(keyed.database)
    for body, status in (
        ({"rating": "meh"}, 422),
        ({"rating": "good", "comment": "x" * 4001}, 422),
        ({"comment": "no rating field"}, 422),
        ({"rating": "good", "comment": "nul \x00"}, 422),
    ):
        response = await keyed.client.put(
            keyed.url(agent), json=body, headers=keyed.alice
        )
        assert_problem(response, status)
    bad_id = await keyed.client.put(
        keyed.url("message_nope"), json={"rating": "good"}, headers=keyed.alice
    )
    assert_problem(bad_id, 400)
    ghost = await keyed.client.put(
        keyed.url("message_" + "0" * 32), json={"rating": "good"}, headers=keyed.alice
    )
    assert_problem(ghost, 404, code="message_not_found")
    assert await table_rows(keyed.database) == before


async def test_another_organization_cannot_rate_or_read(keyed: Keyed) -> None:
    agent = keyed.messages[1]
    await keyed.client.put(
        keyed.url(agent), json={"rating": "good"}, headers=keyed.alice
    )
    before = await table_rows(keyed.database)
    put = await keyed.client.put(
        keyed.url(agent), json={"rating": "bad"}, headers=keyed.outsider
    )
    assert_problem(put, 404, code="session_not_found")
    listed = await keyed.client.get(
        f"/v1/sessions/{keyed.session}/feedback", headers=keyed.outsider
    )
    assert_problem(listed, 404, code="session_not_found")
    assert await table_rows(keyed.database) == before


async def test_feedback_goes_with_its_session(keyed: Keyed) -> None:
    agent = keyed.messages[1]
    await keyed.client.put(
        keyed.url(agent), json={"rating": "good"}, headers=keyed.alice
    )
    deleted = await keyed.client.delete(
        f"/v1/sessions/{keyed.session}", headers=keyed.alice
    )
    assert deleted.status_code == 204
    rows = await table_rows(keyed.database)
    assert rows["feedback"] == []


async def test_feedback_is_counted_in_metrics(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/sessions", json={})
    sid = created.json()["id"]
    await post_message(client, sid, "count me")
    await wait_idle(client, sid)
    agent = (await client.get(f"/v1/sessions/{sid}/messages")).json()["data"][1]["id"]
    url = f"/v1/sessions/{sid}/messages/{agent}/feedback"
    for rating in ("good", "good", "bad", None):
        assert (await client.put(url, json={"rating": rating})).status_code == 200
    scraped = (await client.get("/metrics")).text
    assert 'evermirror_feedback_total{rating="good"} 2.0' in scraped
    assert 'evermirror_feedback_total{rating="bad"} 1.0' in scraped
    assert 'evermirror_feedback_total{rating="none"} 1.0' in scraped
