"""The runner's SQL: every statement a turn, its recovery and its history read, in one
place. Each function takes the database and runs its own unit of work (a checkpoint's
statements are the journal's, inside the fenced unit of `Fence.checkpoint`), or the
single-statement reads (app/db/reads.py) for what every turn and step reads first."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, or_, select

from app.db import models
from app.db.admission import Units
from app.db.reads import HistoryRow, Reads
from app.db.rows import MessageRow
from app.db.types import utcnow
from app.journal import checkpoint

# The step cap of a session created without `max_iterations`.
DEFAULT_MAX_ITERATIONS = 20
# Upstream's session status while a turn waits for client-side tool results.
WAITING = "waitingfortoolresults"


# Built once: building and cache-keying a statement costs more CPU than running it.
_ATTRIBUTES = select(models.Session.attributes).where(
    models.Session.id == bindparam("session_id")
)


@dataclass(frozen=True, slots=True)
class ActiveTurn:
    """The session's turn to run (None: none), its step cap, and whether its agent
    message is open: a runner before this one left it unfinished, to be resumed."""

    turn_id: uuid.UUID | None
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    resumed: bool = False
    # The session as read with it: what its first step starts from (see `Recent`).
    session: "SessionPart | None" = None


async def active_turn(reads: Reads, session_id: uuid.UUID) -> ActiveTurn:
    """The session's running turn. A turn waiting for client tool results has no
    runner until they arrive (or a cancel is requested)."""
    row = await reads.active_turn(session_id)
    if row is None:
        return ActiveTurn(None)
    cap = int(row.attributes.get("max_iterations") or DEFAULT_MAX_ITERATIONS)
    if not runnable(row.turn_id, row.status, row.cancel_requested):
        return ActiveTurn(None, cap)
    session = SessionPart(row.cancel_requested, row.attributes)
    return ActiveTurn(row.turn_id, cap, row.resumed, session)


def runnable(turn_id: uuid.UUID | None, status: str, cancel_requested: bool) -> bool:
    """Whether a session row so described has a turn for a runner: one is active and
    it does not wait for client tool results (unless a cancel is requested)."""
    return turn_id is not None and (status != WAITING or cancel_requested)


async def session_tools(
    database: Units, session_id: uuid.UUID
) -> tuple[list[dict[str, Any]], bool]:
    """The session's tool definitions as they are now (a PATCH takes effect at the
    next step), and whether tools that require approval ask for it."""
    async with database.statements() as conn:
        attributes = await conn.scalar(_ATTRIBUTES, {"session_id": session_id})
    attributes = attributes or {}
    ask = attributes.get("approval_mode") != "always-allow"
    return list(attributes.get("tools") or []), ask


@dataclass(frozen=True, slots=True)
class SessionPart:
    """What a step reads of the session row: whether a cancel was requested, and its
    attributes."""

    cancel_requested: bool
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Recent:
    """What a step starts from, as stored: the session's part, and its newest
    messages, oldest first."""

    session: SessionPart
    messages: Sequence[HistoryRow]


@dataclass(slots=True)
class Window:
    """A session's newest messages as its runner last read them (by sequence), and
    the change cursor they are known up to. Every checkpoint of a message sets its
    `changed_sequence` past every earlier one of the session (and messages are never
    deleted but with their session), so a read of what changed since brings the
    window up to date: a step of a long conversation reads the messages that changed
    since the step before instead of its whole recent history."""

    rows: dict[int, HistoryRow] = field(default_factory=dict)
    # The rows, oldest first, as the last read left them.
    newest: list[HistoryRow] = field(default_factory=list)
    # The highest `changed_sequence` read; None: nothing read yet.
    changed: int | None = None
    # Rows the last read fetched.
    fetched: int = 0

    def reset(self) -> None:
        self.rows.clear()
        self.changed = None

    def merge(self, rows: Sequence[HistoryRow], limit: int) -> list[HistoryRow]:
        """The window with `rows` (what changed, or the newest whole) merged in: its
        `limit` newest, oldest first."""
        self.fetched = len(rows)
        changed = self.changed or 0
        for row in rows:
            self.rows[row.sequence] = row
            changed = max(changed, row.changed_sequence)
        self.changed = changed
        order = sorted(self.rows)
        for sequence in order[:-limit]:
            del self.rows[sequence]
        self.newest = [self.rows[sequence] for sequence in order[-limit:]]
        return self.newest


async def recent_messages(
    reads: Reads,
    session_id: uuid.UUID,
    limit: int,
    session: SessionPart | None = None,
    window: Window | None = None,
) -> Recent:
    """The session's cancel request and attributes (read first: a cancel that commits
    after it is seen at the step's checkpoint; `session` when they were just read),
    and its `limit` newest messages: with `window`, only those that changed since it
    was read, merged into it. Each read is one statement on the reads' driver."""
    if session is None:
        part = await reads.session_part(session_id)
        session = SessionPart(*part) if part is not None else SessionPart(False, {})
    rows: Sequence[HistoryRow] | None = None
    if window is not None and window.changed is not None:
        changed = await reads.changed_messages(session_id, window.changed, limit)
        if len(changed) < limit:
            rows = changed
        else:
            # As many changes as the window holds: it is read whole.
            window.reset()
    if rows is None:
        rows = await reads.newest_messages(session_id, limit)
    if window is None:
        return Recent(session, list(reversed(rows)))
    return Recent(session, window.merge(rows, limit))


