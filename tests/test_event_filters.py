"""The events filters the official SDK sends (`everruns_sdk` `events.list`), against a
real server: each one narrows the log exactly as upstream documents it, and the ones
that have no meaning here are refused with a 400 naming them, never ignored."""

import asyncio
from typing import Any

import httpx
import pytest
from everruns_sdk import Everruns
from everruns_sdk.errors import ApiError

from tests.support.servers import Server
from tests.support.sse import expect_connected, open_stream
from tests.support.waits import wait_sdk_idle


async def run_turn(sdk: Everruns, session_id: str, text: str) -> None:
    await sdk.messages.create(session_id, text)
    await wait_sdk_idle(sdk, session_id)


@pytest.fixture
async def two_turns(sdk: Everruns) -> tuple[str, list[dict[str, Any]]]:
    """A session with a tool turn and a plain turn; its whole log (raw JSON)."""
    session = await sdk.sessions.create(title="filters")
    await run_turn(sdk, session.id, "/scenario tool weather in Kyiv")
    await asyncio.sleep(0.02)  # the turns' events get distinct times
    await run_turn(sdk, session.id, "a plain banana question")
    return session.id, [e.model_dump() for e in await sdk.events.list(session.id)]


def ids(events: list[Any]) -> list[str]:
    return [e.id if hasattr(e, "id") else e["id"] for e in events]


async def test_turn_id_time_bounds_tool_name_and_text(
    sdk: Everruns, two_turns: tuple[str, list[dict[str, Any]]]
) -> None:
    sid, log = two_turns
    turns = [e["data"]["turn_id"] for e in log if e["type"] == "turn.started"]
    assert len(turns) == 2

    second_turn = await sdk.events.list(sid, turn_id=turns[1])
    expected = [e for e in log if e["context"].get("turn_id") == turns[1]]
    assert expected
    assert ids(second_turn) == ids(expected)

    middle = log[len(log) // 2]["ts"]
    later = await sdk.events.list(sid, from_ts=middle)
    assert ids(later) == ids([e for e in log if e["ts"] >= middle])
    earlier = await sdk.events.list(sid, to_ts=middle)
    assert ids(earlier) == ids([e for e in log if e["ts"] <= middle])
    window = await sdk.events.list(sid, from_ts=middle, to_ts=middle)
    assert ids(window) == ids([e for e in log if e["ts"] == middle])

    lookups = await sdk.events.list(sid, tool_name="lookup")
    assert [e.type for e in lookups] == ["tool.started", "tool.completed"]
    assert await sdk.events.list(sid, tool_name="no_such_tool") == []

    bananas = await sdk.events.list(sid, q="BANANA")
    assert bananas
    assert all("banana" in str(e.data).lower() for e in bananas)
    assert ids(bananas) == ids([e for e in log if "banana" in str(e["data"]).lower()])
    # LIKE wildcards are plain characters.
    assert await sdk.events.list(sid, q="%") == []


async def test_order_and_centered_window(
    sdk: Everruns, two_turns: tuple[str, list[dict[str, Any]]]
) -> None:
    sid, log = two_turns
    newest_first = await sdk.events.list(sid, order_desc=True)
    assert ids(newest_first) == ids(log)[::-1]
    last_three = await sdk.events.list(sid, limit=3, order_desc=True)
    assert ids(last_three) == ids(log)[::-1][:3]

    anchor = len(log) // 2
    around = await sdk.events.list(sid, around=log[anchor]["id"], window=2)
    assert ids(around) == ids(log[anchor - 2 : anchor + 3])
    # With a filter the window counts matching events; the anchor need not match.
    started = [e for e in log if e["type"] == "turn.started"]
    narrowed = await sdk.events.list(
        sid, around=log[anchor]["id"], window=5, types=["turn.started"]
    )
    assert ids(narrowed) == ids(started)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"exec_id": "exec_00000000000000000000000000000001"}, "exec_id"),
        ({"trace_id": "abc"}, "trace_id"),
        ({"tags": ["a"]}, "tags"),
        ({"turn_id": "not-a-turn"}, "turn"),
        ({"around": "event_00000000000000000000000000000001"}, "around"),
        ({"window": 3}, "window"),
    ],
)
async def test_filters_without_meaning_here_are_refused_by_name(
    sdk: Everruns,
    two_turns: tuple[str, list[dict[str, Any]]],
    params: dict[str, Any],
    named: str,
) -> None:
    sid, log = two_turns
    with pytest.raises(ApiError) as raised:
        await sdk.events.list(sid, **params)
    assert raised.value.status_code == 400
    assert named in raised.value.message
    assert ids(await sdk.events.list(sid)) == ids(log)


async def test_bad_filter_values_are_4xx(
    server: Server, two_turns: tuple[str, list[dict[str, Any]]]
) -> None:
    sid, _ = two_turns
    async with httpx.AsyncClient(base_url=server.url) as client:
        refused: list[tuple[dict[str, Any], int]] = [
            ({"from_ts": "yesterday"}, 400),
            ({"from_ts": "2026-01-01T00:00:00"}, 400),  # no offset
            ({"to_ts": "0001-01-01T00:00:00+01:00"}, 400),  # before year 1 in UTC
            ({"q": "x" * 201}, 400),
            ({"window": 501, "around": "event_" + "0" * 32}, 400),
            ({"around": "event_" + "0" * 32, "limit": 5}, 400),
        ]
        for params, status in refused:
            response = await client.get(f"/v1/sessions/{sid}/events", params=params)
            assert response.status_code == status, (params, response.text)
            assert response.headers["content-type"] == "application/problem+json"


async def test_the_live_stream_filters_this_services_live_events_too(
    server: Server,
) -> None:
    """`/sse?types=` names upstream's event types and this service's live ones
    (`llm.retry`, `tool.call.input.delta`); the durable log refuses the latter."""
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
        sid = (await api.post("/v1/sessions", json={})).json()["id"]
        params = [
            ("types", "llm.retry"),
            ("types", "tool.call.input.delta"),
            ("exclude", "output.message.delta"),
        ]
        async with open_stream(api, f"/v1/sessions/{sid}/sse", params=params) as sse:
            assert sse.status_code == 200, sse.response.text
            assert (await expect_connected(sse)).event == "connected"
