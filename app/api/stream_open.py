"""Opening the two streams: validate the cursors and filters, check the session, take a
connection slot, and hand off to the stream generators. Shared by the FastAPI routes
and the hot path (app/api/hot.py), so both answer alike; every refusal is an
AppError raised before anything is held."""

import uuid
from collections.abc import Sequence

from app.api.state import AppState
from app.errors import Draining, InvalidParameter
from app.events.types import validate_types
from app.ids import parse_or_400
from app.journal.events import cursor_after_event
from app.journal.sessions import owned
from app.live import frames
from app.live.items import LIVE_ONLY_TYPES
from app.live.response import EventStreamResponse
from app.live.streams import StreamConfig, message_mutations, upstream_events
from app.live.writer import StreamWriter
from app.schemas import MAX_INT32


def _config(state: AppState, keepalive: str) -> StreamConfig:
    """The keep-alive comment is `: heartbeat` upstream and `: ping` on the Mutation
    stream."""
    settings = state.settings
    return StreamConfig(
        settings.sse_retry_ms, settings.sse_cycle_seconds, frames.comment(keepalive)
    )


async def _require_session(
    state: AppState, organization_id: uuid.UUID, session_id: uuid.UUID
) -> None:
    """One statement on a driver connection: a stream's connect does no ORM work, so
    a burst of connects holds little memory while it waits for the database."""
    owned(await state.reads.head(session_id), organization_id, session_id)


def _sequence(text: str, name: str) -> int:
    """A Mutation stream cursor: ASCII digits only (`str.isdigit` would take `²` or
    Arabic-Indic digits) and within the int32 sequence space; checked by length
    before `int()`, which refuses to parse over 4,300 digits."""
    if not (text.isascii() and text.isdigit()):
        raise InvalidParameter(f"{name}: expected a non-negative integer cursor")
    if len(text.lstrip("0")) > 10 or int(text) > MAX_INT32:
        raise InvalidParameter(f"{name}: cursor beyond {MAX_INT32}")
    return int(text)


async def open_upstream(
    state: AppState,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    since_id: str | None,
    after_sequence: int | None,
    types: Sequence[str],
    exclude: Sequence[str],
    last_event_id: str | None,
    key_hash: str | None = None,
) -> EventStreamResponse:
    """Upstream's `/sse`, resuming after the `Last-Event-ID` header, else `since_id` or
    `after_sequence`. The header wins: an EventSource reconnects to the URL it was
    opened with (`?after_sequence=0` included) and sends the last `id:` it saw, which
    is the newer position. It ends when `key_hash` (the key the caller authenticated
    with) is revoked."""
    if state.draining:
        raise Draining("streams")
    type_filter = set(validate_types("types", types, LIVE_ONLY_TYPES))
    exclude_filter = set(validate_types("exclude", exclude, LIVE_ONLY_TYPES))
    if since_id is not None and after_sequence is not None:
        raise InvalidParameter("since_id and after_sequence are mutually exclusive")
    # Both are parsed even when the header wins: a malformed cursor is a bad request.
    event_uuid = (
        parse_or_400("event", "event", since_id) if since_id is not None else None
    )
    cursor = after_sequence
    if last_event_id:
        event_uuid = parse_or_400("event", "event", last_event_id)
        cursor = None
    await _require_session(state, organization_id, session_id)
    if event_uuid is not None:
        async with state.database.read() as db:
            cursor = await cursor_after_event(db, session_id, event_uuid)

    def accept(event_type: str) -> bool:
        return (
            not type_filter or event_type in type_filter
        ) and event_type not in exclude_filter

    slot = state.limits.acquire(session_id, "sse")
    writer = StreamWriter()
    return EventStreamResponse(
        upstream_events(
            database=state.database,
            fanout=state.fanout,
            session_id=session_id,
            cursor=cursor,
            accept=accept,
            config=_config(state, "heartbeat"),
            release=slot.release,
            key_hash=key_hash,
            writer=writer,
        ),
        state.fanout,
        release=slot.release,
        writer=writer,
    )


async def open_mutations(
    state: AppState,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    after: str | None,
    include_internal: bool,
    last_event_id: str | None,
    key_hash: str | None = None,
) -> EventStreamResponse:
    """The Mutation stream, resuming after the `Last-Event-ID` header, else `?after=`
    (the header wins, as on `/sse`: an EventSource reconnects to its original URL,
    `?after=0` included, with the last cursor it saw). It ends when `key_hash` is
    revoked."""
    if state.draining:
        raise Draining("streams")
    # Both are parsed even when the header wins: a malformed cursor is a bad request.
    query = _sequence(after, "after") if after else None
    cursor = _sequence(last_event_id, "Last-Event-ID") if last_event_id else query
    await _require_session(state, organization_id, session_id)
    slot = state.limits.acquire(session_id, "mutations")
    writer = StreamWriter()
    return EventStreamResponse(
        message_mutations(
            database=state.database,
            fanout=state.fanout,
            session_id=session_id,
            after=cursor,
            include_internal=include_internal,
            config=_config(state, "ping"),
            release=slot.release,
            key_hash=key_hash,
            writer=writer,
        ),
        state.fanout,
        release=slot.release,
        writer=writer,
    )
