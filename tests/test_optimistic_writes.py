"""Optimistic write units (PostgreSQL): a message that steers a running turn is written
in one statement that assumes the session row as this process last committed it. When
the row changed meanwhile (another process wrote, a cancel was requested, the session
was deleted, the client_message_id is taken) nothing of the optimistic attempt is
written and the unit runs again, locking: the answers and the stored rows are exactly
what a locking unit would have produced."""

import asyncio
import copy
import uuid
from typing import Any

import asyncpg
import orjson
import pytest
from sqlalchemy import text

from app.db.batch import _BATCH, SECOND_BATCH, CheckpointBatcher
from app.db.rows import LockedSession, SessionChanged, SessionHeads, StaleMessage
from app.db.session import Database
from app.errors import SessionNotFound
from app.ids import DEFAULT_ORG_ID
from app.journal import checkpoint
from app.journal.sessions import lock_session
from app.live.bus import decode, encode
from app.live.items import Wakeup
from app.live.pg_bus import _asyncpg_dsn
from app.messages import schemas, service
from app.sessions import service as sessions_service
from app.settings import Settings
from tests import scratch_db
from tests.support.database import new_session_row
from tests.support.in_process import running_app


@pytest.fixture
async def handles(settings: Settings) -> Any:
    """Two handles on the migrated database, as two processes would hold them (each
    its own heads), without a bus or runner: nothing writes but the test. An app
    migrates the database first and is stopped before the test: its runner's sweeper
    would end the turns these handles start and no runner runs (after a second here),
    and the test's next messages would start turns instead of steering them."""
    async with running_app(settings):
        pass
    first, second = Database.from_settings(settings), Database.from_settings(settings)
    yield first, second
    await first.dispose()
    await second.dispose()


@pytest.fixture
def optimistic(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How each one-statement write ended: "written" or "changed"."""
    outcomes: list[str] = []
    commit = CheckpointBatcher.commit

    async def counted(self: CheckpointBatcher, item: Any) -> None:
        try:
            await commit(self, item)
        except SessionChanged:
            outcomes.append("changed")
            raise
        outcomes.append("written")

    monkeypatch.setattr(CheckpointBatcher, "commit", counted)
    return outcomes


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch written, in order."""
    sizes: list[int] = []
    write = CheckpointBatcher._write

    async def measured(self: CheckpointBatcher, batch: list[Any]) -> None:
        sizes.append(len(batch))
        await write(self, batch)

    monkeypatch.setattr(CheckpointBatcher, "_write", measured)
    return sizes


async def post(
    handle: Database, session_id: uuid.UUID, said: str, client_id: str | None = None
) -> dict[str, Any]:
    data = schemas.MessageCreate.model_validate(
        {
            "client_message_id": client_id,
            "message": {"content": [{"type": "text", "text": said}]},
        }
    )

    async def work(db: Any) -> bytes:
        return await service.create_message(
            db, organization_id=DEFAULT_ORG_ID, session_id=session_id, data=data
        )

    body: dict[str, Any] = orjson.loads(await handle.transact(work))
    return body


async def stored(handle: Database, session_id: uuid.UUID) -> dict[str, Any]:
    async with handle.statements() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT last_sequence, last_input_sequence, visible_message_count,"
                    " (SELECT array_agg(sequence ORDER BY sequence) FROM events"
                    "  WHERE session_id = s.id),"
                    " (SELECT array_agg(sequence ORDER BY sequence) FROM messages"
                    "  WHERE session_id = s.id)"
                    " FROM sessions s WHERE id = :id"
                ),
                {"id": session_id},
            )
        ).one()
    return {
        "last_sequence": row[0],
        "last_input_sequence": row[1],
        "visible": row[2],
        "events": row[3],
        "messages": row[4],
    }


def head(handle: Database, session_id: uuid.UUID) -> LockedSession | None:
    assert handle.heads is not None
    return handle.heads.get(session_id)


