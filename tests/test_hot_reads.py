"""Hot reads: the newest pages and single messages answered from memory, below FastAPI's
routing, and kept correct by the bus (app/live/cache.py, app/api/hot.py).

Both paths must answer the same bytes; a write must be visible at once on the process
that made it and within the bus latency on any other; a deleted session's cached pages
must be gone; another organization must never get a cached page."""

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest

from app import auth
from app.live.cache import CachedPage, PageCache
from app.settings import Settings
from tests.support.api import auth as bearer, create_session, post_message
from tests.support.in_process import Running
from tests.support.servers import server_process
from tests.support.waits import wait_idle

pytestmark = pytest.mark.e2e


async def seeded(client: httpx.AsyncClient, turns: int = 2) -> str:
    sid = await create_session(client, "hot")
    for index in range(turns):
        await post_message(client, sid, f"message number {index}")
        await wait_idle(client, sid)
    return sid


def headers_of(response: httpx.Response) -> dict[str, str]:
    return {
        name: response.headers[name]
        for name in ("content-type", "content-length", "etag")
        if name in response.headers
    }


async def test_hot_and_routed_reads_answer_the_same_bytes(
    client: httpx.AsyncClient,
) -> None:
    sid = await seeded(client)
    base = f"/v1/sessions/{sid}/messages"
    # The same query in canonical form (served from memory) and in a form only the
    # routed path accepts (FastAPI parses `050` and `1` like `50` and `true`).
    pairs = [
        ("?limit=50", "?limit=050"),
        ("?limit=2&include_internal=true", "?limit=2&include_internal=1"),
        ("", "?limit=+50"),
    ]
    for hot, routed in pairs:
        first = await client.get(base + hot)
        second = await client.get(base + routed)
        assert first.status_code == second.status_code == 200, (hot, routed)
        assert first.content == second.content, (hot, routed)
        assert headers_of(first) == headers_of(second), (hot, routed)
        assert first.headers["x-request-id"] != second.headers["x-request-id"]
    message_id = (await client.get(base)).json()["data"][0]["id"]
    hot_one = await client.get(f"{base}/{message_id}")
    routed_one = await client.get(f"{base}/{message_id}?unused=1")
    assert hot_one.status_code == routed_one.status_code == 200
    assert hot_one.content == routed_one.content
    assert headers_of(hot_one) == headers_of(routed_one)
    # An older page (read from the database every time) too.
    before = (await client.get(f"{base}?limit=1")).json()["next_before_sequence"]
    hot_older = await client.get(f"{base}?limit=1&before_sequence={before}")
    routed_older = await client.get(f"{base}?limit=01&before_sequence={before}")
    assert hot_older.status_code == routed_older.status_code == 200
    assert hot_older.content == routed_older.content
    assert headers_of(hot_older) == headers_of(routed_older)


async def test_a_write_is_read_at_once_on_the_process_that_made_it(
    client: httpx.AsyncClient,
) -> None:
    sid = await seeded(client, turns=1)
    url = f"/v1/sessions/{sid}/messages"
    before = await client.get(url)
    etag = before.headers["etag"]
    assert (await client.get(url, headers={"If-None-Match": etag})).status_code == 304
    posted = await post_message(client, sid, "a new message")
    after = await client.get(url)
    assert posted["id"] in [m["id"] for m in after.json()["data"]]
    # The message started a turn: its reply may be stored already, and counts too.
    replies = [m for m in after.json()["data"] if m["sequence"] > posted["sequence"]]
    assert {m["role"] for m in replies} <= {"agent"}
    assert after.json()["total"] == before.json()["total"] + 1 + len(replies)
    assert after.headers["etag"] != etag
    assert (await client.get(url, headers={"If-None-Match": etag})).status_code == 200
    one = await client.get(f"{url}/{posted['id']}")
    assert one.status_code == 200
    await wait_idle(client, sid)
    final = await client.get(url)
    agent = final.json()["data"][-1]
    assert agent["role"] == "agent"
    assert agent["state"] == "done"
    # The single-message snapshot follows the message's checkpoints too.
    assert (await client.get(f"{url}/{agent['id']}")).json() == agent


