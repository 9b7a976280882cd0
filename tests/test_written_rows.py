"""A commit's wake-up brings its own process the rows it wrote, as the fan-out would
read them back (`Reads.checkpoints` over the wake-up's range), and the fan-out sends
those instead of reading them; the turn's runner is not woken by its own checkpoints;
a `?wait=true` reads its turn once. On both databases, with the app in this process
and the scripted model."""

import asyncio
import uuid
from typing import Any

import pytest

from app.db.reads import Checkpoints
from app.live.items import BusItem, Wakeup
from app.live.outputs import EventOut
from tests.support.api import create_session, post_message
from tests.support.in_process import Running
from tests.support.waits import wait_idle


def listen(running: Running) -> list[Wakeup]:
    """Every wake-up the app's bus delivers from now on, as it delivers it."""
    bus = running.app.state.app.bus
    heard: list[Wakeup] = []
    sink = bus.sink

    def tap(item: BusItem) -> None:
        if isinstance(item, Wakeup):
            heard.append(item)
        sink(item)

    bus.sink = tap
    return heard


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    """The arguments of every call of the coroutine method `owner.name` from now on
    (the calls still go through)."""
    calls: list[Any] = []
    method = getattr(owner, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await method(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def test_a_commits_rows_are_those_read_back(running: Running) -> None:
    state = running.app.state.app
    heard = listen(running)
    sid = await create_session(running.client, "written rows")
    session_id = uuid.UUID(hex=sid[len("session_") :])
    await post_message(running.client, sid, "hello there")
    await wait_idle(running.client, sid)
    carried = [w for w in heard if w.session_id == session_id and w.rows is not None]
    # The user message with its turn's start, the agent message opened, its step
    # and the turn's end: each a commit of its own.
    assert len(carried) >= 3, heard
    newest = max(w.sequence for w in carried)
    for wakeup in carried:
        assert wakeup.first is not None
        rows: Checkpoints = wakeup.rows  # type: ignore[assignment]
        read = await state.reads.checkpoints(
            session_id, after=wakeup.first - 1, upto=wakeup.sequence
        )
        # Events never change once written.
        assert rows.events == read.events
        assert [e.sequence for e in rows.events] == list(
            range(wakeup.first, wakeup.sequence + 1)
        )
        # A message changed again later is read back in its newer form only; the
        # newest commit's are as stored now.
        for message in rows.messages:
            assert wakeup.first <= message.changed_sequence <= wakeup.sequence
        if wakeup.sequence == newest:
            assert rows.messages == read.messages
            assert rows.messages
    # The user message is never changed again: as stored, field for field.
    first = min(carried, key=lambda w: w.sequence)
    assert first.rows is not None
    assert [m.snapshot for m in first.rows.messages] == [
        m.snapshot
        for m in (
            await state.reads.checkpoints(
                session_id, after=first.sequence - 1, upto=first.sequence
            )
        ).messages
    ]


async def test_the_fan_out_sends_its_own_processes_commits_without_reading(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = running.app.state.app
    sid = await create_session(running.client, "no read back")
    session_id = uuid.UUID(hex=sid[len("session_") :])
    reads = count_calls(monkeypatch, state.reads, "checkpoints")
    sub = state.fanout.subscribe(session_id)
    sub.started_at = 0
    try:
        await post_message(running.client, sid, "hello there")
        await wait_idle(running.client, sid)
        types: list[str] = []
        while "turn.completed" not in types:
            item = await asyncio.wait_for(sub.next(), 5)
            assert item is not None
            if isinstance(item, EventOut):
                types.append(item.type)
    finally:
        state.fanout.unsubscribe(sub)
    assert types[:3] == ["input.message", "session.activated", "turn.started"]
    assert "output.message.completed" in types
    assert reads == []


async def test_a_runner_is_not_woken_by_its_own_checkpoints(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's watch reads the session back only for another writer's commit (a
    cancel, an Action, a decision): a plain turn reads nothing while it streams."""
    state = running.app.state.app
    watched = count_calls(monkeypatch, state.reads, "turn_watch")
    sid = await create_session(running.client, "quiet runner")
    await post_message(running.client, sid, "/scenario tool weather in Kyiv")
    await wait_idle(running.client, sid)
    page = (await running.client.get(f"/v1/sessions/{sid}/messages")).json()["data"]
    # Two steps (a tool call, then the answer): the second streamed after the first's
    # commit, whose wake-up is the runner's own.
    assert any(p["type"] == "tool_call" for m in page for p in m["content"])
    assert watched == []


async def test_a_wait_reads_its_turn_once(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `?wait=true` subscribes before its message commits: the turn's end is in the
    subscription, read once for the answer (a wait for a duplicate reads first)."""
    state = running.app.state.app
    outcomes = count_calls(monkeypatch, state.reads, "turn_outcome")
    sid = await create_session(running.client, "one read")
    url = f"/v1/sessions/{sid}/messages"

    def body(key: str) -> dict[str, Any]:
        text = {"type": "text", "text": "hi"}
        return {"client_message_id": key, "message": {"content": [text]}}

    # The hot path's wait, and the route's (a parameter the hot path does not know).
    for key, params in (("hot", {}), ("routed", {"other": "1"})):
        outcomes.clear()
        answer = await running.client.post(
            url, params={"wait": "true", **params}, json=body(key)
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "completed"
        assert len(outcomes) == 1
    outcomes.clear()
    again = await running.client.post(url, params={"wait": "true"}, json=body("hot"))
    assert again.status_code == 200, again.text
    assert again.json()["message"]["delivery"] == "duplicate"
    assert len(outcomes) == 1
