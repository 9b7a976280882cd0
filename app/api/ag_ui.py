"""AG-UI routes (`@ag-ui/client`'s HttpAgent, CopilotKit): HTTP only; the protocol is
app/frontends/ag_ui.py."""

import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from app import wire
from app.api import endpoints
from app.api.deps import CallerDep, SessionId, StateDep
from app.api.sse_schemas import frontend_stream
from app.api.state import AppState
from app.auth import Caller
from app.errors import (
    BODY_PROBLEMS,
    Draining,
    InvalidRequest,
    Unprocessable,
    problem_responses,
)
from app.frontends import ag_ui, answers as answers_service, runs, tools
from app.frontends.projection import TurnProjection
from app.ids import format_id, parse_id
from app.live import frames
from app.live.response import EventStreamResponse
from app.messages.schemas import MessageCreate
from app.sessions import service as sessions
from app.tools import schema_check
from app.tools.schemas import ToolDefinition, Tools

router = APIRouter(tags=["frontends"])

# A session's own checks on a tool list: each definition, the count, unique names.
CLIENT_TOOLS: TypeAdapter[list[ToolDefinition]] = TypeAdapter(Tools)

RUN_RESPONSES: dict[int | str, dict[str, Any]] = {
    **frontend_stream(
        "The run: AG-UI events, one per `data:` line, from RUN_STARTED to "
        "RUN_FINISHED or RUN_ERROR (docs/frontends.md); `: ping` comments"
    ),
    **problem_responses(400, 401, 404, 409, 422, 429, *BODY_PROBLEMS),
}
CAPABILITIES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "AG-UI AgentCapabilities"},
    **problem_responses(400, 401, 404),
}


@router.post("/ag-ui", response_class=EventStreamResponse, responses=RUN_RESPONSES)
async def run_agent(
    data: ag_ui.RunAgentInput, state: StateDep, caller: CallerDep
) -> EventStreamResponse:
    """Run the agent on the thread `threadId` names: a session id of the caller's, or
    an id of the frontend's own naming the session created on its first use. The last
    message, if the user's, is stored and its turn streamed; `resume[]` and trailing
    tool messages answer a waiting turn, which goes on; a run with neither reconnects:
    the thread's history (MESSAGES_SNAPSHOT), then the running turn from its start."""
    message = _message(state, data)
    offered = await _client_tools(data)
    session_id = await _thread(state, caller, data.threadId)
    return await _run(state, caller, session_id, data, message, offered)


@router.post(
    "/sessions/{session_id}/ag-ui",
    response_class=EventStreamResponse,
    responses=RUN_RESPONSES,
)
async def run_session_agent(
    session_id: SessionId, data: ag_ui.RunAgentInput, state: StateDep, caller: CallerDep
) -> EventStreamResponse:
    """`POST /v1/ag-ui` on this session, whatever `threadId` says (it is echoed)."""
    message = _message(state, data)
    offered = await _client_tools(data)
    await _thread(state, caller, format_id("session", session_id))
    return await _run(state, caller, session_id, data, message, offered)


@router.get("/ag-ui/capabilities", responses=CAPABILITIES_RESPONSES)
async def agent_capabilities(caller: CallerDep) -> JSONResponse:
    """What the agent supports, as AG-UI's AgentCapabilities."""
    return JSONResponse(ag_ui.CAPABILITIES)


@router.get(
    "/sessions/{session_id}/ag-ui/capabilities", responses=CAPABILITIES_RESPONSES
)
async def session_agent_capabilities(
    session_id: SessionId, state: StateDep, caller: CallerDep
) -> JSONResponse:
    """The agent's capabilities on this session: its own tools listed."""
    async with state.database.read() as db:
        session = await sessions.get_session(
            db, organization_id=caller.organization_id, session_id=session_id
        )
    items = [
        {"name": t["name"], "description": t.get("description", "")}
        for t in session.attributes.get("tools") or []
        if t.get("type") == "builtin"
    ]
    tools_capability = {**ag_ui.CAPABILITIES["tools"], "items": items}
    return JSONResponse({**ag_ui.CAPABILITIES, "tools": tools_capability})


async def _thread(state: AppState, caller: Caller, thread_id: str) -> uuid.UUID:
    if state.draining:
        raise Draining("streams")
    session_id = await runs.thread_session(
        state.database,
        organization_id=caller.organization_id,
        thread_id=thread_id,
        create=True,
    )
    assert session_id is not None
    return session_id


