"""Traces, an optional extra: with `pip install evermirror[otel]` and
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, the service
sends OpenTelemetry spans to that collector over OTLP/HTTP (protobuf):

- every request: a server span named by its method and route template as the
  metrics label it (`GET /sessions/{session_id}/messages`; the hot routes of
  app/api/hot.py and FastAPI's alike), the child of the caller's W3C `traceparent` when it sends one. `/health`,
  `/ready` and `/metrics` are not traced (probes and scrapes).
- `checkpoint`: each write unit of work (`Database.write`), its COMMIT included.
- `bus.deliver`: a committed checkpoint handed to the live side (wake-ups of this
  process's streams, kicks of its runner); `bus.publish`: a step's end announced.
- `turn`: a turn run by this process, the child of what started it here (the request
  whose commit kicked the runner); `model.step`: one model step of it, its streaming
  included.

The durable events a checkpoint writes record its span in their `context`:
`trace_id`, `span_id` (the checkpoint's span) and `parent_span_id` (the request's or
the turn's), upstream's fields, in W3C hex.

Off (the default: no endpoint, or the extra not installed), nothing of opentelemetry
is imported and the service runs as without this module: the application is a plain
`Service` and its database a plain `Database` (their traced subclasses exist only when
tracing is on), and what is left is one `tracer is None` test per checkpoint (its
events' context), per turn and per step; none per request and none per frame.

OTEL_SERVICE_NAME defaults to `evermirror` (OTEL_SERVICE_NAME or `service.name` in
OTEL_RESOURCE_ATTRIBUTES win); the SDK's other OTEL_* variables apply as usual
(OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_SCHEDULE_DELAY, OTEL_TRACES_SAMPLER, ...).
"""

import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from starlette.types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer


log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "evermirror"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Requests that are not traced: probes and scrapes.
UNTRACED = frozenset({"/health", "/ready", "/metrics"})
# The ids in a hot route's path, for its route template (FastAPI's are its router's).
PATH_IDS = re.compile(r"(session|message)_[0-9a-f]{32}")

# Set while tracing is on (`enable`), else None: all the service's code looks at.
tracer: "Tracer | None" = None
_provider: "TracerProvider | None" = None
_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()


def configured() -> bool:
    """Whether the environment asks for traces (an endpoint, the SDK not disabled)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name) for name in ENDPOINTS)


def from_environment(version: str) -> bool:
    """Turn tracing on if the environment asks for it and the extra is installed;
    whether it is on. Imports nothing of opentelemetry otherwise."""
    if tracer is not None:
        return True
    if not configured():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the otel extra is not installed "
            "(pip install 'evermirror[otel]'): no traces"
        )
        return False
    enable(OTLPSpanExporter(), version=version)
    return True


def enable(exporter: "SpanExporter", *, version: str, batch: bool = True) -> None:
    """Send spans to `exporter` (batched, or each as it ends without `batch`)."""
    global tracer, _provider
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({"service.version": version})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    _provider = provider
    tracer = provider.get_tracer("evermirror", version)


def flush() -> None:
    """Send the spans that ended so far (the application's shutdown)."""
    if _provider is not None:
        _provider.force_flush()


def disable() -> None:
    """Turn tracing off again, after sending what ended (tests)."""
    global tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    tracer = _provider = None


# ---- hooks: each a test of `tracer` and nothing else while tracing is off --------------


def span(
    name: str,
    attributes: dict[str, Any] | None = None,
    parent: "Context | None" = None,
) -> AbstractContextManager[Any]:
    """A span for the block, current inside it (yields it; None while off)."""
    if tracer is None:
        return _NOTHING
    return tracer.start_as_current_span(name, context=parent, attributes=attributes)


def capture() -> "Context | None":
    """The current trace context, for work that starts later elsewhere; None outside
    any span."""
    if tracer is None:
        return None
    from opentelemetry import context, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    return context.get_current()


def detach() -> None:
    """Start this task's trace context afresh (a task created inside a request whose
    work is not that request's)."""
    if tracer is None:
        return
    from opentelemetry import context

    context.attach(context.Context())


def event_context() -> dict[str, str] | None:
    """The current span as a durable event's `context` fields; None outside any."""
    from opentelemetry import trace

    current = trace.get_current_span()
    found = current.get_span_context()
    if not found.is_valid:
        return None
    fields = {
        "trace_id": trace.format_trace_id(found.trace_id),
        "span_id": trace.format_span_id(found.span_id),
    }
    parent = getattr(current, "parent", None)
    if parent is not None and parent.is_valid:
        fields["parent_span_id"] = trace.format_span_id(parent.span_id)
    return fields


# ---- the traced request, database and bus (built only while tracing is on) -----------

App = Callable[[Scope, Receive, Send], Awaitable[None]]


def route_of(scope: Scope) -> str | None:
    """The route template of a request, as the metrics label it (app/metrics.py):
    within the API, without its `/v1` or `/api/v1` prefix. The one FastAPI's router
    matched, or a hot route's path with its ids as parameters."""
    route = scope.get("route")
    if route is not None:
        path = getattr(route, "path", None)
        return path if isinstance(path, str) else None
    path = scope["path"]
    if PATH_IDS.search(path) is None:
        return None
    path = path.removeprefix("/api").removeprefix("/v1")
    return PATH_IDS.sub(lambda match: "{" + match.group(1) + "_id}", path)


async def serve(app: App, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer an HTTP request with `app` inside a server span."""
    if tracer is None or scope["path"] in UNTRACED:
        await app(scope, receive, send)
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in (b"traceparent", b"tracestate")
    }
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    method = scope["method"]
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
    }
    if scope.get("query_string"):
        attributes["url.query"] = scope["query_string"].decode("latin-1")
    with tracer.start_as_current_span(
        method, context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as request_span:

        async def traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                request_span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    request_span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            await app(scope, receive, traced)
        finally:
            route = route_of(scope)
            if route is not None:
                request_span.set_attribute("http.route", route)
                request_span.update_name(f"{method} {route}")
