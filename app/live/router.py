"""The two SSE streams: upstream's `/sse` and the Mutation stream. The routes validate
and look up before streaming, then hand off to generators that own their resources."""

import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent

from app.deps import OrgId, SessionId, StateDep
from app.errors import InvalidRequest, problem_responses
from app.events.router import validate_types
from app.events.service import find_event_sequence
from app.ids import parse_or_400
from app.live.streams import StreamConfig, message_mutations, upstream_events
from app.sessions import service as sessions_service
from app.state import AppState

router = APIRouter(tags=["streams"])

SSE_RESPONSES = {
    200: {
        "description": "A text/event-stream of frames",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **problem_responses(400, 401, 404, 429),
}


def _response(state: AppState, frames: AsyncIterator[bytes]) -> EventSourceResponse:
    return EventSourceResponse(
        frames,
        ping=state.settings.sse_heartbeat_seconds,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat", sep="\n"),
        sep="\n",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        send_timeout=state.settings.sse_send_timeout_seconds,
    )


def _sequence(text: str, name: str) -> int:
    if not text.isdigit():
        raise InvalidRequest(f"{name}: expected a non-negative integer cursor")
    return int(text)


async def _check_session(
    state: AppState, org: uuid.UUID, session_id: uuid.UUID
) -> None:
    async with state.database.read() as db:
        await sessions_service.get_session(
            db, organization_id=org, session_id=session_id
        )


@router.get(
    "/sessions/{session_id}/sse",
    response_class=EventSourceResponse,
    responses=SSE_RESPONSES,
)
async def stream_sse(
    session_id: SessionId,
    state: StateDep,
    org: OrgId,
    since_id: Annotated[str | None, Query()] = None,
    after_sequence: Annotated[
        int | None, Query(ge=0, description="0 replays the whole session")
    ] = None,
    types: Annotated[list[str] | None, Query()] = None,
    exclude: Annotated[list[str] | None, Query()] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Upstream's event stream: `connected`, then durable events after the cursor
    (`since_id`, `after_sequence` or the `Last-Event-ID` header), then live events
    including deltas. `: heartbeat` comments keep it open; a `disconnecting` frame
    precedes each periodic close."""
    type_filter = set(validate_types("types", types))
    exclude_filter = set(validate_types("exclude", exclude))
    if since_id is not None and after_sequence is not None:
        raise InvalidRequest("since_id and after_sequence are mutually exclusive")
    event_cursor = since_id
    if event_cursor is None and after_sequence is None and last_event_id:
        event_cursor = last_event_id
    if event_cursor is not None:
        event_uuid = parse_or_400("event", "event", event_cursor)
    await _check_session(state, org, session_id)
    cursor = after_sequence
    if event_cursor is not None:
        async with state.database.read() as db:
            cursor = await find_event_sequence(db, session_id, event_uuid)
        if cursor is None:
            raise InvalidRequest(f"since_id: no event {event_cursor} in this session")

    def accept(event_type: str) -> bool:
        return (
            not type_filter or event_type in type_filter
        ) and event_type not in exclude_filter

    slot = state.limits.acquire(session_id)
    return _response(
        state,
        upstream_events(
            database=state.database,
            fanout=state.fanout,
            session_id=session_id,
            cursor=cursor,
            accept=accept,
            config=StreamConfig(
                state.settings.sse_retry_ms, state.settings.sse_cycle_seconds
            ),
            release=slot.release,
        ),
    )


@router.get(
    "/sessions/{session_id}/messages/stream",
    response_class=EventSourceResponse,
    responses=SSE_RESPONSES,
)
async def stream_messages(
    session_id: SessionId,
    state: StateDep,
    org: OrgId,
    after: Annotated[str | None, Query(description="Resume after this cursor")] = None,
    include_internal: bool = False,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """The Mutation stream: `message` (complete snapshot, `id:` = cursor), `part` and
    `delta` (the live projection), `reset` (reload snapshots). On connect it replays the
    latest snapshot of every message changed after the cursor, then the live parts of
    messages still streaming."""
    cursor_text = after if after is not None else last_event_id
    cursor = _sequence(cursor_text, "after") if cursor_text else None
    await _check_session(state, org, session_id)
    slot = state.limits.acquire(session_id)
    return _response(
        state,
        message_mutations(
            database=state.database,
            fanout=state.fanout,
            session_id=session_id,
            after=cursor,
            include_internal=include_internal,
            config=StreamConfig(
                state.settings.sse_retry_ms, state.settings.sse_cycle_seconds
            ),
            release=slot.release,
        ),
    )
