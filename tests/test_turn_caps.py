"""Caps on running turns, per organization (across processes: the database's count)
and per process: a message that would start one more is `429` with `Retry-After` and
writes nothing; steering a running turn is never refused; concurrent posts cannot
overshoot a cap."""

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from app.auth import create_key
from app.main import create_app
from app.settings import Settings
from tests.support.api import auth, create_session, post_message, text_body
from tests.support.lanes import make_settings
from tests.support.problems import assert_too_many
from tests.support.waits import wait_idle

ORG_A = uuid.UUID(hex="a" * 32)
ORG_B = uuid.UUID(hex="b" * 32)
# A turn that runs for seconds (the scripted model pauses between its deltas).
LONG = "/scenario long 400"


@dataclass
class Capped:
    app: Any
    client: httpx.AsyncClient
    a: dict[str, str]
    b: dict[str, str]

    async def untouched(self, session_id: str, headers: dict[str, str]) -> None:
        """The session is as created: no message, no event, no turn."""
        events = await self.client.get(
            f"/v1/sessions/{session_id}/events", headers=headers
        )
        assert events.json()["data"] == [], events.text
        page = await self.client.get(
            f"/v1/sessions/{session_id}/messages", headers=headers
        )
        assert page.json()["total"] == 0, page.text
        session = await self.client.get(f"/v1/sessions/{session_id}", headers=headers)
        assert session.json()["status"] == "started", session.text


@asynccontextmanager
async def capped(settings: Settings, **caps: int) -> AsyncIterator[Capped]:
    app = create_app(make_settings(settings.database_url, scripted_delay_ms=10, **caps))
    async with app.router.lifespan_context(app):
        async with app.state.app.database.write() as db:
            _, key_a = await create_key(db, organization_id=ORG_A)
            _, key_b = await create_key(db, organization_id=ORG_B)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", timeout=30
        ) as client:
            yield Capped(app, client, auth(key_a), auth(key_b))


def assert_too_many_turns(response: httpx.Response) -> None:
    assert_too_many(response, code="too_many_turns")


async def post(client: httpx.AsyncClient, sid: str, headers: dict[str, str]) -> Any:
    return await client.post(
        f"/v1/sessions/{sid}/messages", json=text_body(LONG), headers=headers
    )


async def test_the_organization_cap_refuses_a_new_turn_but_not_a_steer(
    settings: Settings,
) -> None:
    async with capped(
        settings, max_running_turns_per_org=1, max_running_turns_per_process=0
    ) as env:
        client = env.client
        first = await create_session(client, "first", headers=env.a)
        second = await create_session(client, "second", headers=env.a)
        elsewhere = await create_session(client, "other org", headers=env.b)
        started = await post_message(client, first, LONG, headers=env.a)
        assert started["delivery"] == "started"

        assert_too_many_turns(await post(client, second, env.a))
        await env.untouched(second, env.a)
        # Steering the running turn is no new turn.
        steered = await post_message(client, first, "and this", headers=env.a)
        assert steered["delivery"] == "steered"
        # Another organization has a cap of its own.
        other = await post_message(client, elsewhere, LONG, headers=env.b)
        assert other["delivery"] == "started"

        await client.post(f"/v1/sessions/{first}/cancel", json={}, headers=env.a)
        await wait_idle(client, first, headers=env.a)
        again = await post_message(client, second, "now", headers=env.a)
        assert again["delivery"] == "started"


async def test_the_process_cap_counts_every_organization(settings: Settings) -> None:
    async with capped(
        settings, max_running_turns_per_org=0, max_running_turns_per_process=1
    ) as env:
        client = env.client
        first = await create_session(client, "first", headers=env.a)
        other = await create_session(client, "other", headers=env.b)
        assert (await post_message(client, first, LONG, headers=env.a))[
            "delivery"
        ] == "started"
        assert_too_many_turns(await post(client, other, env.b))
        await env.untouched(other, env.b)
        await client.post(f"/v1/sessions/{first}/cancel", json={}, headers=env.a)
        await wait_idle(client, first, headers=env.a)
        assert (await post_message(client, other, "now", headers=env.b))[
            "delivery"
        ] == "started"


async def concurrent_starts(env: Capped, count: int) -> Counter[int]:
    sessions = [
        await create_session(env.client, f"s{i}", headers=env.a) for i in range(count)
    ]
    responses = await asyncio.gather(*(post(env.client, s, env.a) for s in sessions))
    for response in responses:
        if response.status_code != 201:
            assert_too_many_turns(response)
    return Counter(r.status_code for r in responses)


async def test_concurrent_posts_cannot_overshoot_the_organization_cap(
    settings: Settings,
) -> None:
    async with capped(
        settings, max_running_turns_per_org=2, max_running_turns_per_process=0
    ) as env:
        assert await concurrent_starts(env, 10) == {201: 2, 429: 8}


async def test_concurrent_posts_cannot_overshoot_the_process_cap(
    settings: Settings,
) -> None:
    async with capped(
        settings, max_running_turns_per_org=0, max_running_turns_per_process=3
    ) as env:
        assert await concurrent_starts(env, 10) == {201: 3, 429: 7}


async def test_a_retry_at_the_cap_is_answered_with_what_is_stored(
    settings: Settings,
) -> None:
    """Admission is asked after the message is written: a retry of a stored message
    finds it there and is answered as a duplicate, not refused; a new message that
    would start a turn is refused and its write rolled back."""
    async with capped(
        settings, max_running_turns_per_org=1, max_running_turns_per_process=0
    ) as env:
        client = env.client
        first = await create_session(client, "first", headers=env.a)
        second = await create_session(client, "second", headers=env.a)
        body = text_body("quick", client_message_id="q-1")
        url = f"/v1/sessions/{first}/messages"
        stored = await client.post(url, json=body, headers=env.a)
        assert stored.json()["delivery"] == "started", stored.text
        await wait_idle(client, first, headers=env.a)
        events = (
            await client.get(f"/v1/sessions/{first}/events", headers=env.a)
        ).json()
        assert (await post_message(client, second, LONG, headers=env.a))[
            "delivery"
        ] == "started"

        retry = await client.post(url, json=body, headers=env.a)
        assert retry.json()["delivery"] == "duplicate", retry.text
        assert retry.json()["id"] == stored.json()["id"]
        assert_too_many_turns(
            await client.post(
                url, json=text_body("new", client_message_id="q-2"), headers=env.a
            )
        )
        after = (await client.get(f"/v1/sessions/{first}/events", headers=env.a)).json()
        assert after["data"] == events["data"]
        session = (await client.get(f"/v1/sessions/{first}", headers=env.a)).json()
        assert session["status"] == "idle", session
