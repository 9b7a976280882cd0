"""Event log use-cases: render the events a checkpoint appends, and read the log."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import wire
from app.db import models
from app.db.dialect import json_text
from app.errors import InvalidParameter
from app.ids import format_id
from app.journal.events import cursor_after_event, find_event_sequence
from app.journal.sessions import session_not_found

# Event types that name a tool: `data.tool_name`, or `data.tool_call.name`.
TOOL_EVENT_TYPES = ("tool.started", "tool.completed", "tool.call_requested")


@dataclass
class EventFilter:
    after_sequence: int | None = None
    before_sequence: int | None = None
    types: Sequence[str] = field(default_factory=tuple)
    exclude: Sequence[str] = field(default_factory=tuple)
    limit: int | None = None
    turn_id: uuid.UUID | None = None
    # Bounds on the event's time, both inclusive, to the millisecond.
    from_ts: datetime | None = None
    to_ts: datetime | None = None
    tool_name: str | None = None
    # A case-insensitive substring of the event's JSON.
    q: str | None = None
    order_desc: bool = False
    # Upstream's centered window: up to `window` matching events on each side of the
    # event `around` (which is included if it matches).
    around: uuid.UUID | None = None
    window: int = 50


def _to_millisecond(value: datetime) -> datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _filtered(stmt: Any, session_id: uuid.UUID, flt: EventFilter) -> Any:
    stmt = stmt.where(models.Event.session_id == session_id)
    if flt.after_sequence is not None:
        stmt = stmt.where(models.Event.sequence > flt.after_sequence)
    if flt.before_sequence is not None:
        stmt = stmt.where(models.Event.sequence < flt.before_sequence)
    if flt.types:
        stmt = stmt.where(models.Event.type.in_(flt.types))
    if flt.exclude:
        stmt = stmt.where(models.Event.type.not_in(flt.exclude))
    if flt.turn_id is not None:
        stmt = stmt.where(models.Event.turn_id == flt.turn_id)
    # Event times are shown to the millisecond (`ts`): the bounds compare at that
    # precision, so an event's own `ts` is within both of them.
    if flt.from_ts is not None:
        stmt = stmt.where(models.Event.created_at >= _to_millisecond(flt.from_ts))
    if flt.to_ts is not None:
        stmt = stmt.where(
            models.Event.created_at
            < _to_millisecond(flt.to_ts) + timedelta(milliseconds=1)
        )
    if flt.tool_name is not None:
        stmt = stmt.where(
            models.Event.type.in_(TOOL_EVENT_TYPES),
            func.coalesce(
                json_text(models.Event.body, "data", "tool_name"),
                json_text(models.Event.body, "data", "tool_call", "name"),
            )
            == flt.tool_name,
        )
    if flt.q:
        stmt = stmt.where(
            func.lower(models.Event.body).contains(flt.q.lower(), autoescape=True)
        )
    return stmt


# Rows read per statement by a list without `limit`: the byte budget usually ends the
# read before the session's whole log is in memory.
LIST_BATCH = 500


@dataclass
class EventPage:
    """Encoded event bodies oldest first; `next_after_sequence` (reading forward) or
    `next_before_sequence` (the last N) when the byte budget ended the page early."""

    bodies: list[bytes]
    next_after_sequence: int | None = None
    next_before_sequence: int | None = None


async def _read_last(
    db: AsyncSession, session_id: uuid.UUID, flt: EventFilter, max_bytes: int
) -> EventPage:
    """The last `flt.limit` matching events, or as many of the newest as fit."""
    assert flt.limit is not None
    stmt = _filtered(
        select(models.Event.sequence, models.Event.body), session_id, flt
    ).order_by(models.Event.sequence.desc())
    rows = [(r[0], r[1].encode()) for r in (await db.execute(stmt.limit(flt.limit)))]
    kept = wire.within_budget((body for _, body in rows), max_bytes)
    kept.reverse()
    page = EventPage(kept)
    if len(kept) < len(rows):
        page.next_before_sequence = rows[len(kept) - 1][0]
    return page


async def _read_forward(
    db: AsyncSession, session_id: uuid.UUID, flt: EventFilter, max_bytes: int
) -> EventPage:
    """Matching events oldest first, in batches, until the byte budget is reached."""
    page = EventPage([])
    used = 1
    after = flt.after_sequence
    while True:
        batch = replace(flt, after_sequence=after, limit=None)
        stmt = _filtered(
            select(models.Event.sequence, models.Event.body), session_id, batch
        ).order_by(models.Event.sequence)
        rows = (await db.execute(stmt.limit(LIST_BATCH))).all()
        for sequence, text in rows:
            body = text.encode()
            used += len(body) + 1
            if page.bodies and used > max_bytes:
                page.next_after_sequence = after
                return page
            page.bodies.append(body)
            after = sequence
        if len(rows) < LIST_BATCH:
            return page


async def _read_around(
    db: AsyncSession, session_id: uuid.UUID, flt: EventFilter, max_bytes: int
) -> EventPage:
    """Up to `flt.window` matching events on each side of the anchor (and the anchor if
    it matches), oldest first. Past the byte budget the window narrows evenly on both
    sides, and says so with `has_more` (the cursors then continue from either end)."""
    assert flt.around is not None
    anchor = await find_event_sequence(db, session_id, flt.around)
    if anchor is None:
        raise InvalidParameter(
            f"around: no event {format_id('event', flt.around)} in this session"
        )
    columns = select(models.Event.sequence, models.Event.body)
    before = replace(flt, after_sequence=None, before_sequence=anchor)
    older = await db.execute(
        _filtered(columns, session_id, before)
        .order_by(models.Event.sequence.desc())
        .limit(flt.window)
    )
    after = replace(flt, after_sequence=anchor - 1, before_sequence=None)
    newer = list(
        await db.execute(
            _filtered(columns, session_id, after)
            .order_by(models.Event.sequence)
            .limit(flt.window + 1)
        )
    )
    # The anchor itself, when it matches, is not one of the window's events.
    newer = newer[: flt.window + (1 if newer and newer[0][0] == anchor else 0)]
    earlier = [(r[0], r[1].encode()) for r in older]
    later = [(r[0], r[1].encode()) for r in newer]
    kept_earlier = wire.within_budget((b for _, b in earlier), max_bytes // 2)
    kept_later = wire.within_budget((b for _, b in later), max_bytes // 2)
    page = EventPage([*reversed(kept_earlier), *kept_later])
    if len(kept_later) < len(later):
        page.next_after_sequence = later[len(kept_later) - 1][0]
    elif len(kept_earlier) < len(earlier):
        page.next_before_sequence = earlier[len(kept_earlier) - 1][0]
    return page


async def count_events(
    db: AsyncSession, session_id: uuid.UUID, flt: EventFilter
) -> int:
    stmt = _filtered(
        select(func.count()).select_from(models.Event),
        session_id,
        replace(flt, limit=None),
    )
    return int(await db.scalar(stmt) or 0)


# How far before an ephemeral event's id a resume starts: covers durable events whose ids
# were minted before the delta but committed after it, and clock skew across nodes.
async def require_session(
    db: AsyncSession, *, organization_id: uuid.UUID, session_id: uuid.UUID
) -> None:
    found = await db.scalar(
        select(models.Session.id).where(
            models.Session.id == session_id,
            models.Session.organization_id == organization_id,
        )
    )
    if found is None:
        raise session_not_found(session_id)


async def list_events(
    db: AsyncSession,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    since_id: uuid.UUID | None,
    flt: EventFilter,
    max_bytes: int,
) -> tuple[bytes, int | None]:
    """`{"data": [...]}` of stored event bodies, and with `flt.limit` the total count of
    matching events (for X-Total-Count). A page whose bodies would pass `max_bytes`
    ends early with `has_more` and the cursor to continue from: forward
    (`next_after_sequence`) or, for the last N, backward (`next_before_sequence`)."""
    await require_session(db, organization_id=organization_id, session_id=session_id)
    if since_id is not None:
        flt.after_sequence = await cursor_after_event(db, session_id, since_id)
    total: int | None = None
    if flt.around is not None:
        page = await _read_around(db, session_id, flt, max_bytes)
    elif flt.limit is not None:
        page = await _read_last(db, session_id, flt, max_bytes)
        total = await count_events(db, session_id, flt)
    else:
        page = await _read_forward(db, session_id, flt, max_bytes)
    if flt.order_desc:
        page.bodies.reverse()
    tail: dict[str, Any] = {}
    if page.next_after_sequence is not None:
        tail = {"has_more": True, "next_after_sequence": page.next_after_sequence}
    elif page.next_before_sequence is not None:
        tail = {"has_more": True, "next_before_sequence": page.next_before_sequence}
    body = b'{"data":' + wire.join_array(page.bodies)
    return body + (b"," + wire.dumps(tail)[1:] if tail else b"}"), total
