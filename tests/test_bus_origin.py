"""The PostgreSQL bus delivers a process's own items in memory, once, as it commits or
publishes them, and carries them to the other processes through NOTIFY; a process
skips its own when they come back. A COMMIT that fails without an answer may have
committed: the process's subscribers then re-read from their cursors (`Resync`)."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy.exc import OperationalError

from app.db.session import Database
from app.live.items import BusItem, Resync, TextDelta, Wakeup
from app.live.pg_bus import ALONE_CHECK_SECONDS, COUNT_LISTENERS, PgBus, _asyncpg_dsn
from app.settings import Settings
from tests.support.database import new_session_row
from tests.support.in_process import Running
from tests.support.waits import wait_until

pytestmark = pytest.mark.postgres_only


class Process:
    """A database handle and a bus, as one process holds them, and what its bus
    delivered to it."""

    def __init__(self, settings: Settings) -> None:
        self.database = Database.from_settings(settings)
        self.bus = PgBus(settings.database_url)
        self.database.hooks = self.bus
        self.heard: list[BusItem] = []
        self.bus.sink = self.heard.append

    def of(self, kind: type) -> list[Any]:
        return [item for item in self.heard if isinstance(item, kind)]


@pytest.fixture
async def processes(running: Running, settings: Settings) -> AsyncIterator[Any]:
    first, second = Process(settings), Process(settings)
    await first.bus.start()
    await second.bus.start()
    yield first, second
    for process in (first, second):
        await process.bus.stop()
        await process.database.dispose()


async def heard_by(process: Process, kind: type, count: int) -> list[Any]:
    """What `process` heard of `kind` once it has `count` of them (within 5 s), and
    after a further 0.3 s in which an echo would have arrived."""
    for _ in range(100):
        if len(process.of(kind)) >= count:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    return process.of(kind)


def delta(
    session_id: uuid.UUID,
    text: str,
    *,
    message_id: uuid.UUID | None = None,
    part_id: str = "agent-text:1",
    offset: int = 0,
) -> TextDelta:
    return TextDelta(
        session_id,
        message_id or uuid.uuid4(),
        1,
        None,
        part_id,
        offset,
        text,
        "output.message.delta",
        f"event_{uuid.uuid4().hex}",
        "2026-12-02T00:00:00.000Z",
    )


async def test_a_published_item_reaches_its_own_process_at_once_and_once(
    processes: tuple[Process, Process],
) -> None:
    first, second = processes
    item = delta(uuid.uuid4(), "hello")
    first.bus.publish(item)
    # Delivered in memory before the NOTIFY was even sent.
    assert first.of(TextDelta) == [item]
    assert await heard_by(second, TextDelta, 1) == [item]
    # Its echo came back to the first process, which skipped it.
    assert await heard_by(first, TextDelta, 2) == [item]


async def test_a_parts_deltas_published_together_reach_other_processes_joined(
    processes: tuple[Process, Process],
) -> None:
    """Each delta reaches local subscribers as it is published; the other processes
    get the run of them as one delta (one NOTIFY, not one per token)."""
    first, second = processes
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    texts = ["Hel", "lo, ", "wörld 🌍", "!"]
    items, offset = [], 0
    for text in texts:
        items.append(delta(session_id, text, message_id=message_id, offset=offset))
        offset += len(text.encode("utf-16-le")) // 2
    for item in items:
        first.bus.publish(item)
    assert first.of(TextDelta) == items
    (joined,) = await heard_by(second, TextDelta, 1)
    assert (joined.offset, joined.text) == (0, "".join(texts))
    assert joined.event_id == items[0].event_id


async def test_many_live_items_reach_other_processes_in_order(
    processes: tuple[Process, Process],
) -> None:
    """More than one NOTIFY payload holds: they are packed, in order, into several."""
    first, second = processes
    session_id = uuid.uuid4()
    items = [
        delta(session_id, f"{index:03d}" + "x" * 500, part_id=f"agent-text:{index}")
        for index in range(60)
    ]
    for item in items:
        first.bus.publish(item)
    assert await heard_by(second, TextDelta, 60) == items


async def test_a_commit_wakes_its_own_process_at_commit_and_the_other_once(
    processes: tuple[Process, Process],
) -> None:
    first, second = processes
    session_id = uuid.uuid4()
    async with first.database.write() as db:
        db.outbox.wake(session_id, 7)
    assert first.of(Wakeup) == [Wakeup(session_id, 7, False)]
    assert await heard_by(second, Wakeup, 1) == [Wakeup(session_id, 7, False)]
    assert await heard_by(first, Wakeup, 2) == [Wakeup(session_id, 7, False)]
    # And the other way round: each process hears the other's.
    async with second.database.write() as db:
        db.outbox.wake(session_id, 8, quiet=True)
    assert await heard_by(first, Wakeup, 2) == [
        Wakeup(session_id, 7, False),
        Wakeup(session_id, 8, True),
    ]
    assert second.of(Wakeup) == [
        Wakeup(session_id, 7, False),
        Wakeup(session_id, 8, True),
    ]


async def test_a_commit_without_an_answer_makes_its_process_resync(
    processes: tuple[Process, Process], settings: Settings
) -> None:
    first, second = processes
    session_id = await new_session_row(first.database)
    first.heard.clear()
    admin = await asyncpg.connect(_asyncpg_dsn(settings.database_url))

    async def commit_unanswered() -> None:
        async with first.database.write() as db:
            await db.lock_session(session_id)
            db.outbox.wake(session_id, 99)
            # The unit's connection dies before its COMMIT is answered.
            driver = db._driver
            pid = await driver.fetchval("SELECT pg_backend_pid()")
            await admin.execute("SELECT pg_terminate_backend($1)", pid)

    try:
        with pytest.raises(OperationalError):
            await commit_unanswered()
    finally:
        await admin.close()
    assert first.of(Resync) == [Resync()]
    assert first.of(Wakeup) == []
    # It did not commit: the other process heard nothing of it.
    assert await heard_by(second, Wakeup, 1) == []


async def test_the_supervisor_outlives_a_count_that_breaks(
    processes: tuple[Process, Process], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that PostgreSQL terminated while it sat idle can raise asyncpg's
    InternalClientError on the supervisor's next count of the listening processes,
    before asyncpg has seen the socket close. The supervisor goes on: it counts
    again on its next round."""
    counted: list[asyncpg.Connection] = []
    real_fetchval = asyncpg.Connection.fetchval

    async def breaks_once(
        self: asyncpg.Connection, query: str, *args: Any, **kwargs: Any
    ) -> Any:
        if query == COUNT_LISTENERS:
            counted.append(self)
            if len(counted) == 1:
                raise asyncpg.InternalClientError(
                    "cannot switch to state 12; another operation (2) is in progress"
                )
        return await real_fetchval(self, query, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "fetchval", breaks_once)
    await wait_until(
        lambda: bool(counted) and counted[0] in counted[1:],
        "the broken count's listener to be counted again",
        ALONE_CHECK_SECONDS * 2 + 3,
    )
    assert counted, "no process counted the listeners"
    assert counted[0] in counted[1:], (
        "the broken count's supervisor never counted again"
    )
