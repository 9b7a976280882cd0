"""The AI SDK's chat routes (`useChat` with `DefaultChatTransport`): HTTP only; the
protocol is app/frontends/ai_sdk.py."""

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Response

from app import wire
from app.api import endpoints, guards
from app.api.deps import CallerDep, StateDep
from app.api.sse_schemas import frontend_stream
from app.api.state import AppState
from app.auth import Caller
from app.errors import BODY_PROBLEMS, Draining, InvalidRequest, problem_responses
from app.frontends import ai_sdk, answers as answers_service, runs
from app.frontends.projection import TurnProjection
from app.ids import format_id, parse_id, parse_or_400
from app.live import frames
from app.live.response import EventStreamResponse
from app.sessions import fork, service as sessions

router = APIRouter(tags=["frontends"])

UI_STREAM_RESPONSES = frontend_stream(
    "The UI message stream, v1 (`x-vercel-ai-ui-message-stream`): one chunk per "
    "`data:` line, then `data: [DONE]` (docs/frontends.md); `: ping` comments",
    done=True,
)

ChatIdPath = Annotated[
    str, Path(pattern=ai_sdk.CHAT_ID_PATTERN, description="The chat's id")
]


@router.post(
    "/chat",
    response_class=EventStreamResponse,
    responses={
        **UI_STREAM_RESPONSES,
        **problem_responses(400, 401, 404, 409, 422, 429, *BODY_PROBLEMS),
    },
)
async def chat(
    data: ai_sdk.ChatRequest, state: StateDep, caller: CallerDep
) -> EventStreamResponse:
    """The AI SDK's chat endpoint: stores the last message (the user's; its UI id is
    its `client_message_id`, so a message sent again is not stored twice) in the
    session the chat id names (created on first use), and streams the reply of the
    turn it started or joined as UI message chunks. `regenerate-message` asks the
    answer's question again in a fork, where the chat goes on."""
    if state.draining:
        raise Draining("streams")
    if data.trigger == "regenerate-message":
        return await _regenerate(state, caller, data)
    if data.messages[-1].role == "assistant":
        return await _answer(state, caller, data)
    try:
        message = ai_sdk.user_message(data)
    except ai_sdk.UnsupportedPart as exc:
        raise InvalidRequest(
            f"messages: a user message part of type {exc} cannot be stored; "
            "text parts and image files can"
        ) from exc
    if message is None:
        raise InvalidRequest(
            "messages: the last message must be the user's, or the assistant's "
            "with answers to its approvals and tool calls"
        )
    endpoints.accept_message(state, message)
    session_id = await _session(state, caller, data.id, create=True)
    assert session_id is not None
    snapshot = wire.loads(
        await endpoints.store_message(
            state, caller.organization_id, session_id, message
        )
    )
    turn_id = parse_id("turn", snapshot["turn_id"])
    cursor = await runs.turn_cursor(state.database, session_id, turn_id)
    return _turn_stream(state, caller, session_id, turn_id, cursor)


async def _regenerate(
    state: AppState, caller: Caller, data: ai_sdk.ChatRequest
) -> EventStreamResponse:
    """`regenerate-message`: the answer (`messageId`, else the last assistant message
    sent) is asked again in a fork of the chat's session that ends before its
    question, and the chat id moves to the fork, so the chat goes on there; the old
    branch stays a session of its own (`forked_from_*` links them)."""
    answer_id = data.messageId or next(
        (m.id for m in reversed(data.messages) if m.role == "assistant"), None
    )
    if answer_id is None:
        raise InvalidRequest("messageId: no assistant message to regenerate")
    message_id = parse_or_400("message", "messageId", answer_id)
    session_id = await _session(state, caller, data.id, create=False)
    if session_id is None:
        raise InvalidRequest("id: no chat of this id has started")
    async with state.database.write() as db:
        forked = await fork.ask_again(
            db,
            organization_id=caller.organization_id,
            session_id=session_id,
            message_id=message_id,
            content=None,
            admission=state.admission,
        )
        await sessions.move_external_id(db, source=session_id, target=forked.session.id)
    assert forked.message is not None
    turn_id = parse_id("turn", wire.loads(forked.message)["turn_id"])
    cursor = await runs.turn_cursor(state.database, forked.session.id, turn_id)
    return _turn_stream(state, caller, forked.session.id, turn_id, cursor)


async def _answer(
    state: AppState, caller: Caller, data: ai_sdk.ChatRequest
) -> EventStreamResponse:
    """The last message is the assistant's, carrying the user's decisions on its
    approvals and the outputs of the tools the frontend ran: apply those the turn
    waits for, then stream the rest of the turn (what the frontend holds is not sent
    again)."""
    answers = ai_sdk.answers(data.messages[-1])
    for index, (_, output, _) in enumerate(answers.outputs):
        guards.check_json_field(f"messages.output.{index}", output, state.settings)
    session_id = await _session(state, caller, data.id, create=False)
    if session_id is None:
        raise InvalidRequest("id: no chat of this id has started")
    async with state.database.write() as db:
        applied = await answers_service.apply(
            db,
            organization_id=caller.organization_id,
            session_id=session_id,
            answers=answers,
        )
    return _turn_stream(
        state, caller, session_id, applied.turn_id, applied.cursor, applied
    )


@router.get(
    "/chat/{chat_id}/stream",
    response_class=EventStreamResponse,
    responses={
        **UI_STREAM_RESPONSES,
        204: {"description": "No turn is running in the chat's session."},
        **problem_responses(400, 401, 404, 429),
    },
)
async def resume_chat(
    chat_id: ChatIdPath, state: StateDep, caller: CallerDep
) -> Response:
    """The AI SDK's resume: the running turn's reply from its start (the SDK replaces
    the partial message it holds), read from the session's log, so it resumes on any
    process; 204 when nothing runs."""
    if state.draining:
        raise Draining("streams")
    session_id = await _session(state, caller, chat_id, create=False)
    if session_id is None:
        return Response(status_code=204)
    turn_id = await runs.running_turn(state.database, session_id)
    if turn_id is None:
        return Response(status_code=204)
    cursor = await runs.turn_cursor(state.database, session_id, turn_id)
    return _turn_stream(state, caller, session_id, turn_id, cursor)


async def _session(
    state: AppState, caller: Caller, chat_id: str, *, create: bool
) -> uuid.UUID | None:
    return await runs.thread_session(
        state.database,
        organization_id=caller.organization_id,
        thread_id=chat_id,
        create=create,
    )


def _turn_stream(
    state: AppState,
    caller: Caller,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    cursor: int,
    applied: answers_service.Applied | None = None,
) -> EventStreamResponse:
    slot = state.limits.acquire(session_id, "ai_sdk")
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
    response = EventStreamResponse(
        ai_sdk.ui_chunks(mutations, turn), state.fanout, release=slot.release
    )
    response.raw_headers.extend(ai_sdk.HEADERS)
    return response
