"""The hot routes, served in front of FastAPI's middleware, routing and dependency
machinery (under `/v1` and `/api/v1`): `GET /sessions/{id}/messages`,
`GET .../messages/{id}`, the two streams, `GET .../sse` and
`GET .../messages/stream`, whose long-lived connections then hold no per-request
framework state, and `POST /sessions/{id}/messages` (the write every turn begins with,
and with `?wait=true` the request a chat client holds while the turn runs).

A request is served here only when everything about it is plain: a well-formed id, a
query of known parameters in canonical form, a caller whose organization is already
known (open mode or a cached key), no CORS to apply. Anything else, and any session
this process cannot find, goes on to FastAPI, which answers it (errors included)
exactly as the OpenAPI contract says. A POST is served here only when its body is
valid JSON that the request model accepts and the service stores it; a body the model
refuses, or a refusal of the service (which writes nothing), goes on to FastAPI with
the body read here, and FastAPI answers it as it would have. Once the message is
stored, its wait's failure (a revoked key) is answered here. Both paths run the same
service functions, so they answer the same bytes; what this path does itself is what
the middleware would: an `X-Request-Id` (the caller's, if valid), the rate limit, and
problem+json for a failure. It sets the request and session ids as the context of log
lines only while uvicorn writes access lines (`tag_logs`): otherwise nothing here logs
but a failure, which names its request itself.
"""

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from app.api import endpoints, guards, messages, stream_open, streams
from app.api.guards import RateLimiter
from app.auth import Caller
from app.errors import (
    AppError,
    NotFound,
    failure_response,
    incoming_request_id,
    next_request_id,
)
from app.live.response import EventStreamResponse
from app.messages.schemas import MessageCreate
from app.messages.service import PageQuery
from app.metrics import Metrics
from app.schemas import MAX_INT32
from app.settings import Settings
from app.telemetry import logs

if TYPE_CHECKING:
    from app.api.state import AppState

SESSION_ID = re.compile(r"session_[0-9a-f]{32}\Z")
MESSAGE_ID = re.compile(r"message_[0-9a-f]{32}\Z")
POSITIVE = re.compile(rb"[1-9][0-9]{0,9}\Z")
SEQUENCE = re.compile(r"(0|[1-9][0-9]{0,9})\Z")
BOOLEANS = {b"true": True, b"false": False}
JSON_HEADER = (b"content-type", b"application/json")
QUERIES_MAX = 256


def _query(raw: bytes, settings: Settings) -> PageQuery | None:
    """The page query when every parameter is known, given once and canonical."""
    limit: int | None = None
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
                limit = int(value)
            elif key == b"before_sequence" and POSITIVE.match(value):
                before = int(value)
                if before > MAX_INT32:
                    return None
            elif key == b"include_internal" and value in BOOLEANS:
                internal = BOOLEANS[value]
            else:
                return None
    return endpoints.page_query(settings, limit, before, internal)


@dataclass(frozen=True, slots=True)
class PostQuery:
    """The query of a `POST .../messages` served here: none, or `wait=true` with at
    most a `timeout_ms`."""

    wait: bool = False
    timeout_ms: int | None = None


NO_QUERY = PostQuery()


def _post_query(raw: bytes) -> PostQuery | None:
    """The POST's query when it is one this path serves, else None."""
    if not raw:
        return NO_QUERY
    wait = False
    timeout_ms: int | None = None
    seen: set[bytes] = set()
    for pair in raw.split(b"&"):
        key, _, value = pair.partition(b"=")
        if key in seen:
            return None
        seen.add(key)
        if key == b"wait" and value == b"true":
            wait = True
        elif key == b"timeout_ms" and POSITIVE.match(value):
            timeout_ms = int(value)
            if timeout_ms > endpoints.WAIT_MAX_MS:
                return None
        else:
            return None
    return PostQuery(True, timeout_ms) if wait else None


