"""Client-side tool results: stored under the session lock, one checkpoint per result;
the turn goes on (a runner is kicked) once every call of its step has its result.
Services never commit: the caller's unit of work does."""

import uuid
from typing import Any

from sqlalchemy import select

from app import wire
from app.db import models
from app.db.rows import LockedSession, MessageRow
from app.db.writes import Write
from app.errors import Conflict, Unprocessable, clip
from app.ids import format_id
from app.journal import lifecycle
from app.journal.events import EventSpec
from app.journal.sessions import lock_owned_session
from app.journal.tool_calls import tool_transition
from app.tools.schemas import ToolResult, ToolResultsRequest, ToolResultsResponse

WAITING = "waitingfortoolresults"


class NotWaitingForToolResults(Conflict):
    # The official SDK retries a 409 whose detail holds "not waiting for tool results".
    code = "not_waiting_for_tool_results"


class ToolResultConflict(Conflict):
    code = "tool_result_conflict"


def result_text(item: ToolResult) -> list[dict[str, Any]] | None:
    """A result as `tool.completed` carries it (upstream: content parts)."""
    if item.result is None:
        return None
    text = (
        item.result
        if isinstance(item.result, str)
        else wire.dumps(item.result).decode()
    )
    return [{"type": "text", "text": text}]


async def _waiting_message(db: Write, session: LockedSession) -> MessageRow | None:
    """The streaming agent message of the session's turn, if the turn waits."""
    if session.status != WAITING or session.active_turn_id is None:
        return None
    return next(
        (
            m
            for m in await db.streaming_messages(session.id)
            if m.turn_id == session.active_turn_id
        ),
        None,
    )


async def _recorded(
    db: Write, session_id: uuid.UUID, tool_call_id: str
) -> dict[str, Any] | None:
    """The `tool.completed` data of a client result stored earlier for this call."""
    conn = await db.core()
    stmt = select(models.Event.body).where(
        models.Event.session_id == session_id, models.Event.type == "tool.completed"
    )
    encoded = wire.dumps(tool_call_id).decode()
    # autoescape: PostgreSQL reads a backslash in a LIKE pattern as its escape character,
    # and JSON escapes both `"` and the backslash with one.
    stmt = stmt.where(
        models.Event.body.contains(f'"tool_call_id":{encoded}', autoescape=True)
    )
    for body in (await conn.scalars(stmt.order_by(models.Event.sequence.desc()))).all():
        data: dict[str, Any] = wire.loads(body)["data"]
        if data.get("tool_call_id") == tool_call_id and data.get("source") == "client":
            return data
    return None


async def submit_tool_results(
    db: Write,
    *,
    organization_id: uuid.UUID,
    session_id: uuid.UUID,
    data: ToolResultsRequest,
) -> ToolResultsResponse:
    """Store client-side tool results.

    Each result for a call awaiting the client moves its tool to `completed` (or
    `failed`, with `error`) with its tool_result part, one checkpoint each; once no
    call of the step waits any more, the session is `active` again and the turn goes
    on wherever a runner takes it. A result stored before with the same content is
    not stored again, and a request made only of such repeats is answered as the
    first one was. Refusals change nothing: nothing waits (409, "not waiting for tool
    results"), an unknown call (422), another result for a call that has one (409)."""
    session = await lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    message = await _waiting_message(db, session)
    pending = {
        p["id"]
        for p in (message.content if message is not None else ())
        if p.get("type") == "tool_call"
        and lifecycle.current(p.get("status")) == lifecycle.AWAITING_CLIENT
    }
    fresh: list[ToolResult] = []
    repeats: list[dict[str, Any]] = []
    for index, item in enumerate(data.tool_results):
        if item.tool_call_id in pending:
            fresh.append(item)
            continue
        recorded = await _recorded(db, session.id, item.tool_call_id)
        if recorded is None:
            if message is None:
                raise NotWaitingForToolResults(
                    f"Session {format_id('session', session_id)} is not waiting for "
                    "tool results"
                )
            raise Unprocessable(
                f"tool_results.{index}.tool_call_id: no call "
                f"'{clip(item.tool_call_id, 100)}' of this session waits for a result"
            )
        if (recorded.get("result"), recorded.get("error")) != (
            result_text(item),
            item.error,
        ):
            raise ToolResultConflict(
                f"tool_results.{index}: tool call '{clip(item.tool_call_id, 100)}' "
                "already has a different result"
            )
        repeats.append(recorded)
    if not fresh:
        # The last result a request stored recorded `active` if it let the turn go
        # on; every earlier one recorded that the session still waited.
        statuses = {r.get("session_status") for r in repeats}
        return ToolResultsResponse(
            accepted=len(repeats), status="active" if "active" in statuses else WAITING
        )
    assert message is not None
    remaining = pending - {item.tool_call_id for item in fresh}
    for position, item in enumerate(fresh):
        final = position == len(fresh) - 1
        then = []
        if final and not remaining:
            # The wait is over: upstream's event for the session's return to `active`
            # (a `session` Mutation too), in the checkpoint of the last result.
            session.status = "active"
            then.append(await _activated(db, session.id, message))
        status = lifecycle.FAILED if item.error is not None else lifecycle.COMPLETED
        await tool_transition(
            db,
            session,
            message,
            tool_call_id=item.tool_call_id,
            status=status,
            result=item.result,
            error=item.error,
            event_data={"source": "client", "session_status": session.status},
            then=then,
        )
    if not remaining:
        db.outbox.kick(session.id)
    return ToolResultsResponse(
        accepted=len(fresh) + len(repeats), status=session.status
    )


async def _activated(
    db: Write, session_id: uuid.UUID, message: MessageRow
) -> EventSpec:
    """Upstream's `session.activated` (the turn and the input it answers) for a turn
    that goes on once the client's results are in."""
    assert message.turn_id is not None, "a waiting tool call belongs to a turn"
    data = {"turn_id": format_id("turn", message.turn_id)}
    source = await db.turn_input(session_id, message.turn_id)
    if source is not None:
        data = {"input_message_id": format_id("message", source.id), **data}
    return EventSpec(
        "session.activated",
        data,
        turn_id=message.turn_id,
        input_message_id=source.id if source is not None else None,
    )
