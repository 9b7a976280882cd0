"""Search over message text (`GET /v1/search`, `GET /v1/sessions?search=`), on both
databases: a word from a message is found only in the caller's organization, an exact
phrase ranks first, pages follow one another, internal messages and deleted sessions
are not found, copies made by fork and import are, and bad queries are refused."""

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.auth import create_key
from app.db.search import WORD
from app.db.session import Database
from app.sessions.search import SNIPPET_WORDS, snippet
from app.settings import Settings
from tests.support.api import auth, post_message
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle

ORG = uuid.UUID(hex="a1" * 16)
OTHER_ORG = uuid.UUID(hex="b2" * 16)


@dataclass
class Orgs:
    client: httpx.AsyncClient
    database: Database
    mine: dict[str, str]
    theirs: dict[str, str]

    async def session(self, *texts: str, who: str = "mine", **body: Any) -> str:
        headers = self.mine if who == "mine" else self.theirs
        created = await self.client.post("/v1/sessions", json=body, headers=headers)
        sid: str = created.json()["id"]
        for text in texts:
            await post_message(self.client, sid, text, headers=headers)
            await wait_idle(self.client, sid, headers=headers)
        return sid

    async def search(
        self, q: str, who: str = "mine", **params: Any
    ) -> list[dict[str, Any]]:
        response = await self.client.get(
            "/v1/search",
            params={"q": q, **params},
            headers=self.mine if who == "mine" else self.theirs,
        )
        assert response.status_code == 200, response.text
        hits: list[dict[str, Any]] = response.json()["data"]
        return hits


@pytest.fixture
async def orgs(settings: Settings) -> AsyncIterator[Orgs]:
    fresh = make_settings(settings.database_url, auth_cache_seconds=0.0)
    async with running_app(fresh) as running:
        database: Database = running.app.state.app.database
        async with database.write() as db:
            _, mine = await create_key(db, organization_id=ORG, name="mine")
            _, theirs = await create_key(db, organization_id=OTHER_ORG, name="theirs")
        yield Orgs(running.client, database, auth(mine), auth(theirs))


async def test_a_word_is_found_in_the_callers_organization_only(orgs: Orgs) -> None:
    sid = await orgs.session("the zebra crossing was repainted <today>")
    other = await orgs.session("a zebra of their own", who="theirs")
    hits = await orgs.search("ZEBRA")
    # The user's message and the agent's echo of it.
    assert {(h["session_id"], h["role"]) for h in hits} == {
        (sid, "user"),
        (sid, "agent"),
    }
    user = next(h for h in hits if h["role"] == "user")
    assert user["snippet"] == "the zebra crossing was repainted <today>"
    assert user["snippet_html"] == (
        "the <mark>zebra</mark> crossing was repainted &lt;today&gt;"
    )
    messages = (
        await orgs.client.get(f"/v1/sessions/{sid}/messages", headers=orgs.mine)
    ).json()["data"]
    stored = next(m for m in messages if m["id"] == user["message_id"])
    assert stored["sequence"] == user["sequence"]
    assert stored["created_at"] == user["created_at"]
    assert [h["session_id"] for h in await orgs.search("zebra", who="theirs")] == [
        other,
        other,
    ]
    assert await orgs.search("crossing", who="theirs") == []


async def test_every_word_must_match_and_an_exact_phrase_ranks_first(
    orgs: Orgs,
) -> None:
    scattered = await orgs.session(
        "brown then quick now, brown then quick now, brown then quick now"
    )
    phrase = await orgs.session("one quick brown fox")
    await orgs.session("quick but not the other colour")
    hits = await orgs.search("quick brown")
    assert [h["session_id"] for h in hits] == [phrase, phrase, scattered, scattered]
    assert "<mark>quick</mark> <mark>brown</mark>" in hits[0]["snippet_html"]


