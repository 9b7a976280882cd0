"""Request guards: body size and content type, rate limits, and the size and shape limits
of message and session inputs. Each refusal is problem+json and happens before any write."""

import ipaddress
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth import Caller, KeyResolver, credential_hash
from app.errors import Unauthorized, Unprocessable, problem_response
from app.settings import Settings

BODY_METHODS = {b"POST", b"PUT", b"PATCH", "POST", "PUT", "PATCH"}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the application, starting with a body already read."""
    replayed = False

    async def replayed_receive() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed_receive


# The one route whose body is JSON Lines (a session's export), and its media types.
IMPORT_PATHS = frozenset({"/v1/sessions/import", "/api/v1/sessions/import"})
JSONL_TYPES = frozenset({"application/jsonl", "application/x-ndjson"})


def is_jsonl(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() in JSONL_TYPES


class BodyGuardMiddleware:
    """413 for bodies over `max_body_bytes` (declared or streamed), 415 for a body that is
    not JSON. Runs before routing, so nothing downstream ever sees such a request. An
    import takes JSON Lines instead, up to `max_import_bytes`."""

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, max_import_bytes: int
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_import_bytes = max_import_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        importing = path in IMPORT_PATHS
        limit = self.max_import_bytes if importing else self.max_body_bytes
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._too_large(scope, receive, send, path, limit)
            return
        content_type = _header(scope, b"content-type")
        has_body = (length is not None and length != "0") or _header(
            scope, b"transfer-encoding"
        ) is not None
        accepted = is_jsonl if importing else is_json
        if has_body and (content_type is None or not accepted(content_type)):
            wanted = "application/jsonl" if importing else "application/json"
            response = problem_response(
                415,
                detail=f"This request body must be {wanted} (Content-Type: {wanted})",
                code="unsupported_media_type",
                instance=path,
            )
            await response(scope, receive, send)
            return
        # Read the body here (it is at most max_body_bytes) so a chunked body that grows
        # too large is refused before the application sees any of it.
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > limit:
                await self._too_large(scope, receive, send, path, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _too_large(
        self, scope: Scope, receive: Receive, send: Send, path: str | None, limit: int
    ) -> None:
        response = problem_response(
            413,
            detail=f"Request body larger than {limit} bytes",
            code="payload_too_large",
            instance=path,
        )
        await response(scope, receive, send)


def client_address(scope: Scope) -> str:
    """Who the rate limiter counts a request against when no known key names it: the
    client's address (as uvicorn reports it: the peer, or what a trusted proxy says in
    `X-Forwarded-For`), an IPv6 client by its /64, which one host can rotate through."""
    client = scope.get("client")
    host: str = client[0] if client else "unknown"
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


@dataclass(frozen=True, slots=True)
class Budget:
    rate: float
    burst: float

    @classmethod
    def share(cls, rate: float, burst: int, instances: int) -> "Budget":
        """One process's share of a service-wide budget."""
        return cls(rate / instances, max(1.0, burst / instances))