def _template(router: APIRouter, endpoint: Callable[..., Any]) -> str:
    """The route template of `endpoint` in its router's table."""
    return next(
        route.path
        for route in router.routes
        if isinstance(route, APIRoute) and route.endpoint is endpoint
    )


# The route templates FastAPI labels the same requests with (app/metrics.py): within
# the API, without its `/v1` or `/api/v1` prefix.
PAGE_ROUTE = _template(messages.router, messages.list_messages)
MESSAGE_ROUTE = _template(messages.router, messages.get_message)
SSE_ROUTE = _template(streams.router, streams.stream_sse)
MUTATIONS_ROUTE = _template(streams.router, streams.stream_messages)


class Hot:
    """One request on the hot path: its id, whether its answer has started, and what
    the metrics record of it."""

    __slots__ = ("id", "id_header", "method", "metrics", "route", "start", "started")

    def __init__(self, request_id: str, metrics: Metrics | None, method: str) -> None:
        self.id = request_id
        self.method = method
        self.id_header = (b"x-request-id", request_id.encode())
        self.started = False
        self.metrics = metrics
        self.start = time.perf_counter() if metrics is not None else 0.0
        self.route = PAGE_ROUTE

    def done(self, status: int) -> None:
        """The answer's status is known (for a stream: it opens)."""
        if self.metrics is not None:
            self.metrics.request(
                self.route, self.method, status, time.perf_counter() - self.start
            )

    def adopt(self, value: bytes) -> None:
        """Answer with the caller's X-Request-Id, if it may be kept."""
        if incoming_request_id(value) is not None:
            self.id = value.decode("ascii")
            self.id_header = (b"x-request-id", value)

    async def send(
        self, send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        self.done(status)
        headers.append(self.id_header)
        if status != 304:
            headers.append((b"content-length", str(len(body)).encode()))
        self.started = True
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})


