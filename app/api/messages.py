"""Message routes: create (and wait for its turn), list (the seed's pagination) and
read one snapshot."""

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response

from app import wire
from app.api import endpoints
from app.api.deps import CallerDep, OrgId, SessionId, StateDep
from app.errors import BODY_PROBLEMS, InvalidParameter, problem_responses
from app.ids import parse_or_400
from app.messages import schemas
from app.schemas import MAX_INT32

router = APIRouter(tags=["messages"])


@router.post(
    "/sessions/{session_id}/messages",
    status_code=201,
    response_model=schemas.Message,
    responses={
        200: {
            "model": schemas.WaitResult,
            "description": "`wait=true`: the turn ended (completed, failed or cancelled)",
        },
        202: {
            "model": schemas.WaitTimeout | schemas.WaitWaiting,
            "description": "`wait=true`: the turn waits for the client (its tool"
            " results or an approval: `waiting`), or did not end within `timeout_ms`"
            " (`timeout`)",
        },
        **problem_responses(400, 401, 404, 409, 422, 429, *BODY_PROBLEMS),
    },
)
async def create_message(
    session_id: SessionId,
    data: schemas.MessageCreate,
    caller: CallerDep,
    state: StateDep,
    request: Request,
    wait: Annotated[
        bool,
        Query(description="Answer when the turn this message starts or joins ends"),
    ] = False,
    timeout_ms: Annotated[
        int | None,
        Query(
            description="With `wait=true`: how long to wait, 1..600000 ms "
            '(default 120000); then `202 {status: "timeout"}`',
            # Documented here; the handler enforces it (400).
            json_schema_extra={"minimum": 1, "maximum": endpoints.WAIT_MAX_MS},
        ),
    ] = None,
) -> Response:
    """Store a user message. `delivery` says what happened: `started` (a new turn began),
    `steered` (joined the running turn) or `duplicate` (this `client_message_id` was seen
    before with the same body: the stored message is returned and nothing is written).
    The same `client_message_id` with a different body is `409`
    `client_message_id_conflict`. A message that would start a turn while its
    organization or the server runs as many as allowed is `429` with `Retry-After`.

    With `wait=true` the answer comes when the message's turn ends: `200 {status:
    "completed"|"failed", message, messages, error?}` (`message` as stored, `messages`
    the turn's agent messages), `202 {status: "waiting", waiting_for, message,
    messages}` as soon as the turn waits for the client (`tool_results` or
    `approval`), or `202 {status: "timeout", message}` after `timeout_ms`. Open waits count against the stream limits (`429`); revoking the key
    ends a wait with `401`, and a wait whose client has gone ends at once."""
    if timeout_ms is not None and not 1 <= timeout_ms <= endpoints.WAIT_MAX_MS:
        raise InvalidParameter(
            f"timeout_ms: must be between 1 and {endpoints.WAIT_MAX_MS}"
        )
    endpoints.accept_message(state, data)
    # A wait is admitted before anything is written: a refused one changes nothing.
    waiting = endpoints.Wait(state, caller, session_id) if wait else None
    try:
        # The unit of work commits here, before any wait: the turn must see it.
        body = await endpoints.store_message(
            state, caller.organization_id, session_id, data
        )
        if waiting is None:
            return wire.json_response(body, 201)
        status, answer = await waiting.answer(body, timeout_ms, request.receive)
        return wire.json_response(answer, status)
    finally:
        if waiting is not None:
            waiting.close()


@router.get(
    "/sessions/{session_id}/messages",
    response_model=schemas.MessagePage,
    responses={
        200: {"headers": {"ETag": {"schema": {"type": "string"}}}},
        304: {"description": "Not Modified: `If-None-Match` names the current ETag"},
        **problem_responses(400, 401, 404),
    },
)
async def list_messages(
    session_id: SessionId,
    org: OrgId,
    state: StateDep,
    limit: Annotated[
        int | None,
        Query(
            description="Page size; default 50, values above 200 are capped",
            # Documented here; the handler enforces it (400).
            json_schema_extra={"minimum": 1},
        ),
    ] = None,
    before_sequence: Annotated[
        int | None,
        Query(ge=1, le=MAX_INT32, description="Only messages with sequence < N"),
    ] = None,
    include_internal: Annotated[
        bool, Query(description="Include visibility=internal messages")
    ] = False,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
) -> Response:
    """Messages oldest first within a page; without `before_sequence` the newest page.
    Walk older history with `next_before_sequence`. Pages never split a message; a
    page whose messages would pass MAX_LIST_BYTES holds the newest that fit, with
    `has_more` and `next_before_sequence` for the rest. Responses carry an `ETag`;
    polling with `If-None-Match` (or `*`) answers `304` until the session changes."""
    query = endpoints.page_query(
        state.settings, limit, before_sequence, include_internal
    )
    etag, body = await endpoints.read_page(state, org, session_id, query, if_none_match)
    if body is None:
        return Response(status_code=304, headers={"ETag": etag})
    return wire.json_response(body, headers={"ETag": etag})


@router.get(
    "/sessions/{session_id}/messages/{message_id}",
    response_model=schemas.Message,
    responses=problem_responses(400, 401, 404),
)
async def get_message(
    session_id: SessionId,
    message_id: Annotated[
        str,
        Path(
            description="Message ID (format: message_{32-hex})",
            json_schema_extra={"pattern": "^message_[0-9a-f]{32}$"},
        ),
    ],
    org: OrgId,
    state: StateDep,
) -> Response:
    """One message snapshot."""
    message_uuid = parse_or_400("message", "message", message_id)
    body = await endpoints.read_message(state, org, session_id, message_uuid)
    return wire.json_response(body)