class RateLimiter:
    """Token buckets, each with its budget:

    * a known key (valid when last checked) has a bucket of its own, by its hash, with
      the full budget (`rate`, `burst`);
    * a request whose credential is not a known key (a fresh, mistyped, bogus or revoked
      key) counts against its client address's bucket for unknown credentials, a small
      budget (`unknown`): each such request may cost a database lookup, and rotating
      bogus keys buys no new buckets;
    * a request without a credential, or any request in open mode (no keys exist),
      counts against its client address's bucket, with the full budget.

    Buckets are per process; the budgets are what one process grants, so they are the
    configured ones divided by the number of processes serving the API (see
    `Settings.instances`). The least recently used bucket is dropped beyond
    MAX_BUCKETS (a dropped bucket is as good as a full one)."""

    MAX_BUCKETS = 100_000

    def __init__(self, budget: Budget, unknown: Budget) -> None:
        self.budget = budget
        self.unknown = unknown
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        # Set once the application has started: which keys are known.
        self.keys: KeyResolver | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "RateLimiter | None":
        if settings.rate_limit_per_second <= 0:
            return None
        n = settings.instances
        return cls(
            Budget.share(settings.rate_limit_per_second, settings.rate_limit_burst, n),
            Budget.share(
                settings.rate_limit_unknown_key_per_second,
                settings.rate_limit_unknown_key_burst,
                n,
            ),
        )

    def _take(self, key: str, budget: Budget) -> float:
        """Take a token; returns 0 when allowed, else seconds until one is available."""
        now = time.monotonic()
        tokens, stamp = self.buckets.pop(key, (budget.burst, now))
        tokens = min(budget.burst, tokens + (now - stamp) * budget.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / budget.rate
        self.buckets[key] = (tokens, now)
        if len(self.buckets) > self.MAX_BUCKETS:
            self.buckets.popitem(last=False)
        return wait

    async def refusal(self, scope: Scope) -> Response | None:
        """Take the request's token; the 429 to answer when there is none. A key not
        known yet is looked up here, under the budget for unknown credentials; a valid
        one then takes its token from its own bucket too, so a key's first request
        counts against it like any other."""
        keys = self.keys
        if keys is None or keys.is_open:
            return self._refusal(scope, "addr:" + client_address(scope), self.budget)
        digest = credential_hash(_header(scope, b"authorization"))
        if digest is None:
            return self._refusal(scope, "addr:" + client_address(scope), self.budget)
        if not keys.is_known(digest):
            refused = self._refusal(
                scope, "unknown:" + client_address(scope), self.unknown
            )
            if refused is not None:
                return refused
            try:
                await keys.resolve_key(digest)
            except (Unauthorized, SQLAlchemyError):
                # The route answers it (401 from the negative cache, or the outage).
                return None
        return self._refusal(scope, "key:" + digest, self.budget)

    def refusal_for(self, scope: Scope, caller: Caller) -> Response | None:
        """`refusal` for a request whose caller is already resolved (the hot path)."""
        if caller.key_hash is None:
            return self._refusal(scope, "addr:" + client_address(scope), self.budget)
        return self._refusal(scope, "key:" + caller.key_hash, self.budget)

    def _refusal(self, scope: Scope, bucket: str, budget: Budget) -> Response | None:
        wait = self._take(bucket, budget)
        if wait <= 0:
            return None
        return problem_response(
            429,
            detail="Too many requests; slow down",
            code="rate_limited",
            instance=scope.get("path"),
            retry_after_seconds=max(1, int(wait + 0.999)),
        )


# Set on the scope of a request the hot path already counted and then passed on.
COUNTED = "evermirror.rate_counted"

# Probes: an orchestrator polling them must never be refused.
UNLIMITED_PATHS = frozenset({"/health", "/ready"})


class RateLimitMiddleware:
    """Applies the RateLimiter to every request but the probes (UNLIMITED_PATHS)."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("path") in UNLIMITED_PATHS
            or scope.get(COUNTED)
        ):
            await self.app(scope, receive, send)
            return
        refusal = await self.limiter.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _depth(value: Any, limit: int, level: int = 1) -> int:
    """How many containers deep `value` nests: a scalar adds no level, so `{}` and
    `{"a": 1}` are both 1. Stops counting past `limit`."""
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return level - 1
    if level > limit:
        return level
    return max((_depth(v, limit, level + 1) for v in children), default=level)


def check_json_field(name: str, value: Any, settings: Settings) -> None:
    """Free-form JSON (metadata, hints) is bounded in depth and encoded size."""
    if value is None:
        return
    if _depth(value, settings.max_json_depth) > settings.max_json_depth:
        raise Unprocessable(
            f"{name}: nested deeper than {settings.max_json_depth} levels"
        )
    # Numbers beyond 64 bits never get here: the validation layer (app.schemas)
    # refuses them, so orjson can encode every value.
    if len(orjson.dumps(value)) > settings.max_json_bytes:
        raise Unprocessable(
            f"{name}: larger than {settings.max_json_bytes} bytes encoded"
        )


def check_message(data: Any, settings: Settings) -> None:
    parts = data.message.content
    if len(parts) > settings.max_message_parts:
        raise Unprocessable(
            f"message.content: at most {settings.max_message_parts} parts"
        )
    for index, part in enumerate(parts):
        # The part's own fields: `getattr` of one its type lacks costs pydantic an
        # AttributeError raised and caught, twice per part on every POST.
        fields = vars(part)
        for field in ("text", "context", "base64"):
            value = fields.get(field)
            if isinstance(value, str) and len(value) > settings.max_text_chars:
                raise Unprocessable(
                    f"message.content.{index}.{field}: longer than {settings.max_text_chars} characters"
                )
    check_json_field("metadata", data.metadata, settings)
    if data.controls is not None:
        check_json_field("controls.hints", data.controls.hints, settings)
    if data.external_actor is not None:
        check_json_field(
            "external_actor.metadata", data.external_actor.metadata, settings
        )


def check_session(data: Any, settings: Settings) -> None:
    """The configurable caps of a session body; strings, numbers and the fixed caps
    are the request model's (app/schemas.py)."""
    check_json_field("metadata", getattr(data, "metadata", None), settings)
    check_json_field("hints", getattr(data, "hints", None), settings)
    for index, tool in enumerate(getattr(data, "tools", None) or ()):
        check_json_field(f"tools.{index}.parameters", tool.parameters, settings)
    for field in ("goal", "system_prompt"):
        value = getattr(data, field, None)
        if isinstance(value, str) and len(value) > settings.max_text_chars:
            raise Unprocessable(
                f"{field}: longer than {settings.max_text_chars} characters"
            )