async def test_a_deleted_sessions_cached_pages_are_gone(
    client: httpx.AsyncClient,
) -> None:
    sid = await seeded(client, turns=1)
    url = f"/v1/sessions/{sid}/messages"
    page = await client.get(url)
    etag = page.headers["etag"]
    message_id = page.json()["data"][0]["id"]
    assert (await client.get(f"{url}/{message_id}")).status_code == 200
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    for response in (
        await client.get(url),
        await client.get(url, headers={"If-None-Match": etag}),
        await client.get(f"{url}/{message_id}"),
    ):
        assert response.status_code == 404, response.text
        assert response.headers["content-type"].startswith("application/problem+json")


async def test_another_organization_never_gets_a_cached_page(running: Running) -> None:
    state = running.app.state.app
    client = running.client
    keys = {}
    for org in (uuid.uuid4(), uuid.uuid4()):
        async with state.database.write() as db:
            _, keys[org] = await auth.create_key(db, organization_id=org)
    owner, other = (bearer(key) for key in keys.values())
    sid = await create_session(client, "owned", headers=owner)
    await post_message(client, sid, "private", headers=owner)
    await wait_idle(client, sid, headers=owner)
    url = f"/v1/sessions/{sid}/messages"
    mine = await client.get(url, headers=owner)
    assert mine.status_code == 200
    # Served from memory now, for the owner.
    assert (await client.get(url, headers=owner)).content == mine.content
    message_id = mine.json()["data"][0]["id"]
    for attempt in range(2):  # the second time the other key is warm too
        for response in (
            await client.get(url, headers=other),
            await client.get(
                url, headers={**other, "If-None-Match": mine.headers["etag"]}
            ),
            await client.get(f"{url}/{message_id}", headers=other),
        ):
            assert response.status_code == 404, (attempt, response.text)
            assert "private" not in response.text


def test_a_read_older_than_a_heard_wakeup_is_not_stored() -> None:
    cache = PageCache(max_bytes=1 << 20)
    cache.connected(True)
    sid, org = uuid.uuid4(), uuid.uuid4()
    cache.committed(sid, 5)
    cache.store_page(sid, org, 4, (50, False), CachedPage("e4", b"old"))
    assert cache.entry(sid) is None
    cache.store_page(sid, org, 5, (50, False), CachedPage("e5", b"new"))
    entry = cache.entry(sid)
    assert entry is not None
    assert entry.pages[(50, False)].body == b"new"
    # A later wake-up drops it; an equal one (the process's own NOTIFY) does not.
    cache.committed(sid, 5)
    assert cache.entry(sid) is not None
    cache.committed(sid, 6)
    assert cache.entry(sid) is None
    # Nothing is served or stored while the bus may be missing wake-ups.
    cache.store_page(sid, org, 6, (50, False), CachedPage("e6", b"x"))
    cache.connected(False)
    assert cache.entry(sid) is None
    cache.store_page(sid, org, 6, (50, False), CachedPage("e6", b"x"))
    assert cache.entry(sid) is None


def test_the_cache_stays_within_its_bytes() -> None:
    cache = PageCache(max_bytes=10_000)
    cache.connected(True)
    org = uuid.uuid4()
    sessions = [uuid.uuid4() for _ in range(50)]
    for sid in sessions:
        cache.store_page(sid, org, 1, (50, False), CachedPage("e", b"x" * 1000))
        assert cache.size <= 10_000
    assert cache.entry(sessions[-1]) is not None
    assert cache.entry(sessions[0]) is None


# ---- two processes on PostgreSQL ------------------------------------------------------

# The bound for a write on one process to be seen by a read on another: the NOTIFY
# round trip is milliseconds; the rest is headroom for a loaded CI machine.
CROSS_PROCESS_BOUND = 2.0


@pytest.mark.postgres_only(reason="two processes need PostgreSQL")
async def test_a_write_on_one_process_is_read_on_another_within_a_bound(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(90),
        server_process(settings.database_url, tmp_path) as a,
        server_process(settings.database_url, tmp_path) as b,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
        httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
    ):
        sid = await seeded(client_a, turns=1)
        url = f"/v1/sessions/{sid}/messages"
        warm = await client_b.get(url)
        assert (await client_b.get(url)).content == warm.content  # from B's memory
        etag = warm.headers["etag"]
        message_id = warm.json()["data"][0]["id"]
        assert (await client_b.get(f"{url}/{message_id}")).status_code == 200

        posted = await post_message(client_a, sid, "written on A")
        started = time.monotonic()
        while True:
            page = await client_b.get(url)
            if posted["id"] in [m["id"] for m in page.json()["data"]]:
                break
            assert time.monotonic() - started < CROSS_PROCESS_BOUND, (
                "B kept a stale page"
            )
            await asyncio.sleep(0.005)
        assert page.headers["etag"] != etag
        await wait_idle(client_a, sid)

        assert (await client_a.delete(f"/v1/sessions/{sid}")).status_code == 204
        started = time.monotonic()
        while (await client_b.get(f"{url}/{message_id}")).status_code != 404:
            assert time.monotonic() - started < CROSS_PROCESS_BOUND, (
                "B kept a deleted message"
            )
            await asyncio.sleep(0.005)
        assert (await client_b.get(url)).status_code == 404


