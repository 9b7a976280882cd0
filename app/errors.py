"""RFC 9457 problem details: the AppError hierarchy and every handler that renders errors."""

import itertools
import logging
import re
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.telemetry import logs

log = logging.getLogger("app.errors")

PROBLEM_JSON = "application/problem+json"
ERROR_TYPE_BASE = "https://docs.everruns.com/errors/"


# Echoed input is clipped: a problem names what was wrong, it does not repeat a 60 KB
# value back. Longer details end in an ellipsis; a longer path is left out of
# `instance`; at most MAX_LISTED_ERRORS field errors are listed.
MAX_DETAIL_CHARS = 1000
MAX_INSTANCE_CHARS = 2048
MAX_LISTED_ERRORS = 20
MAX_LOC_PART_CHARS = 100

# The `code` of a problem whose raiser names none: every problem has a code and type.
DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    412: "precondition_failed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


class ErrorMember(BaseModel):
    """The `error` extension member (RFC 9457 §3.2): what the official SDKs read."""

    code: str = Field(description="Same as the problem's `code`.")
    message: str = Field(description="The problem's `detail`, else its `title`.")


class FieldError(BaseModel):
    loc: list[str] = Field(description="Where: `body`/`query`/`header`, then the path.")
    msg: str
    type: str


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, as upstream's `ErrorResponse`, with an `error`
    extension member for SDKs that read `{"error": {"code", "message"}}`."""

    model_config = ConfigDict(extra="allow")

    title: str
    status: int
    detail: str | None = None
    code: str
    type: str
    instance: str | None = None
    retry_after_seconds: int | None = None
    error: ErrorMember
    errors: list[FieldError] | None = Field(
        default=None,
        description=f"422 and query 400s: each offending field (at most {MAX_LISTED_ERRORS}).",
    )


class AppError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str | None] = None
    title: ClassVar[str | None] = None

    def __init__(
        self, detail: str | None = None, *, retry_after_seconds: int | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_seconds = retry_after_seconds


class InvalidRequest(AppError):
    status = 400
    code = "bad_request"


class InvalidParameter(InvalidRequest):
    """A query or header value the route cannot use."""

    code = "invalid_parameter"


class InvalidId(InvalidRequest):
    """A malformed `{prefix}_{32 hex}` id, with upstream's text."""

    code = "invalid_id"


class Unauthorized(AppError):
    status = 401
    code = "unauthorized"


class NotFound(AppError):
    status = 404
    code = "not_found"


class Conflict(AppError):
    status = 409
    code = "conflict"


class Unprocessable(AppError):
    status = 422
    code = "validation_error"


class TooManyRequests(AppError):
    status = 429
    code = "rate_limited"


class Unavailable(AppError):
    status = 503
    code = "unavailable"


# A draining process's answer: another process (behind the same address) takes the
# request at once, so the client is told to retry almost immediately.
DRAINING_RETRY_AFTER_SECONDS = 1


class Draining(Unavailable):
    """This process is shutting down (SIGTERM): it takes no new turn or stream."""

    code = "draining"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"This server is shutting down and takes no new {what}; retry (another "
            "server answers)",
            retry_after_seconds=DRAINING_RETRY_AFTER_SECONDS,
        )


class SessionNotFound(NotFound):
    code = "session_not_found"
    title = "Not Found"


class MessageNotFound(NotFound):
    code = "message_not_found"
    title = "Not Found"


class ModelNotFound(NotFound):
    code = "model_not_found"
    title = "Not Found"


