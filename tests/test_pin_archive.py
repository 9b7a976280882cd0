"""Pin and archive (`PUT`/`DELETE /v1/sessions/{id}/pin` and `.../archive`): idempotent
204s, `is_pinned` and `archived_at` on the session, archived sessions out of the default
list and in `include_archived` / `archived_only`, and the official SDK's pin and unpin."""

import httpx
from everruns_sdk import Everruns

from tests.support.api import create_session, post_message
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle


async def session_of(client: httpx.AsyncClient, sid: str) -> dict[str, object]:
    response = await client.get(f"/v1/sessions/{sid}")
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def listed(client: httpx.AsyncClient, **params: str) -> list[str]:
    response = await client.get("/v1/sessions", params=params)
    assert response.status_code == 200, response.text
    return [s["id"] for s in response.json()["data"]]


async def test_pin_and_unpin_are_idempotent(client: httpx.AsyncClient) -> None:
    sid = await create_session(client)
    fresh = await session_of(client, sid)
    assert fresh["is_pinned"] is False
    for _ in range(2):
        pinned = await client.put(f"/v1/sessions/{sid}/pin")
        assert pinned.status_code == 204
        assert pinned.content == b""
    after = await session_of(client, sid)
    assert after["is_pinned"] is True
    # The organization's view of the session, not a change of it.
    assert after["updated_at"] == fresh["updated_at"]
    for _ in range(2):
        assert (await client.delete(f"/v1/sessions/{sid}/pin")).status_code == 204
    assert (await session_of(client, sid))["is_pinned"] is False


async def test_archived_sessions_leave_the_default_list(
    client: httpx.AsyncClient,
) -> None:
    kept = await create_session(client, title="kept")
    archived = await create_session(client, title="archived")
    assert (await client.put(f"/v1/sessions/{archived}/archive")).status_code == 204
    first = (await session_of(client, archived))["archived_at"]
    assert isinstance(first, str)
    # Archiving again keeps the first time.
    assert (await client.put(f"/v1/sessions/{archived}/archive")).status_code == 204
    assert (await session_of(client, archived))["archived_at"] == first
    assert "archived_at" not in await session_of(client, kept)

    assert await listed(client) == [kept]
    assert (await client.get("/v1/sessions")).json()["total"] == 1
    assert await listed(client, include_archived="true") == [archived, kept]
    assert await listed(client, archived_only="true") == [archived]
    assert await listed(client, archived_only="true", search="kept") == []

    # An archived session still works.
    await post_message(client, archived, "still here")
    await wait_idle(client, archived)

    assert (await client.delete(f"/v1/sessions/{archived}/archive")).status_code == 204
    assert await listed(client) == [archived, kept]
    assert "archived_at" not in await session_of(client, archived)


async def test_unknown_session_and_bad_filter(client: httpx.AsyncClient) -> None:
    ghost = "session_" + "0" * 32
    for method in ("PUT", "DELETE"):
        for mark in ("pin", "archive"):
            response = await client.request(method, f"/v1/sessions/{ghost}/{mark}")
            assert_problem(response, 404, code="session_not_found")
    bad = await client.get("/v1/sessions", params={"archived_only": "maybe"})
    assert_problem(bad, 400, code="invalid_parameter")


async def test_the_official_sdk_pins_and_unpins(sdk: Everruns) -> None:
    session = await sdk.sessions.create(title="sdk pin")
    assert (await sdk.sessions.get(session.id)).is_pinned is False
    await sdk.sessions.pin(session.id)
    assert (await sdk.sessions.get(session.id)).is_pinned is True
    await sdk.sessions.unpin(session.id)
    assert (await sdk.sessions.get(session.id)).is_pinned is False
