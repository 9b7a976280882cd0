"""RFC 9457 problem details: the AppError hierarchy and every handler that renders errors."""

import itertools
import logging
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("app.errors")

PROBLEM_JSON = "application/problem+json"
ERROR_TYPE_BASE = "https://docs.everruns.com/errors/"


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, as upstream's `ErrorResponse`."""

    model_config = ConfigDict(extra="allow")

    title: str
    status: int
    detail: str | None = None
    code: str | None = None
    type: str | None = None
    instance: str | None = None
    retry_after_seconds: int | None = None


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


class Unauthorized(AppError):
    status = 401
    code = "unauthorized"


class NotFound(AppError):
    status = 404


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


class SessionNotFound(NotFound):
    code = "session_not_found"
    title = "Not Found"


class MessageNotFound(NotFound):
    code = "message_not_found"
    title = "Not Found"


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
    body: dict[str, Any] = {
        "title": title or HTTPStatus(status).phrase,
        "status": status,
    }
    if detail is not None:
        body["detail"] = detail
    if code is not None:
        body["code"] = code
        body["type"] = ERROR_TYPE_BASE + code
    if instance is not None:
        body["instance"] = instance
    if retry_after_seconds is not None:
        body["retry_after_seconds"] = retry_after_seconds
        headers = {**(headers or {}), "Retry-After": str(retry_after_seconds)}
    if extra:
        body.update(extra)
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_JSON, headers=headers
    )


def _field_errors(errors: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": e.get("msg", ""),
            "type": e.get("type", ""),
        }
        for e in errors
    ]


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
    return problem_response(
        exc.status,
        detail=exc.detail,
        code=exc.code,
        title=exc.title,
        instance=request.url.path,
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


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (GET /sessions and POST /sessions
    are two routes), found by asking the routes to match a probe of each method."""
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


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    detail = exc.detail if isinstance(exc.detail, str) else None
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"No route for {request.method} {request.url.path}"
    elif exc.status_code == 405:
        detail = f"Method {request.method} is not allowed on {request.url.path}"
        # Starlette's Allow names the first matching route's methods only.
        allowed = _allowed_methods(request)
        if allowed:
            headers = {**(headers or {}), "Allow": allowed}
    return problem_response(
        exc.status_code, detail=detail, instance=request.url.path, headers=headers
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


def next_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_counter):016x}"


class RequestContextMiddleware:
    """Gives every request an id (echoed as X-Request-Id) and turns escaped exceptions
    into problem+json: 503 with Retry-After for a database that is unavailable, else 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = next_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        started = False
        header = (b"x-request-id", request_id.encode())

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


def log_failure(request_id: str, scope: Scope, exc: Exception) -> None:
    log.error(
        "request %s %s %s failed",
        request_id,
        scope.get("method"),
        scope.get("path"),
        exc_info=not is_transient_db_error(exc),
    )


def failure_response(request_id: str, scope: Scope, exc: Exception) -> Response:
    """Log an exception that escaped a request and answer it: 503 with Retry-After for
    a database that is unavailable, else a generic 500."""
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