class HotRoutes:
    def __init__(
        self,
        limiter: RateLimiter | None,
        cors: bool,
        tag_logs: bool = False,
        metrics: Metrics | None = None,
    ) -> None:
        self.limiter = limiter
        self.cors = cors
        self.metrics = metrics
        # Whether log lines (uvicorn's access lines) should carry the request id.
        self.tag_logs = tag_logs
        # Set once the application has started (its lifespan builds the state).
        self.state: AppState | None = None
        # Parsed page queries by their raw bytes: pollers repeat the same few query
        # strings, and parsing one cost ~10 % of a cached 304. Bounded: emptied whole
        # when full.
        self.queries: dict[bytes, PageQuery | None] = {}

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Answer an HTTP request if it is a plain hot request (None). Otherwise, with
        nothing sent, the `receive` FastAPI must read the request from: the server's,
        or a replay of the body read here."""
        method = scope["method"]
        if self.state is None or method not in ("GET", "POST"):
            return receive
        if self.cors and any(name == b"origin" for name, _ in scope["headers"]):
            return receive
        request = Hot(next_request_id(), self.metrics, method)
        try:
            if method == "POST":
                return await self._post(self.state, request, scope, receive, send)
            answered = await self._serve(self.state, request, scope, receive, send)
            return None if answered else receive
        except Exception as exc:
            if request.started:
                raise
            response = failure_response(request.id, scope, exc)
            request.done(response.status_code)
            response.raw_headers.append(request.id_header)
            await response(scope, receive, send)
            return None

    def _tag(self, request: "Hot", session: str) -> None:
        # The request's own task: the context ends with it.
        logs.REQUEST_ID.set(request.id)
        logs.SESSION_ID.set(session)

    async def _refused(
        self,
        limiter: RateLimiter,
        request: "Hot",
        caller: Caller,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> bool:
        """Answer 429 if the rate limiter refuses the caller. The callers check that
        there is a limiter first: a coroutine per request costs a 304 measurably."""
        refusal = limiter.refusal_for(scope, caller)
        if refusal is None:
            return False
        request.done(refusal.status_code)
        refusal.raw_headers.append(request.id_header)
        request.started = True
        await refusal(scope, receive, send)
        return True

    async def _post(
        self,
        state: "AppState",
        request: "Hot",
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> Receive | None:
        """`POST /sessions/{id}/messages`, with no query or `?wait=true` (and at
        most a `timeout_ms`), with a declared JSON body within the size cap."""
        parts = _session_path(scope)
        if parts is None or len(parts) != 5 or parts[4] != "messages":
            return receive
        query = _post_query(scope["query_string"])
        if query is None:
            return receive
        authorization = content_type = length = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                return receive
            elif name == b"x-request-id":
                request.adopt(value)
        settings = state.settings
        if (
            content_type is None
            or not guards.is_json(content_type)
            or length is None
            or not length.isdigit()
            or int(length) > settings.max_body_bytes
        ):
            return receive
        caller = state.keys.cached(authorization)
        if caller is None:
            return receive
        if self.tag_logs:
            self._tag(request, parts[3])
        request.route = PAGE_ROUTE
        limiter = self.limiter
        if limiter is not None and await self._refused(
            limiter, request, caller, scope, receive, send
        ):
            return None
        scope[guards.COUNTED] = True
        body = await _read_body(receive)
        if body is None:
            return None  # the client went away
        replay = guards.replay(body, receive)
        session_id = uuid.UUID(hex=parts[3][8:])
        waiting = None
        try:
            try:
                # pydantic's own JSON reader reads every value as Starlette's
                # `json.loads` does (orjson reads an integer past 64 bits as a float),
                # in one pass; a body it refuses (one `json.loads` takes, as UTF-16)
                # is FastAPI's to answer.
                data = MessageCreate.model_validate_json(body)
                endpoints.accept_message(state, data)
                # A wait is admitted before anything is written.
                if query.wait:
                    waiting = endpoints.Wait(state, caller, session_id)
                answer = await endpoints.store_message(
                    state, caller.organization_id, session_id, data
                )
            except (ValueError, ValidationError, AppError):
                # Refused, and nothing was written: FastAPI's answer is the
                # contract's.
                return replay
            status = 201
            if waiting is not None:
                # Stored: from here on a failure is answered here (problem+json).
                status, answer = await waiting.answer(answer, query.timeout_ms, receive)
        finally:
            if waiting is not None:
                waiting.close()
        await request.send(send, status, [JSON_HEADER], answer)
        return None

    async def _serve(
        self,
        state: "AppState",
        request: "Hot",
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> bool:
        """A GET of a page, a message or a stream; False: FastAPI's to answer."""
        parts = _session_path(scope)
        # ['', 'v1', 'sessions', <id>, 'messages' | 'sse'(, <message id> | 'stream')]
        if (
            parts is None
            or len(parts) not in (5, 6)
            or parts[4] not in ("messages", "sse")
        ):
            return False
        authorization = if_none_match = last_event_id = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"if-none-match":
                if_none_match = value.decode("latin-1")
            elif name == b"last-event-id":
                last_event_id = value.decode("latin-1")
            elif name == b"x-request-id":
                request.adopt(value)
        if self.tag_logs:
            self._tag(request, parts[3])
        caller = state.keys.cached(authorization)
        if caller is None:
            return False
        limiter = self.limiter
        if limiter is not None and await self._refused(
            limiter, request, caller, scope, receive, send
        ):
            return True
        session_id = uuid.UUID(hex=parts[3][8:])
        if parts[4] == "sse" or parts[-1] == "stream":
            opened = await self._open_stream(
                state, request, parts, caller, session_id, scope, last_event_id
            )
            if opened is None:
                return False
            # This frame lives as long as the stream: hold nothing in it.
            del parts, authorization, if_none_match, last_event_id, caller
            await opened(scope, receive, send)
            return True
        if len(parts) == 6:
            # A conditional GET of one message (`If-None-Match: *`) is FastAPI's.
            if (
                not MESSAGE_ID.match(parts[5])
                or scope["query_string"]
                or if_none_match is not None
            ):
                return False
            request.route = MESSAGE_ROUTE
            message_id = uuid.UUID(hex=parts[5][8:])
            try:
                body = await endpoints.read_message(
                    state, caller.organization_id, session_id, message_id
                )
            except NotFound:
                return False
            await request.send(send, 200, [JSON_HEADER], body)
            return True
        return await self._page(
            state, request, caller, session_id, scope, send, if_none_match
        )

    async def _open_stream(
        self,
        state: "AppState",
        request: "Hot",
        parts: list[str],
        caller: Caller,
        session_id: uuid.UUID,
        scope: Scope,
        last_event_id: str | None,
    ) -> EventStreamResponse | None:
        """The stream's response, opened (None: FastAPI's to answer)."""
        if len(parts) == 5 and parts[4] == "sse":
            request.route = SSE_ROUTE
            opened = await _open_upstream(
                state, caller, session_id, scope["query_string"], last_event_id
            )
        elif len(parts) == 6 and parts[4] == "messages":
            request.route = MUTATIONS_ROUTE
            opened = await _open_mutations(
                state, caller, session_id, scope["query_string"], last_event_id
            )
        else:
            return None
        if opened is not None:
            request.done(opened.status_code)
            opened.raw_headers.append(request.id_header)
            request.started = True
        return opened

    async def _page(
        self,
        state: "AppState",
        request: "Hot",
        caller: Caller,
        session_id: uuid.UUID,
        scope: Scope,
        send: Send,
        if_none_match: str | None,
    ) -> bool:
        raw_query = scope["query_string"]
        if raw_query in self.queries:
            query = self.queries[raw_query]
        else:
            # Never refused by `page_query`: `limit` matched a positive number here.
            query = _query(raw_query, state.settings)
            if len(self.queries) >= QUERIES_MAX:
                self.queries.clear()
            self.queries[raw_query] = query
        if query is None:
            return False
        try:
            etag, page = await endpoints.read_page(
                state, caller.organization_id, session_id, query, if_none_match
            )
        except NotFound:
            return False
        etag_header = (b"etag", etag.encode())
        if page is None:
            await request.send(send, 304, [etag_header], b"")
        else:
            await request.send(send, 200, [etag_header, JSON_HEADER], page)
        return True