class ClientMessageIdConflict(Conflict):
    """A `client_message_id` reused with a different request body."""

    code = "client_message_id_conflict"


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` made safe to echo: lone surrogates (which no UTF-8 encoder writes) shown
    as `\\udXXX` escapes, and cut to at most `limit` characters, marked with an
    ellipsis when cut."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"


def problem_response(
    status: int,
    *,
    detail: str | None = None,
    code: str | None = None,
    title: str | None = None,
    instance: str | None = None,
    retry_after_seconds: int | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    title = title or HTTPStatus(status).phrase
    code = code or DEFAULT_CODES.get(status) or "error"
    body: dict[str, Any] = {"title": title, "status": status}
    if detail is not None:
        detail = clip(detail)
        body["detail"] = detail
    body["code"] = code
    body["type"] = ERROR_TYPE_BASE + code
    if instance is not None and len(instance) <= MAX_INSTANCE_CHARS:
        body["instance"] = instance
    if retry_after_seconds is not None:
        body["retry_after_seconds"] = retry_after_seconds
        headers = {**(headers or {}), "Retry-After": str(retry_after_seconds)}
    if extra:
        body.update(extra)
    body["error"] = {"code": code, "message": detail or title}
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def _field_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Each error's location (extended by app/schemas.check_value's `where`, the path
    inside the field), message and type; never the input, and clipped."""
    listed = []
    for e in errors[:MAX_LISTED_ERRORS]:
        where = (e.get("ctx") or {}).get("where") or ()
        listed.append(
            {
                "loc": [clip(str(p), MAX_LOC_PART_CHARS) for p in (*e["loc"], *where)],
                "msg": clip(str(e.get("msg", ""))),
                "type": str(e.get("type", "")),
            }
        )
    return listed


def _describe(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:5]:
        loc = ".".join(
            p for p in e["loc"] if p not in ("body", "query", "path", "header")
        )
        parts.append(f"{loc or 'body'}: {e['msg']}")
    return "; ".join(parts)


async def _app_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AppError)
    return app_error_response(exc, request.url.path)


def app_error_response(exc: AppError, path: str | None) -> Response:
    return problem_response(
        exc.status,
        detail=exc.detail,
        code=exc.code,
        title=exc.title,
        instance=path,
        retry_after_seconds=exc.retry_after_seconds,
        # RFC 9110: a 401 names the scheme the client should use.
        headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None,
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = _field_errors(exc.errors())
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            400,
            detail="Malformed JSON body",
            code="invalid_json",
            instance=request.url.path,
        )
    # Query, path and header values are the caller's URL: 400. A well-formed body that
    # does not validate is 422, naming each offending field.
    in_body = any(e["loc"] and e["loc"][0] == "body" for e in errors)
    status = 422 if in_body else 400
    return problem_response(
        status,
        detail=_describe(errors),
        code="validation_error" if in_body else "invalid_parameter",
        instance=request.url.path,
        extra={"errors": errors},
    )


# Paths that another route's path parameter would also take, and what they serve:
# `/sessions/import` is not a session id.
LITERAL_PATHS = {"/sessions/import": "POST"}


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (GET /sessions and POST /sessions
    are two routes), found by asking the routes to match a probe of each method."""
    path = request.scope["path"]
    for literal, methods in LITERAL_PATHS.items():
        if path.endswith(literal):
            return methods
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        probe: Scope = {
            "type": "http",
            "method": method,
            "path": request.scope["path"],
            "root_path": request.scope.get("root_path", ""),
            "headers": [],
            "query_string": b"",
        }
        if any(
            route.matches(probe)[0] is Match.FULL for route in request.app.router.routes
        ):
            allowed.append(method)
    return ", ".join(allowed)


def _route_matches(request: Request, path: str) -> bool:
    probe: Scope = {
        "type": "http",
        "method": request.method,
        "path": path,
        "root_path": request.scope.get("root_path", ""),
        "headers": [],
        "query_string": b"",
    }
    return any(
        route.matches(probe)[0] is not Match.NONE for route in request.app.router.routes
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    detail = exc.detail if isinstance(exc.detail, str) else None
    code = None
    path = request.url.path
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        # Not UTF-8, or a number Python will not parse (over 4,300 digits).
        detail, code = "Malformed JSON body", "invalid_json"
    elif exc.status_code == 404 and detail == "Not Found":
        detail = f"No route for {request.method} {path}"
        # Routes have no trailing slash and are never redirected to (a 307 would
        # make clients resend bodies and credentials): say which path was meant.
        if (
            path.endswith("/")
            and len(path) > 1
            and _route_matches(request, path.rstrip("/"))
        ):
            detail += f"; routes have no trailing slash: {path.rstrip('/')}"
    elif exc.status_code == 405:
        detail = f"Method {request.method} is not allowed on {request.url.path}"
        # Starlette's Allow names the first matching route's methods only.
        allowed = _allowed_methods(request)
        if allowed:
            headers = {**(headers or {}), "Allow": allowed}
    return problem_response(
        exc.status_code, detail=detail, code=code, instance=path, headers=headers
    )


class ProblemCORSMiddleware(CORSMiddleware):
    """Starlette's CORS middleware, whose refused preflight (`Disallowed CORS origin`)
    is problem+json like every other 4xx instead of text/plain."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower().startswith(("access-control-", "vary"))
        }
        return problem_response(
            response.status_code,
            detail=bytes(response.body).decode(),
            code="cors_preflight_refused",
            headers=headers,
        )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(AppError, _app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)


def is_transient_db_error(exc: BaseException) -> bool:
    """A database that is down, restarting or locked: retry later, not a bug."""
    if isinstance(exc, InterfaceError | OperationalError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    name = type(exc).__name__
    return name in {
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "ConnectionRefusedError",
    } or isinstance(exc, ConnectionError | OSError)


# Request ids: a random per-process prefix and a counter. Unique across processes and
# restarts, and far cheaper than a uuid4 per request.
_REQUEST_ID_PREFIX = uuid.uuid4().hex[:16]
_request_counter = itertools.count(1)
# An incoming X-Request-Id is kept when it is 1 to 128 printable ASCII characters (it
# is echoed in a header and written to logs); anything else gets one of ours.
_INCOMING_REQUEST_ID = re.compile(rb"[\x20-\x7e]{1,128}")
_SESSION_IN_PATH = re.compile(r"/sessions/(session_[0-9a-f]{32})(?:/|\Z)")


def next_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_counter):016x}"


def incoming_request_id(value: bytes) -> bytes | None:
    """The caller's X-Request-Id if it may be kept, else None."""
    return value if _INCOMING_REQUEST_ID.fullmatch(value) else None


def session_in_path(path: str) -> str | None:
    """The session a request's path names (`/v1/sessions/session_<hex>/...`), for logs."""
    match = _SESSION_IN_PATH.search(path)
    return match.group(1) if match else None


class RequestContextMiddleware:
    """Gives every request an id, the caller's X-Request-Id if it is valid (else a new
    one), echoed as X-Request-Id and set, with the session of the path, as the context
    of every log line of the request (uvicorn's access line included); and turns
    escaped exceptions into problem+json: 503 with Retry-After for a database that is
    unavailable, else 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_value: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                header_value = incoming_request_id(value)
                break
        if header_value is None:
            request_id = next_request_id()
            header_value = request_id.encode()
        else:
            request_id = header_value.decode("ascii")
        scope.setdefault("state", {})["request_id"] = request_id
        request_token = logs.REQUEST_ID.set(request_id)
        session_token = logs.SESSION_ID.set(session_in_path(scope["path"]))
        started = False
        header = (b"x-request-id", header_value)

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if started:
                log_failure(request_id, scope, exc)
                raise
            await failure_response(request_id, scope, exc)(scope, receive, send_with_id)
        finally:
            # uvicorn runs each request in a task of its own, whose context ends with
            # it; an in-process caller (tests) runs them all in its own task.
            logs.SESSION_ID.reset(session_token)
            logs.REQUEST_ID.reset(request_token)


def log_failure(request_id: str, scope: Scope, exc: Exception) -> None:
    log.error(
        "request %s %s %s failed",
        request_id,
        scope.get("method"),
        scope.get("path"),
        exc_info=not is_transient_db_error(exc),
        extra={
            "request_id": request_id,
            "session_id": session_in_path(scope.get("path") or ""),
        },
    )


def failure_response(request_id: str, scope: Scope, exc: Exception) -> Response:
    """Answer an exception that escaped a request: an AppError as its problem; else
    log it and answer 503 with Retry-After for a database that is unavailable, or a
    generic 500."""
    if isinstance(exc, AppError):
        return app_error_response(exc, scope.get("path"))
    log_failure(request_id, scope, exc)
    if is_transient_db_error(exc):
        return problem_response(
            503,
            detail="The database is unavailable; retry shortly",
            code="unavailable",
            instance=scope.get("path"),
            retry_after_seconds=2,
        )
    return problem_response(
        500,
        detail="Internal server error",
        code="internal_error",
        instance=scope.get("path"),
    )


# Every route can also answer these: the rate limiter (429), an unexpected failure (500)
# and a database that is unavailable (503, with Retry-After).
ALWAYS_PROBLEMS = (429, 500, 503)
# A POST or PATCH also meets the body guard: too large (413), not JSON (415).
BODY_PROBLEMS = (413, 415)


def drop_framework_422(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI documents `422 HTTPValidationError` (application/json) on every route with
    parameters. This API never sends that shape: bad parameters are 400 and invalid
    bodies 422, both problem+json, as each route's `problem_responses` says."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            content = responses.get("422", {}).get("content", {})
            if PROBLEM_JSON not in content:
                responses.pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    return schema


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for the problem+json errors a route can return, with the
    ones every route can (ALWAYS_PROBLEMS)."""
    return {
        status: {
            "model": ProblemDetails,
            "description": HTTPStatus(status).phrase,
            "content": {
                PROBLEM_JSON: {
                    "schema": {"$ref": "#/components/schemas/ProblemDetails"}
                }
            },
        }
        for status in sorted({*statuses, *ALWAYS_PROBLEMS})
    }
