"""The event log: the events a checkpoint appends (`EventSpec`, rendered once into
their wire JSON as they are written) and how a cursor reads them back (what the
streams replay, and where an event-id cursor resumes)."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app import wire
from app.db import models
from app.db.rows import EventRow
from app.errors import InvalidParameter
from app.ids import format_id, uuid7
from app.telemetry import traces


@dataclass(frozen=True)
class EventSpec:
    type: str
    data: dict[str, Any]
    turn_id: uuid.UUID | None = None
    input_message_id: uuid.UUID | None = None


def render_event(
    *,
    event_id: uuid.UUID,
    session_id: uuid.UUID,
    sequence: int | None,
    spec: EventSpec,
    ts: Any,
    traced: dict[str, str] | None = None,
) -> dict[str, Any]:
    context: dict[str, str] = {}
    if spec.turn_id is not None:
        context["turn_id"] = format_id("turn", spec.turn_id)
    if spec.input_message_id is not None:
        context["input_message_id"] = format_id("message", spec.input_message_id)
    if traced is not None:
        context.update(traced)
    body: dict[str, Any] = {
        "id": format_id("event", event_id),
        "type": spec.type,
        "ts": wire.event_ts(ts),
        "session_id": format_id("session", session_id),
    }
    if sequence is not None:
        body["sequence"] = sequence
    body["context"] = context
    body["data"] = spec.data
    return body


def render_event_rows(
    session_id: uuid.UUID, first: int, specs: Sequence[EventSpec], now: datetime
) -> list[EventRow]:
    """The rows of events numbered from `first`, each with its wire JSON rendered.
    While tracing is on, their context names the span that writes them (the
    checkpoint's: app/telemetry/traces.py)."""
    traced = None if traces.tracer is None else traces.event_context()
    rows = []
    for offset, spec in enumerate(specs):
        event_id = uuid7()
        sequence = first + offset
        body = render_event(
            event_id=event_id,
            session_id=session_id,
            sequence=sequence,
            spec=spec,
            ts=now,
            traced=traced,
        )
        rows.append(
            EventRow(
                id=event_id,
                sequence=sequence,
                type=spec.type,
                turn_id=spec.turn_id,
                body=wire.dumps(body).decode(),
            )
        )
    return rows


async def find_event_sequence(
    db: AsyncSession, session_id: uuid.UUID, event_id: uuid.UUID
) -> int | None:
    sequence: int | None = await db.scalar(
        select(models.Event.sequence).where(
            models.Event.session_id == session_id, models.Event.id == event_id
        )
    )
    return sequence


RESUME_MARGIN_MS = 2000


async def resume_sequence(
    db: AsyncSession, session_id: uuid.UUID, event_id: uuid.UUID
) -> int | None:
    """The sequence to resume after for a `since_id`. A durable event resumes right after
    itself. Upstream's clients also send the id of the last event they saw when it was
    a delta, which is never stored: event ids are UUIDv7 (time-ordered), so resume after
    the last durable event minted at least RESUME_MARGIN_MS before it. A few events may
    be sent again (harmless under upstream's client contract); none is skipped. None for
    an id that is neither."""
    sequence = await find_event_sequence(db, session_id, event_id)
    if sequence is not None or event_id.version != 7:
        return sequence
    ms = max((event_id.int >> 80) - RESUME_MARGIN_MS, 0)
    floor = uuid.UUID(int=ms << 80)
    before: int | None = await db.scalar(
        select(func.max(models.Event.sequence)).where(
            models.Event.session_id == session_id, models.Event.id < floor
        )
    )
    return before or 0


async def cursor_after_event(
    db: AsyncSession,
    session_id: uuid.UUID,
    event_id: uuid.UUID,
    *,
    name: str = "since_id",
) -> int:
    """The sequence a stream or list resumes after for an event-id cursor (400 if none)."""
    sequence = await resume_sequence(db, session_id, event_id)
    if sequence is None:
        raise InvalidParameter(
            f"{name}: no event {format_id('event', event_id)} in this session"
        )
    return sequence


async def event_rows(
    db: AsyncSession | AsyncConnection,
    session_id: uuid.UUID,
    *,
    after: int,
    upto: int | None = None,
    limit: int | None = None,
) -> list[tuple[int, uuid.UUID, str, str]]:
    """(sequence, id, type, body) of the events in (after, upto], oldest first: what the
    streams replay and the fan-out reads at a wake-up."""
    stmt = (
        select(
            models.Event.sequence, models.Event.id, models.Event.type, models.Event.body
        )
        .where(models.Event.session_id == session_id, models.Event.sequence > after)
        .order_by(models.Event.sequence)
    )
    if upto is not None:
        stmt = stmt.where(models.Event.sequence <= upto)
    if limit is not None:
        stmt = stmt.limit(limit)
    return [(r[0], r[1], r[2], r[3]) for r in (await db.execute(stmt)).all()]