async def _read_body(receive: Receive) -> bytes | None:
    """The request body (None if the client disconnected). Bounded: the server ends
    the body at its declared `Content-Length`, which the caller checked."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _session_path(scope: Scope) -> list[str] | None:
    """The path's segments, `/api` dropped, when it is `/v1/sessions/<well-formed id>`
    or below it (and the app is not mounted under a root path)."""
    parts: list[str] = scope["path"].split("/")
    if len(parts) > 1 and parts[1] == "api":
        del parts[1]
    if (
        len(parts) < 4
        or parts[1] != "v1"
        or parts[2] != "sessions"
        or scope.get("root_path")
        or not SESSION_ID.match(parts[3])
    ):
        return None
    return parts


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
    caller: Caller,
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
        return await stream_open.open_upstream(
            state,
            organization_id=caller.organization_id,
            session_id=session_id,
            since_id=since[0] if since else None,
            after_sequence=after_sequence,
            types=query.get("types", ()),
            exclude=query.get("exclude", ()),
            last_event_id=last_event_id,
            key_hash=caller.key_hash,
        )
    except AppError:
        return None


async def _open_mutations(
    state: "AppState",
    caller: Caller,
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
        return await stream_open.open_mutations(
            state,
            organization_id=caller.organization_id,
            session_id=session_id,
            after=after[0] if after else None,
            include_internal=internal == "true",
            last_event_id=last_event_id,
            key_hash=caller.key_hash,
        )
    except AppError:
        return None