@pytest.mark.postgres_only
async def test_a_steering_message_is_one_statement_on_the_head_it_assumes(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    first, _ = handles
    sid = await new_session_row(first)
    started = await post(first, sid, "start")
    assert started["delivery"] == "started"
    # The unit that started the turn left the head of what it wrote.
    known = head(first, sid)
    assert known is not None
    assert known.active_turn_id is not None
    steered = await post(first, sid, "steer")
    assert steered["delivery"] == "steered"
    assert optimistic == ["written"]
    assert steered["sequence"] == known.last_sequence + 1
    after = head(first, sid)
    assert after is not None
    assert after.last_sequence == steered["sequence"]
    assert after.last_input_sequence == steered["sequence"]
    row = await stored(first, sid)
    assert row["events"] == list(range(1, row["last_sequence"] + 1))
    assert row["last_input_sequence"] == steered["sequence"]
    assert row["visible"] == 2


@pytest.mark.postgres_only
async def test_a_write_by_another_process_makes_the_head_stale_and_is_kept(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    first, second = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    await post(first, sid, "steer once")
    stale = head(first, sid)
    # Another process steers: its commit moves the row past what `first` assumes.
    other = await post(second, sid, "from elsewhere")
    assert other["delivery"] == "steered"
    optimistic.clear()
    mine = await post(first, sid, "steer again")
    assert mine["delivery"] == "steered"
    # Assumed, refused, written again locking.
    assert optimistic == ["changed"]
    assert stale is not None
    assert mine["sequence"] == other["sequence"] + 1
    row = await stored(first, sid)
    # Dense, nothing lost and nothing written twice.
    assert row["events"] == list(range(1, row["last_sequence"] + 1))
    assert row["visible"] == 4
    assert row["last_input_sequence"] == mine["sequence"]
    refreshed = head(first, sid)
    assert refreshed is not None
    assert refreshed.last_sequence == mine["sequence"]


@pytest.mark.postgres_only
async def test_a_cancel_request_made_elsewhere_is_not_written_over(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    """The optimistic write sets every column it assumes: a cancel requested since
    (by a statement outside the checkpoint path) must survive the steering message."""
    first, second = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    async with second.write() as db:
        assert await sessions_service.cancel_turn(
            db, organization_id=DEFAULT_ORG_ID, session_id=sid
        )
    await post(first, sid, "steer after the cancel")
    assert optimistic == ["changed"]
    async with first.statements() as conn:
        requested = await conn.scalar(
            text("SELECT cancel_requested_at FROM sessions WHERE id = :id"), {"id": sid}
        )
    assert requested is not None


@pytest.mark.postgres_only
async def test_a_repeated_client_message_id_is_answered_as_a_duplicate(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    first, _ = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    once = await post(first, sid, "steer", client_id="retry-1")
    again = await post(first, sid, "steer", client_id="retry-1")
    assert once["delivery"] == "steered"
    assert again["delivery"] == "duplicate"
    assert optimistic == ["written", "changed"]
    assert again["id"] == once["id"]
    row = await stored(first, sid)
    assert row["visible"] == 2
    assert row["events"] == list(range(1, row["last_sequence"] + 1))


@pytest.mark.postgres_only
async def test_a_repeated_client_message_id_fails_its_batch_alone(
    handles: tuple[Database, Database], optimistic: list[str], batches: list[int]
) -> None:
    """A retry that shares its batch with other sessions' messages: the unique
    constraint fails the statement, the retry alone runs again, locking (and is
    answered as a duplicate), and the others are written by the next batch."""
    first, _ = handles
    sids = [await new_session_row(first) for _ in range(5)]
    for sid in sids:
        await post(first, sid, "start")
    once = await post(first, sids[0], "steer", client_id="retry-1")
    batches.clear()
    optimistic.clear()
    # All five queue before the batch's sender runs: one statement.
    answers = await asyncio.gather(
        post(first, sids[1], "ahead"),
        post(first, sids[0], "steer", client_id="retry-1"),
        *(
            post(first, sid, "new", client_id=f"new-{i}")
            for i, sid in enumerate(sids[2:])
        ),
    )
    assert batches == [5, 4]
    assert sorted(optimistic) == ["changed", "written", "written", "written", "written"]
    assert answers[1]["delivery"] == "duplicate"
    assert answers[1]["id"] == once["id"]
    assert {a["delivery"] for a in answers[2:]} == {"steered"}
    for sid in sids:
        row = await stored(first, sid)
        assert row["events"] == list(range(1, row["last_sequence"] + 1))
    assert (await stored(first, sids[0]))["visible"] == 2


@pytest.mark.postgres_only
async def test_a_session_deleted_elsewhere_is_not_found(
    handles: tuple[Database, Database],
) -> None:
    first, second = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    assert head(first, sid) is not None
    async with second.write() as db:
        await sessions_service.delete_session(
            db, organization_id=DEFAULT_ORG_ID, session_id=sid
        )
    with pytest.raises(SessionNotFound):
        await post(first, sid, "steer a deleted session")
    # The failed assumption dropped the head.
    assert head(first, sid) is None


@pytest.mark.postgres_only
async def test_another_organization_never_writes_through_a_head(
    handles: tuple[Database, Database],
) -> None:
    first, _ = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    data = schemas.MessageCreate.model_validate(
        {"message": {"content": [{"type": "text", "text": "not yours"}]}}
    )
    with pytest.raises(SessionNotFound):
        await first.transact(
            lambda db: service.create_message(
                db, organization_id=uuid.uuid4(), session_id=sid, data=data
            )
        )
    assert (await stored(first, sid))["visible"] == 1


def test_heads_are_bounded_and_keep_the_newest() -> None:
    heads = SessionHeads(capacity=2)
    ids = [uuid.uuid4() for _ in range(3)]

    def at(session_id: uuid.UUID, sequence: int) -> LockedSession:
        return LockedSession(
            session_id,
            DEFAULT_ORG_ID,
            "active",
            sequence,
            sequence,
            None,
            False,
            1,
            0,
            1,
        )

    heads.put(at(ids[0], 5))
    heads.put(at(ids[0], 3))  # an older commit published late
    held = heads.get(ids[0])
    assert held is not None
    assert held.last_sequence == 5
    heads.put(at(ids[1], 1))
    heads.put(at(ids[2], 1))
    assert heads.get(ids[0]) is None  # the least recently written went first
    assert heads.get(ids[1]) is not None
    assert heads.get(ids[2]) is not None
    # A copy: a unit changing what it got does not change the head.
    copy = heads.get(ids[1])
    assert copy is not None
    copy.last_sequence = 99
    again = heads.get(ids[1])
    assert again is not None
    assert again.last_sequence == 1


def test_wakeups_say_whether_they_are_quiet() -> None:
    sid = uuid.uuid4()
    for item in (Wakeup(sid, 7), Wakeup(sid, 8, quiet=True)):
        assert decode(encode(item)) == item


@pytest.mark.postgres_only
async def test_concurrent_writers_of_two_processes_share_batches_and_lose_nothing(
    handles: tuple[Database, Database], batches: list[int]
) -> None:
    """Steering messages posted at once, to the same sessions, from two processes:
    checkpoints share statements (one per session per batch), and every message is
    stored once, at its own sequence, with the events dense."""
    first, second = handles
    sessions = [await new_session_row(first) for _ in range(6)]
    for sid in sessions:
        await post(first, sid, "start")
    answers = await asyncio.gather(
        *(
            post(handle, sid, f"{index}", client_id=f"{sid}-{name}-{index}")
            for index in range(15)
            for sid in sessions
            for name, handle in (("a", first), ("b", second))
        )
    )
    assert {a["delivery"] for a in answers} == {"steered"}
    assert max(batches) > 1
    for sid in sessions:
        mine = sorted(
            a["sequence"] for a in answers if a["session_id"] == f"session_{sid.hex}"
        )
        row = await stored(first, sid)
        assert len(mine) == len(set(mine)) == 30
        assert row["visible"] == 31
        assert row["events"] == list(range(1, row["last_sequence"] + 1))
        assert row["last_input_sequence"] == max(mine)


class SlowBatches:
    """Every batch takes 0.2 s more on its way; each one's sessions are recorded with
    those of the batches on their way when it went."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on_the_way: list[set[uuid.UUID]] = []
        self.sent: list[tuple[set[uuid.UUID], list[set[uuid.UUID]]]] = []
        self.going = asyncio.Event()
        write = CheckpointBatcher._write

        async def slow(batcher: CheckpointBatcher, batch: list[Any]) -> None:
            sessions = {queued.item.session.id for queued in batch}
            self.sent.append((sessions, list(self.on_the_way)))
            self.on_the_way.append(sessions)
            self.going.set()
            try:
                await asyncio.sleep(0.2)
                await write(batcher, batch)
            finally:
                self.on_the_way.remove(sessions)

        monkeypatch.setattr(CheckpointBatcher, "_write", slow)

    def never_twice_on_the_way(self) -> None:
        for sessions, meanwhile in self.sent:
            assert all(sessions.isdisjoint(other) for other in meanwhile)


async def steering_sessions(handle: Database, count: int) -> list[uuid.UUID]:
    sids = [await new_session_row(handle) for _ in range(count)]
    for sid in sids:
        await post(handle, sid, "start")
    return sids


async def assert_dense(handle: Database, sid: uuid.UUID, visible: int) -> None:
    row = await stored(handle, sid)
    assert row["visible"] == visible
    assert row["events"] == list(range(1, row["last_sequence"] + 1))


@pytest.mark.postgres_only
async def test_a_few_checkpoints_queued_wait_for_the_batch_on_its_way(
    handles: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer than SECOND_BATCH checkpoints queued behind a batch on its way go
    together in the batch after it."""
    first, _ = handles
    a, b = await steering_sessions(first, 2)
    slow = SlowBatches(monkeypatch)
    a1 = asyncio.create_task(post(first, a, "a1", client_id="a1"))
    await asyncio.wait_for(slow.going.wait(), 10)
    b1, a2 = await asyncio.gather(
        post(first, b, "b1", client_id="b1"), post(first, a, "a2", client_id="a2")
    )
    answers = [await a1, b1, a2]
    assert [sessions for sessions, _ in slow.sent] == [{a}, {a, b}]
    slow.never_twice_on_the_way()
    assert {answer["delivery"] for answer in answers} == {"steered"}
    assert answers[2]["sequence"] > answers[0]["sequence"]
    await assert_dense(first, a, 3)
    await assert_dense(first, b, 2)


@pytest.mark.postgres_only
async def test_a_second_batch_goes_meanwhile_with_other_sessions_only(
    handles: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once SECOND_BATCH checkpoints have queued behind a batch on its way, a second
    batch goes meanwhile with those of other sessions; a checkpoint of the session on
    its way waits for a batch after it, which assumes what the first wrote."""
    first, _ = handles
    a, *others = await steering_sessions(first, SECOND_BATCH + 1)
    slow = SlowBatches(monkeypatch)
    a1 = asyncio.create_task(post(first, a, "a1", client_id="a1"))
    await asyncio.wait_for(slow.going.wait(), 10)
    later = await asyncio.gather(
        post(first, a, "a2", client_id="a2"),
        *(post(first, sid, "more", client_id=f"more-{sid}") for sid in others),
    )
    answers = [await a1, *later]
    assert slow.sent[0] == ({a}, [])
    assert slow.sent[1][1] == [{a}], (
        "no second batch went while the first was on its way"
    )
    assert a not in slow.sent[1][0]
    slow.never_twice_on_the_way()
    assert sum(len(sessions) for sessions, _ in slow.sent) == SECOND_BATCH + 2
    assert {answer["delivery"] for answer in answers} == {"steered"}
    assert answers[1]["sequence"] > answers[0]["sequence"]
    await assert_dense(first, a, 3)
    for sid in others:
        await assert_dense(first, sid, 2)


@pytest.mark.postgres_only
async def test_a_unit_that_does_more_locks_the_row_it_assumed(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    """After its deferred checkpoint, a statement of the unit locks the assumed row and
    checks it: the unit goes on as a locking one (one write, no batch), or, when the
    row changed meanwhile, raises SessionChanged with nothing written."""
    first, second = handles

    async def steer_then_read(db: Any) -> int:
        session = await lock_session(db, sid)
        assert session is not None
        written, _ = await checkpoint.append_user_message(
            db,
            session,
            content=[{"type": "text", "text": "then a read"}],
            visibility="visible",
            extra={},
            client_message_id=None,
            start_turn=True,
        )
        assert written.message is not None
        stored = await db.message(written.message.id)
        assert stored is not None
        sequence: int = stored.sequence
        return sequence

    sid = await new_session_row(first)
    await post(first, sid, "start")
    async with first.write(optimistic=True) as db:
        sequence = await steer_then_read(db)
    assert optimistic == []
    row = await stored(first, sid)
    assert row["last_input_sequence"] == sequence
    assert row["events"] == list(range(1, row["last_sequence"] + 1))
    # The row moves under the head: the unit's read finds it changed.
    await post(second, sid, "elsewhere")
    with pytest.raises(SessionChanged):
        async with first.write(optimistic=True) as db:
            await steer_then_read(db)
    assert (await stored(first, sid))["visible"] == 3


async def dense_and_known(handle: Database, sid: uuid.UUID) -> dict[str, Any]:
    """The stored row, after checking its events are dense and the process's head is
    the row as stored."""
    row = await stored(handle, sid)
    assert row["events"] == list(range(1, row["last_sequence"] + 1))
    known = head(handle, sid)
    assert known is not None
    assert known.last_sequence == row["last_sequence"]
    return row


@pytest.mark.postgres_only
async def test_a_sessions_next_unit_assumes_what_the_one_before_will_write(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    """Two steering messages of one session at once, in one process: the second unit
    assumes the row as the first one's checkpoint, still on its way, will leave it,
    and goes in the next batch. Both are written optimistically."""
    first, _ = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    one, two = await asyncio.gather(post(first, sid, "one"), post(first, sid, "two"))
    assert optimistic == ["written", "written"]
    assert {one["delivery"], two["delivery"]} == {"steered"}
    assert abs(one["sequence"] - two["sequence"]) == 1
    assert (await dense_and_known(first, sid))["visible"] == 3


@pytest.mark.postgres_only
async def test_a_unit_that_does_not_commit_takes_back_the_head_it_announced(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    """A unit whose checkpoint was handed over and then failed: the head it set for
    the session's next unit is dropped, and the next unit locks."""
    first, second = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    # Another process moves the row: this process's next optimistic unit fails.
    await post(second, sid, "elsewhere")
    answer = await post(first, sid, "stale head")
    assert answer["delivery"] == "steered"
    assert optimistic == ["changed"]
    # The locking rerun left the head as it wrote the row.
    await dense_and_known(first, sid)


async def open_agent_message(handle: Database, sid: uuid.UUID) -> Any:
    """A streaming agent message of the session's running turn, opened under the lock."""
    async with handle.write() as db:
        session = await lock_session(db, sid)
        assert session is not None
        assert session.active_turn_id is not None
        opened = await checkpoint.open_agent_message(
            db, session, turn_id=session.active_turn_id
        )
    assert opened.message is not None
    return opened.message


async def step(
    handle: Database, sid: uuid.UUID, message: Any, text_: str, optimistic: bool
) -> Any:
    """A model step's checkpoint of `message` (a copy of it is written)."""
    written = copy.copy(message)
    async with handle.write(optimistic=optimistic) as db:
        session = await lock_session(db, sid)
        assert session is not None
        await checkpoint.commit_step(
            db,
            session,
            written,
            step_id="step_1",
            parts=[{"type": "text", "text": text_}],
        )
    return written


async def stored_message(handle: Database, message_id: uuid.UUID) -> Any:
    async with handle.write() as db:
        return await db.message(message_id)


@pytest.mark.postgres_only
async def test_a_message_updated_as_assumed_is_written_in_the_group_commit(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    first, _ = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    opened = await open_agent_message(first, sid)
    written = await step(first, sid, opened, "an answer", optimistic=True)
    assert optimistic == ["written"]
    assert written.revision == opened.revision + 1
    stored_row = await stored_message(first, opened.id)
    assert stored_row.revision == written.revision
    assert stored_row.snapshot == written.snapshot
    assert stored_row.changed_sequence == written.changed_sequence
    assert [p.get("text") for p in stored_row.content] == ["an answer"]
    row = await dense_and_known(first, sid)
    assert row["last_sequence"] == written.changed_sequence


@pytest.mark.postgres_only
async def test_a_message_changed_under_its_copy_is_not_written_over(
    handles: tuple[Database, Database], optimistic: list[str]
) -> None:
    """The head is this process's own newest, but the message copy is older than the
    stored message: the group commit writes nothing of the checkpoint (the session
    row included), and under the lock the stale copy is refused."""
    first, _ = handles
    sid = await new_session_row(first)
    await post(first, sid, "start")
    opened = await open_agent_message(first, sid)
    await step(first, sid, opened, "the newer answer", optimistic=False)
    before = await stored(first, sid)
    with pytest.raises(SessionChanged):
        await step(first, sid, opened, "from a stale copy", optimistic=True)
    assert optimistic == ["changed"]
    assert await stored(first, sid) == before
    stored_row = await stored_message(first, opened.id)
    assert [p.get("text") for p in stored_row.content] == ["the newer answer"]
    with pytest.raises(StaleMessage):
        await step(first, sid, opened, "from a stale copy", optimistic=False)
    assert await stored(first, sid) == before


@pytest.mark.postgres_only
async def test_a_message_row_within_a_page_is_stored_as_written(
    handles: tuple[Database, Database],
) -> None:
    """Migration 0010: a message a few hundred bytes long is past PostgreSQL's default
    compression target, and is stored uncompressed."""
    first, _ = handles
    sid = await new_session_row(first)
    answer = await post(first, sid, " ".join(["words of a message"] * 40))
    async with first.statements() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT pg_column_compression(snapshot),"
                    " pg_column_compression(content), octet_length(snapshot)"
                    " FROM messages WHERE session_id = :sid AND sequence = :sequence"
                ),
                {"sid": sid, "sequence": answer["sequence"]},
            )
        ).one()
    assert row[2] > 700
    assert row[:2] == (None, None)


@pytest.mark.postgres_only
async def test_a_batch_reaches_each_session_by_its_primary_key_on_a_new_database() -> (
    None
):
    """A new database, before its first ANALYZE: the group commit's generic plan finds
    each session row through the primary key, not through an index of its
    organization's sessions (which it would walk whole for every checkpoint)."""
    url = await asyncio.to_thread(scratch_db.new_postgresql_database)
    try:
        conn = await asyncpg.connect(_asyncpg_dsn(url))
        try:
            # One organization's sessions, as the bench and a busy tenant have them.
            await conn.execute(
                "INSERT INTO sessions (id, organization_id, status, tags, attributes,"
                " last_sequence, visible_message_count, internal_message_count,"
                " created_at, updated_at, last_activity_at)"
                " SELECT gen_random_uuid(), $1, 'idle', '[]', '{}', 0, 0, 0, now(),"
                " now(), now() FROM generate_series(1, 64)",
                DEFAULT_ORG_ID,
            )
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE batch AS {_BATCH.text}")
            nulls = ", ".join(["NULL"] * len(_BATCH.names))
            plan = "\n".join(
                row[0] for row in await conn.fetch(f"EXPLAIN EXECUTE batch({nulls})")
            )
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(scratch_db.drop_database, url)
    assert "Index Scan using pk_sessions on sessions" in plan, plan
    assert "organization" not in plan, plan