@dataclass(frozen=True, slots=True)
class StoredSummary:
    first_sequence: int
    last_sequence: int
    text: str


async def newest_summary(
    database: Units, session_id: uuid.UUID, newest: int
) -> StoredSummary | None:
    """The newest stored summary that ends at or before message `newest`."""
    async with database.statements() as conn:
        row = (
            await conn.execute(
                select(
                    models.ComposerSummary.first_sequence,
                    models.ComposerSummary.last_sequence,
                    models.ComposerSummary.text,
                )
                .where(
                    models.ComposerSummary.session_id == session_id,
                    models.ComposerSummary.last_sequence <= newest,
                )
                .order_by(models.ComposerSummary.last_sequence.desc())
                .limit(1)
            )
        ).one_or_none()
    return None if row is None else StoredSummary(*row)


async def store_summary(
    database: Units, session_id: uuid.UUID, first: int, through: int, text: str
) -> None:
    """A summary of messages `first`..`through`, as derived data (IntegrityError when
    another runner stored that range first)."""
    async with database.write() as db:
        conn = await db.core()
        await conn.execute(
            insert(models.ComposerSummary).values(
                id=uuid.uuid4(),
                session_id=session_id,
                first_sequence=first,
                last_sequence=through,
                text=text,
                created_at=utcnow(),
            )
        )


async def seen_input(database: Units, session_id: uuid.UUID, turn_id: uuid.UUID) -> int:
    """The newest user message the turn's last step saw, for a turn resumed without
    running another: what arrived while it waited for client tool results (after its
    `tool.call_requested`) it did not see."""
    async with database.statements() as conn:
        waited = await conn.scalar(
            select(func.max(models.Event.sequence)).where(
                models.Event.session_id == session_id,
                models.Event.turn_id == turn_id,
                models.Event.type == "tool.call_requested",
            )
        )
        seen = select(func.max(models.Message.sequence)).where(
            models.Message.session_id == session_id,
            models.Message.role == "user",
        )
        if waited is not None:
            seen = seen.where(models.Message.sequence < waited)
        return int(await conn.scalar(seen) or 0)


async def tool_status(
    database: Units, message_id: uuid.UUID, tool_call_id: str
) -> str | None:
    """The stored status of one tool call of a message."""
    async with database.statements() as conn:
        content = await conn.scalar(
            select(models.Message.content).where(models.Message.id == message_id)
        )
    for part in content or ():
        if part.get("type") == "tool_call" and part.get("id") == tool_call_id:
            return str(part.get("status"))
    return None


async def read_message(database: Units, message_id: uuid.UUID) -> MessageRow:
    """A message as stored, in the form checkpoints write from."""
    async with database.write() as db:
        return await checkpoint.get_message_for_update(db, message_id)


async def open_message(
    database: Units, session_id: uuid.UUID, turn_id: uuid.UUID
) -> MessageRow | None:
    """The turn's agent message, if it is still streaming (a turn to resume)."""
    async with database.write() as db:
        rows = await db.streaming_messages(session_id)
    return next((m for m in rows if m.turn_id == turn_id), None)


async def orphaned_turns(database: Units, cutoff: datetime) -> list[uuid.UUID]:
    """Sessions whose turn runs with neither a write nor a lease renewal since
    `cutoff`: candidates for recovery."""
    async with database.read() as db:
        return list(
            (
                await db.scalars(
                    select(models.Session.id).where(
                        models.Session.active_turn_id.is_not(None),
                        # A turn waiting for client tool results has no runner to
                        # lose: it waits durably (a cancel kicks a runner).
                        or_(
                            models.Session.status != WAITING,
                            models.Session.cancel_requested_at.is_not(None),
                        ),
                        models.Session.last_activity_at <= cutoff,
                        or_(
                            models.Session.runner_renewed_at.is_(None),
                            models.Session.runner_renewed_at <= cutoff,
                        ),
                    )
                )
            ).all()
        )
