"""A step's history is read through its session's window: the first read takes the
newest messages, each later one only the messages that changed since (their
`changed_sequence` past the window's), and the window then holds what a whole read
would return. On both databases, with the app in this process and the scripted
model."""

import asyncio
import uuid
from typing import Any

import pytest

from app.runner import queries
from app.runner.history import HISTORY_FOR_MODEL
from tests.support.api import create_session, post_message
from tests.support.in_process import Running
from tests.support.waits import wait_idle


def stored(rows: Any) -> list[tuple[int, int, str, str, Any]]:
    return [
        (r.sequence, r.changed_sequence, r.role, r.snapshot, r.content) for r in rows
    ]


async def whole(running: Running, session_id: uuid.UUID) -> list[Any]:
    """The newest messages as a read without a window returns them."""
    reads = running.app.state.app.reads
    recent = await queries.recent_messages(reads, session_id, HISTORY_FOR_MODEL)
    return stored(recent.messages)


async def through(
    running: Running, session_id: uuid.UUID, window: queries.Window
) -> list[Any]:
    reads = running.app.state.app.reads
    recent = await queries.recent_messages(
        reads, session_id, HISTORY_FOR_MODEL, window=window
    )
    return stored(recent.messages)


async def new_session(running: Running, title: str) -> tuple[str, uuid.UUID]:
    sid = await create_session(running.client, title)
    return sid, uuid.UUID(hex=sid[len("session_") :])


async def answered(running: Running, title: str, text: str) -> tuple[str, uuid.UUID]:
    """A new session whose first message's turn has ended."""
    sid, session_id = await new_session(running, title)
    await post_message(running.client, sid, text)
    await wait_idle(running.client, sid)
    return sid, session_id


async def test_a_window_reads_only_what_changed_and_holds_a_whole_read(
    running: Running,
) -> None:
    sid, session_id = await answered(running, "window", "first words")
    window = queries.Window()
    assert await through(running, session_id, window) == await whole(
        running, session_id
    )
    # The user message and the agent's answer.
    assert window.fetched == 2

    # Nothing changed: nothing is fetched, and the window is as it was.
    before = window.newest
    assert stored(before) == await through(running, session_id, window)
    assert window.fetched == 0

    await post_message(running.client, sid, "second words")
    await wait_idle(running.client, sid)
    assert await through(running, session_id, window) == await whole(
        running, session_id
    )
    # Only the new turn's two messages.
    assert window.fetched == 2
    assert len(window.rows) == 4


async def test_a_window_past_its_limit_holds_the_newest_messages(
    running: Running,
) -> None:
    sid, session_id = await answered(running, "window limit", "opening")
    window = queries.Window()
    await through(running, session_id, window)
    # More messages than the window holds, steering and starting turns as they come.
    for i in range(HISTORY_FOR_MODEL + 10):
        await post_message(running.client, sid, f"message {i}")
    await wait_idle(running.client, sid, within=60)
    read = await through(running, session_id, window)
    assert read == await whole(running, session_id)
    assert len(read) == HISTORY_FOR_MODEL
    assert window.fetched <= HISTORY_FOR_MODEL


async def test_the_runner_keeps_a_window_only_while_it_holds_the_session(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = running.app.state.app
    history = state.runner.runtime.history
    sid, session_id = await new_session(running, "runner window")
    merged: list[int] = []
    merge = queries.Window.merge

    def counted(window: queries.Window, rows: Any, limit: int) -> None:
        merge(window, rows, limit)
        merged.append(window.fetched)

    monkeypatch.setattr(queries.Window, "merge", counted)
    await post_message(running.client, sid, "hello there")
    await wait_idle(running.client, sid)
    # Let go with its turn: the runner's task ends, and the window with it.
    for _ in range(200):
        if session_id not in state.runner.tasks:
            break
        await asyncio.sleep(0.01)
    assert session_id not in state.runner.tasks
    assert session_id not in history.windows
    # The turn's step read through a window: the session's one message.
    assert merged[:1] == [1]