async def test_a_warm_newest_page_and_message_cost_no_database_read(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = running.app.state.app
    client = running.client
    sid = await seeded(client, turns=1)
    url = f"/v1/sessions/{sid}/messages"
    first = await client.get(url)
    message_id = first.json()["data"][0]["id"]
    await client.get(f"{url}/{message_id}")
    reads: list[str] = []
    real_page, real_message = state.reads.page, state.reads.message

    async def page(*args: object, **kwargs: object) -> object:
        reads.append("page")
        return await real_page(*args, **kwargs)

    async def message(*args: object, **kwargs: object) -> object:
        reads.append("message")
        return await real_message(*args, **kwargs)

    monkeypatch.setattr(state.reads, "page", page)
    monkeypatch.setattr(state.reads, "message", message)
    for _ in range(3):
        assert (await client.get(url)).content == first.content
        assert (
            await client.get(url, headers={"If-None-Match": first.headers["etag"]})
        ).status_code == 304
        assert (await client.get(f"{url}/{message_id}")).status_code == 200
    assert reads == []
    # An older page always reads the database.
    before = first.json()["data"][-1]["sequence"]
    assert (await client.get(f"{url}?before_sequence={before}")).status_code == 200
    assert reads == ["page"]


async def test_hot_and_routed_posts_answer_alike(client: httpx.AsyncClient) -> None:
    """`POST .../messages` without a query is answered in front of FastAPI; with one
    (`?wait=false`) by the route. Same status, headers and fields; a refusal on the
    hot path is FastAPI's answer, and writes nothing."""
    sid = await create_session(client, "hot posts")
    url = f"/v1/sessions/{sid}/messages"

    def body(key: str, text: str = "hello") -> dict[str, object]:
        return {
            "client_message_id": key,
            "message": {"content": [{"type": "text", "text": text}]},
        }

    hot = await client.post(url, json=body("one"))
    await wait_idle(client, sid)
    routed = await client.post(url, params={"wait": "false"}, json=body("two"))
    await wait_idle(client, sid)
    assert hot.status_code == routed.status_code == 201
    assert hot.headers["content-type"] == routed.headers["content-type"]
    first, second = hot.json(), routed.json()
    assert sorted(first) == sorted(second)
    assert (first["delivery"], second["delivery"]) == ("started", "started")
    assert first["sequence"] < second["sequence"]
    assert hot.headers["x-request-id"] != routed.headers["x-request-id"]
    # The same message again: the stored one, `duplicate`, on either path.
    for params in ({}, {"wait": "false"}):
        again = await client.post(url, params=params, json=body("one"))
        assert again.status_code == 201
        assert (again.json()["id"], again.json()["delivery"]) == (
            first["id"],
            "duplicate",
        )
    # Refusals: the same problem from both paths (the hot one hands the body on).
    for refused, status in (
        (body("one", "other text"), 409),
        ({"message": {"content": []}}, 422),
        ({"message": "nope"}, 422),
    ):
        answers = [
            await client.post(url, params=params, json=refused)
            for params in ({}, {"wait": "false"})
        ]
        assert [a.status_code for a in answers] == [status, status]
        assert answers[0].json() == answers[1].json()
    raw = await client.post(
        url, content=b'{"message": ', headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400  # FastAPI: malformed JSON
    missing = f"/v1/sessions/session_{'0' * 32}/messages"
    gone = await client.post(missing, json=body("three"))
    assert gone.status_code == 404
    assert gone.json()["code"] == "session_not_found"
    listed = (await client.get(url)).json()["data"]
    assert [m["role"] for m in listed] == ["user", "agent", "user", "agent"]