def _message(state: AppState, data: ag_ui.RunAgentInput) -> MessageCreate | None:
    """The run's new user message, checked before anything is written."""
    try:
        message = ag_ui.user_message(data)
    except ag_ui.UnsupportedContent as exc:
        raise InvalidRequest(
            f"messages: user message content of type {exc} cannot be stored; text can"
        ) from exc
    if message is not None:
        endpoints.accept_message(state, message)
    return message


async def _run(
    state: AppState,
    caller: Caller,
    session_id: uuid.UUID,
    data: ag_ui.RunAgentInput,
    message: MessageCreate | None,
    offered: list[ToolDefinition],
) -> EventStreamResponse:
    if offered:
        async with state.database.write() as db:
            await tools.offer(
                db,
                organization_id=caller.organization_id,
                session_id=session_id,
                tools=offered,
                model_name=lambda m: state.catalog.get(m).name,
            )
    events = ag_ui.RunEvents(data.threadId, data.runId)
    answered = ag_ui.answers(data)
    applied = None
    if answered.approvals or answered.outputs:
        async with state.database.write() as db:
            applied = await answers_service.apply(
                db,
                organization_id=caller.organization_id,
                session_id=session_id,
                answers=answered,
            )
    if message is not None:
        stored = wire.loads(
            await endpoints.store_message(
                state, caller.organization_id, session_id, message
            )
        )
        turn_id = parse_id("turn", stored["turn_id"])
        if applied is None or applied.turn_id != turn_id:
            cursor = await runs.turn_cursor(state.database, session_id, turn_id)
            return _stream(state, caller, session_id, turn_id, cursor, events)
    if applied is not None:
        # The history first: the calls the turn made in earlier runs, which the
        # results that follow answer.
        recent = await runs.recent_messages(
            state.database, session_id, before=None, limit=ag_ui.SNAPSHOT_MESSAGES
        )
        return _stream(
            state,
            caller,
            session_id,
            applied.turn_id,
            applied.cursor,
            events,
            applied,
            snapshot=ag_ui.history(recent),
        )
    return await _reconnect(state, caller, session_id, events)


async def _client_tools(data: ag_ui.RunAgentInput) -> list[ToolDefinition]:
    """The frontend's tools, checked before the thread is looked up or created, so
    that a bad list changes nothing."""
    try:
        definitions = CLIENT_TOOLS.validate_python(ag_ui.client_tools(data))
    except ValueError as exc:
        raise Unprocessable(f"tools: {exc}") from exc
    await schema_check.check_tools(definitions)
    return definitions


async def _reconnect(
    state: AppState, caller: Caller, session_id: uuid.UUID, events: ag_ui.RunEvents
) -> EventStreamResponse:
    """A run without new input: the thread's history before the running turn, then
    that turn from its start (or, with none running, the history alone)."""
    turn_id = await runs.running_turn(state.database, session_id)
    before = None
    if turn_id is not None:
        before = await runs.first_message_of_turn(state.database, session_id, turn_id)
    recent = await runs.recent_messages(
        state.database, session_id, before=before, limit=ag_ui.SNAPSHOT_MESSAGES
    )
    snapshot = ag_ui.history(recent)
    if turn_id is None:
        response = EventStreamResponse(
            ag_ui.run_events(None, None, events, snapshot), state.fanout
        )
        return response
    cursor = await runs.turn_cursor(state.database, session_id, turn_id)
    return _stream(
        state, caller, session_id, turn_id, cursor, events, snapshot=snapshot
    )


def _stream(
    state: AppState,
    caller: Caller,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    cursor: int,
    events: ag_ui.RunEvents,
    applied: answers_service.Applied | None = None,
    snapshot: list[dict[str, Any]] | None = None,
) -> EventStreamResponse:
    slot = state.limits.acquire(session_id, "ag_ui")
    mutations = runs.turn_mutations(
        database=state.database,
        fanout=state.fanout,
        session_id=session_id,
        after=cursor,
        retry_ms=state.settings.sse_retry_ms,
        keepalive=frames.comment("ping"),
        release=slot.release,
        key_hash=caller.key_hash,
    )
    turn = TurnProjection(format_id("turn", turn_id))
    if applied is not None:
        applied.prime(turn)
    return EventStreamResponse(
        ag_ui.run_events(mutations, turn, events, snapshot),
        state.fanout,
        release=slot.release,
    )