async def test_pages_follow_one_another(orgs: Orgs) -> None:
    await orgs.session("lantern one", "lantern two", "lantern three")
    everything = await orgs.search("lantern", limit=50)
    assert len(everything) == 6
    seen: list[str] = []
    url: str | None = "/v1/search?q=lantern&limit=4"
    while url is not None:
        body = (await orgs.client.get(url, headers=orgs.mine)).json()
        seen.extend(h["message_id"] for h in body["data"])
        url = body.get("next_url")
    assert seen == [h["message_id"] for h in everything]


async def test_sessions_search_matches_message_text_and_titles(orgs: Orgs) -> None:
    fruit = await orgs.session("buy a pomegranate", title="Groceries")
    await orgs.session("nothing about fruit", title="Other")

    async def listed(search: str) -> list[str]:
        response = await orgs.client.get(
            "/v1/sessions", params={"search": search}, headers=orgs.mine
        )
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["data"]]

    assert await listed("pomegranate") == [fruit]
    assert await listed("grocer") == [fruit]
    assert await listed("zucchini") == []
    assert await listed("%") == []


async def test_internal_messages_and_deleted_sessions_are_not_found(
    orgs: Orgs,
) -> None:
    sid = await orgs.session()
    await post_message(
        orgs.client, sid, "secret walrus", headers=orgs.mine, visibility="internal"
    )
    await wait_idle(orgs.client, sid, headers=orgs.mine)
    # The agent's visible answer to it is found, the internal message is not.
    assert [h["role"] for h in await orgs.search("walrus")] == ["agent"]
    gone = await orgs.session("a visible walrus")
    assert len(await orgs.search("walrus")) == 3
    deleted = await orgs.client.delete(f"/v1/sessions/{gone}", headers=orgs.mine)
    assert deleted.status_code == 204
    assert [h["session_id"] for h in await orgs.search("walrus")] == [sid]


async def test_forks_and_imports_are_found(orgs: Orgs) -> None:
    sid = await orgs.session("a quokka smiles")
    fork = await orgs.client.post(
        f"/v1/sessions/{sid}/fork", json={}, headers=orgs.mine
    )
    assert fork.status_code == 201, fork.text
    exported = await orgs.client.get(
        f"/v1/sessions/{sid}/export", params={"format": "jsonl"}, headers=orgs.mine
    )
    imported = await orgs.client.post(
        "/v1/sessions/import",
        content=exported.content,
        headers={**orgs.mine, "content-type": "application/jsonl"},
    )
    assert imported.status_code == 201, imported.text
    found = {h["session_id"] for h in await orgs.search("quokka")}
    assert found == {sid, fork.json()["id"], imported.json()["id"]}


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"q": ""},
        {"q": "!!! ???"},
        {"q": "nul\x00here"},
        {"q": "x" * 201},
        {"q": "word", "limit": 0},
        {"q": "word", "limit": 51},
        {"q": "word", "offset": 1001},
    ],
)
async def test_bad_queries_are_refused(orgs: Orgs, params: dict[str, Any]) -> None:
    response = await orgs.client.get("/v1/search", params=params, headers=orgs.mine)
    assert_problem(response, 400)


async def test_search_needs_a_key(orgs: Orgs) -> None:
    response = await orgs.client.get("/v1/search", params={"q": "word"})
    assert_problem(response, 401)


def test_a_snippet_is_a_window_around_the_phrase_with_its_matches_marked() -> None:
    filler = " ".join(f"w{i}" for i in range(40))
    body = f"Fox here. {filler} the quick brown fox & co {filler}"
    found = snippet(body, ["quick", "brown"])
    assert found.text.startswith("…w33 ")
    assert found.text.endswith("…")
    assert len(WORD.findall(found.text)) == SNIPPET_WORDS
    marked = [found.text[b:e] for b, e in found.marks]
    assert marked == ["quick", "brown"]
    assert "<mark>quick</mark> <mark>brown</mark> fox &amp; co" in found.html
    # Short text is whole; a word without its phrase marks every place it occurs.
    short = snippet("Brown bears, brown_eyed", ["brown"])
    assert short.html == "<mark>Brown</mark> bears, <mark>brown</mark>_eyed"
