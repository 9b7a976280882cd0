"""The hot routes served below FastAPI's routing and dependency machinery (under
`/v1` and `/api/v1`): `GET /sessions/{id}/messages`, `GET .../messages/{id}`, and the
two streams, `GET .../sse` and `GET .../messages/stream`, whose long-lived connections
then hold no per-request framework state.

A request is served here only when everything about it is plain: a well-formed id, a
query of known parameters in canonical form, a caller whose organization is already
known (open mode or a cached key). Anything else, and any session this process cannot
find, goes on to the FastAPI routes, which answer it (errors included) exactly as the
OpenAPI contract says. Both paths run the same service functions, so they answer the
same bytes; the only difference is the per-request work this path skips.
"""

import re
import uuid
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import AppError, NotFound
from app.live import service as live_service
from app.live.response import EventStreamResponse
from app.messages import service
from app.schemas import MAX_INT32

if TYPE_CHECKING:
    from app.state import AppState

SESSION_ID = re.compile(r"session_[0-9a-f]{32}\Z")
MESSAGE_ID = re.compile(r"message_[0-9a-f]{32}\Z")
POSITIVE = re.compile(rb"[1-9][0-9]{0,9}\Z")
SEQUENCE = re.compile(r"(0|[1-9][0-9]{0,9})\Z")
BOOLEANS = {b"true": True, b"false": False}
JSON_HEADER = (b"content-type", b"application/json")


def _query(raw: bytes, default_limit: int, max_limit: int) -> service.PageQuery | None:
    """The page query when every parameter is known, given once and canonical."""
    limit = default_limit
    before: int | None = None
    internal = False
    seen: set[bytes] = set()
    if raw:
        for pair in raw.split(b"&"):
            key, _, value = pair.partition(b"=")
            if key in seen:
                return None
            seen.add(key)
            if key == b"limit" and POSITIVE.match(value):
                limit = min(int(value), max_limit)
            elif key == b"before_sequence" and POSITIVE.match(value):
                before = int(value)
                if before > MAX_INT32:
                    return None
            elif key == b"include_internal" and value in BOOLEANS:
                internal = BOOLEANS[value]
            else:
                return None
    return service.PageQuery(limit, before, internal)


class HotReads:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and await self._serve(scope, receive, send)
        ):
            return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is a plain hot request; False to pass it on."""
        parts = scope["path"].split("/")
        if len(parts) > 1 and parts[1] == "api":
            del parts[1]
        # ['', 'v1', 'sessions', <id>, 'messages' | 'sse'(, <message id> | 'stream')]
        if (
            len(parts) not in (5, 6)
            or parts[1] != "v1"
            or parts[2] != "sessions"
            or parts[4] not in ("messages", "sse")
            or scope.get("root_path")
            or not SESSION_ID.match(parts[3])
        ):
            return False
        state: AppState = scope["app"].state.app
        authorization = if_none_match = last_event_id = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = value.decode("latin-1")
            elif name == b"last-event-id":
                last_event_id = value.decode("latin-1")
        org = state.keys.cached_organization(authorization)
        if org is None:
            return False
        session_id = uuid.UUID(hex=parts[3][8:])
        if parts[4] == "sse" or parts[-1] == "stream":
            if len(parts) == 5 and parts[4] == "sse":
                opened = await _open_upstream(
                    state, org, session_id, scope["query_string"], last_event_id
                )
            elif len(parts) == 6 and parts[4] == "messages":
                opened = await _open_mutations(
                    state, org, session_id, scope["query_string"], last_event_id
                )
            else:
                return False
            if opened is None:
                return False
            await opened(scope, receive, send)
            return True
        if len(parts) == 6:
            if not MESSAGE_ID.match(parts[5]) or scope["query_string"]:
                return False
            try:
                body = await service.get_message(
                    state.reads,
                    state.cache,
                    organization_id=org,
                    session_id=session_id,
                    message_id=uuid.UUID(hex=parts[5][8:]),
                )
            except NotFound:
                return False
            await _send(send, 200, [JSON_HEADER], body)
            return True
        settings = state.settings
        query = _query(
            scope["query_string"],
            settings.messages_page_default,
            settings.messages_page_max,
        )
        if query is None:
            return False
        try:
            etag, page = await service.list_messages(
                state.reads,
                state.cache,
                organization_id=org,
                session_id=session_id,
                query=query,
                if_none_match=if_none_match,
            )
        except NotFound:
            return False
        etag_header = (b"etag", etag.encode())
        if page is None:
            await _send(send, 304, [etag_header], b"")
        else:
            await _send(send, 200, [etag_header, JSON_HEADER], page)
        return True


def _stream_query(
    raw: bytes, single: set[str], repeated: set[str]
) -> dict[str, list[str]] | None:
    """Query values by name, as Starlette decodes them; None unless every name is known
    and each `single` one appears once."""
    values: dict[str, list[str]] = {}
    for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if key not in single and key not in repeated:
            return None
        values.setdefault(key, []).append(value)
    if any(len(values.get(key, ())) > 1 for key in single):
        return None
    return values


async def _open_upstream(
    state: "AppState",
    org: uuid.UUID,
    session_id: uuid.UUID,
    raw: bytes,
    last_event_id: str | None,
) -> EventStreamResponse | None:
    query = _stream_query(raw, {"since_id", "after_sequence"}, {"types", "exclude"})
    if query is None:
        return None
    after_sequence = None
    if "after_sequence" in query:
        text = query["after_sequence"][0]
        if not SEQUENCE.match(text) or int(text) > MAX_INT32:
            return None
        after_sequence = int(text)
    since = query.get("since_id")
    try:
        return await live_service.open_upstream(
            state,
            organization_id=org,
            session_id=session_id,
            since_id=since[0] if since else None,
            after_sequence=after_sequence,
            types=query.get("types", ()),
            exclude=query.get("exclude", ()),
            last_event_id=last_event_id,
        )
    except AppError:
        return None


async def _open_mutations(
    state: "AppState",
    org: uuid.UUID,
    session_id: uuid.UUID,
    raw: bytes,
    last_event_id: str | None,
) -> EventStreamResponse | None:
    query = _stream_query(raw, {"after", "include_internal"}, set())
    if query is None:
        return None
    internal = query.get("include_internal", ["false"])[0]
    if internal not in ("true", "false"):
        return None
    after = query.get("after")
    try:
        return await live_service.open_mutations(
            state,
            organization_id=org,
            session_id=session_id,
            after=after[0] if after else None,
            include_internal=internal == "true",
            last_event_id=last_event_id,
        )
    except AppError:
        return None


async def _send(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    if status != 304:
        headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
