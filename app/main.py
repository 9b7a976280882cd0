"""Application factory and lifespan: database, bus, key resolver and turn runner."""

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel

from app import __doc__ as app_doc
from app.api.ag_ui import router as ag_ui_router
from app.api.agent import card_router, router as agent_router
from app.api.asgi import Service, TracedService
from app.api.branches import router as branches_router
from app.api.catalog import router as catalog_router
from app.api.chat import router as chat_router
from app.api.conditional import IfNoneMatchStarMiddleware
from app.api.docs import install_docs
from app.api.events import router as events_router
from app.api.feedback import router as feedback_router
from app.api.guards import BodyGuardMiddleware, RateLimiter, RateLimitMiddleware
from app.api.hot import HotRoutes
from app.api.interactions import router as interactions_router
from app.api.messages import router as messages_router
from app.api.search import router as search_router
from app.api.sessions import router as sessions_router
from app.api.state import AppState
from app.api.streams import router as live_router
from app.api.tools import router as tools_router
from app.auth import KeyResolver
from app.catalog.registry import Catalog, load_catalog
from app.db import traced as traced_db
from app.db.migrate import upgrade
from app.db.reads import create_reads
from app.db.session import Database
from app.errors import (
    PROBLEM_JSON,
    ProblemCORSMiddleware,
    ProblemDetails,
    RequestContextMiddleware,
    drop_framework_422,
    install_error_handlers,
    problem_response,
)
from app.journal.admission import TurnAdmission
from app.live.buses import create_bus
from app.live.cache import PageCache
from app.live.dispatch import Dispatcher
from app.live.fanout import Fanout
from app.live.limits import StreamLimits
from app.metrics import (
    Metrics,
    serve_port as serve_metrics_port,
)
from app.ops import drain
from app.ops.ready import readiness
from app.runner.runner import TurnRunner
from app.schemas import JSON_VALUE_SCHEMA
from app.sessions import retention
from app.settings import Settings, get_settings
from app.telemetry import logs, traces
from app.web.router import create_router as web_router

log = logging.getLogger("app")
VERSION = "0.1.0"


def api_router() -> APIRouter:
    router = APIRouter()
    # The streams come before messages so `/messages/stream` is not read as a message id.
    for feature in (
        sessions_router,
        branches_router,
        live_router,
        messages_router,
        events_router,
        catalog_router,
        tools_router,
        interactions_router,
        agent_router,
        feedback_router,
        search_router,
        chat_router,
        ag_ui_router,
    ):
        router.include_router(feature)
    return router


def operation_id(route: APIRoute) -> str:
    return route.name


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]


NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {
        "model": ProblemDetails,
        "description": "Not ready: `checks` says which check failed and why",
        "content": {
            PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}
        },
    }
}


def watch(metrics: Metrics, state: AppState) -> None:
    """The series read from the objects that hold them, when a scrape comes."""
    limits, fanout, runner = state.limits, state.fanout, state.runner
    metrics.read(
        GaugeMetricFamily,
        "evermirror_streams_open",
        "Streams open on this process, by kind",
        ("stream",),
        lambda: [((kind,), float(n)) for kind, n in limits.by_kind.items()],
    )
    metrics.read(
        CounterMetricFamily,
        "evermirror_streams_opened",
        "Streams opened on this process, by kind",
        ("stream",),
        lambda: [((kind,), float(n)) for kind, n in limits.opened.items()],
    )
    metrics.read(
        CounterMetricFamily,
        "evermirror_stream_dropped_consumers",
        "Streams ended because their client read too slowly",
        (),
        lambda: [((), float(fanout.dropped))],
    )
    metrics.read(
        GaugeMetricFamily,
        "evermirror_turns_running",
        "Turns running on this process",
        (),
        lambda: [((), float(len(runner.tasks)))],
    )
    metrics.read(
        GaugeMetricFamily,
        "evermirror_draining",
        "1 while this process drains before it stops (SIGTERM), else 0",
        (),
        lambda: [((), float(state.draining))],
    )
    checked_out = getattr(state.database.writer.sync_engine.pool, "checkedout", None)
    if checked_out is not None:
        metrics.read(
            GaugeMetricFamily,
            "evermirror_db_pool_connections_in_use",
            "Connections of the write pool checked out",
            (),
            lambda: [((), float(checked_out()))],
        )


@dataclass
class Parts:
    """What the application is built from before it starts: read at creation, so a bad
    MODELS_FILE stops it before it serves."""

    settings: Settings
    catalog: Catalog
    limiter: RateLimiter | None
    metrics: Metrics | None
    traced: bool
    hot: HotRoutes


def create_app(settings: Settings | None = None) -> Service:
    settings = settings or get_settings()
    metrics = Metrics() if settings.metrics_enabled else None
    # One limiter: the hot path and the middleware count against the same budgets.
    limiter = RateLimiter.from_settings(settings)
    parts = Parts(
        settings=settings,
        catalog=load_catalog(settings),
        limiter=limiter,
        metrics=metrics,
        traced=traces.from_environment(VERSION),
        hot=HotRoutes(
            limiter,
            cors=bool(settings.cors_origins),
            tag_logs=logs.access_logged(),
            metrics=metrics,
        ),
    )
    api = FastAPI(
        title="evermirror",
        version=VERSION,
        description=(app_doc or "").strip(),
        lifespan=functools.partial(lifespan, parts),
        generate_unique_id_function=operation_id,
        # `/v1/sessions/` is a problem+json 404 that names the route without the
        # slash, not a 307: a redirect makes clients resend bodies and credentials.
        redirect_slashes=False,
        # Served from the package's own assets instead (app/api/docs.py).
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(api)
    install_middleware(api, settings, parts.limiter)
    api.include_router(api_router(), prefix="/v1")
    api.include_router(card_router("/v1"))
    # Upstream's base URL (and the official SDK's) ends in /api: same routes, same names.
    api.include_router(api_router(), prefix="/api/v1", include_in_schema=False)
    api.include_router(card_router("/api/v1", include_in_schema=False))
    # The web view (the sessions' view_url) and its static files; not in the schema.
    api.include_router(web_router())
    install_openapi(api)
    install_docs(api)
    install_probes(api)
    return (TracedService if parts.traced else Service)(
        api,
        parts.hot,
        metrics,
        metrics_here=metrics is not None and settings.metrics_port is None,
    )


@asynccontextmanager
async def lifespan(parts: Parts, app: FastAPI) -> AsyncIterator[None]:
    """Start what the application holds for its lifetime, serve, then stop it."""
    state, dispatcher = await start_state(parts)
    app.state.app = state
    limiter, metrics = parts.limiter, parts.metrics
    await state.keys.start()
    if limiter is not None:
        limiter.keys = state.keys
    await state.runner.start()
    metrics_server = None
    if metrics is not None:
        state.database.metrics = state.runner.metrics = dispatcher.metrics = metrics
        state.metrics = metrics
        watch(metrics, state)
        if parts.settings.metrics_port is not None:
            metrics_server = await serve_metrics_port(
                metrics, parts.settings.host, parts.settings.metrics_port
            )
    parts.hot.state = state
    drain.register(state)
    purges = asyncio.create_task(
        retention.run_purges(
            state.database,
            parts.settings,
            None if metrics is None else metrics.sessions_purged.inc_by,
        ),
        name="purges",
    )
    try:
        yield
    finally:
        purges.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await purges
        drain.unregister(state)
        parts.hot.state = None
        if metrics_server is not None:
            metrics_server.close()
        if limiter is not None:
            limiter.keys = None
        await stop_state(state)


async def start_state(parts: Parts) -> tuple[AppState, Dispatcher]:
    """The database (migrated first where it should be), the reads, the page cache, the
    bus and its fan-out, the turn runner and the key resolver, wired to each other."""
    settings = parts.settings
    if settings.should_auto_migrate:
        await asyncio.to_thread(upgrade, settings.direct_url)
    database = (traced_db.database_class() if parts.traced else Database).from_settings(
        settings
    )
    reads = create_reads(settings)
    await reads.start()
    cache = PageCache(settings.page_cache_bytes)
    bus = create_bus(settings.backend, settings.direct_url, settings.bus_url)
    fanout = Fanout(
        reads,
        settings.sse_queue_size,
        retry_ms=settings.sse_retry_ms,
        heartbeat_seconds=settings.sse_heartbeat_seconds,
        send_timeout_seconds=settings.sse_send_timeout_seconds,
    )
    runner = TurnRunner(
        settings=settings,
        database=database,
        reads=reads,
        bus=bus,
        catalog=parts.catalog,
    )
    keys = KeyResolver(
        database,
        ttl_seconds=settings.auth_cache_seconds,
        # PostgreSQL announces key changes on the bus; SQLite's come from another
        # process (the CLI), which has no bus to reach this one.
        poll_seconds=None if settings.backend.shared else settings.keys_poll_seconds,
    )
    dispatcher = Dispatcher(bus, cache, fanout, runner, keys)
    await bus.start()
    fanout.start()
    database.hooks = traced_db.hooks(bus)
    state = AppState(
        settings=settings,
        database=database,
        reads=reads,
        cache=cache,
        keys=keys,
        bus=bus,
        fanout=fanout,
        runner=runner,
        limits=StreamLimits(
            # A session's streams may be spread over every process.
            -(-settings.sse_max_per_session // settings.instances),
            settings.sse_max_per_process,
        ),
        admission=TurnAdmission(
            per_organization=settings.max_running_turns_per_org,
            per_process=settings.max_running_turns_per_process,
            running=lambda: runner.tasks.keys(),
        ),
        catalog=parts.catalog,
    )
    return state, dispatcher


async def stop_state(state: AppState) -> None:
    await state.runner.stop()
    await state.keys.stop()
    await state.fanout.close()
    await state.bus.stop()
    await state.reads.close()
    await state.database.dispose()
    traces.flush()


def install_middleware(
    api: FastAPI, settings: Settings, limiter: RateLimiter | None
) -> None:
    # Added innermost first: request context -> CORS -> rate limit -> body guard ->
    # If-None-Match: * -> routes.
    api.add_middleware(IfNoneMatchStarMiddleware)
    api.add_middleware(
        BodyGuardMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_import_bytes=settings.max_import_bytes,
    )
    if limiter is not None:
        api.add_middleware(RateLimitMiddleware, limiter=limiter)
    if settings.cors_origins:
        api.add_middleware(
            ProblemCORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            # What the API reads: credentials, the org of a bearer token, the body's
            # type, a stream's resume cursor and a conditional page read.
            allow_headers=[
                "Authorization",
                "Content-Type",
                "If-None-Match",
                "Last-Event-ID",
                "X-Org-Id",
            ],
            # Without these a cross-origin page cannot read a page's ETag (to send it
            # back in If-None-Match), a list's count, or how long to back off.
            expose_headers=[
                "ETag",
                "X-Total-Count",
                "Location",
                "X-Request-Id",
                "Retry-After",
            ],
            max_age=600,
        )
    api.add_middleware(RequestContextMiddleware)


def install_openapi(api: FastAPI) -> None:
    """The document without FastAPI's own 422 (the service answers problem+json)."""
    framework_openapi = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = drop_framework_422(framework_openapi())
            schema["components"]["schemas"]["JsonValue"] = JSON_VALUE_SCHEMA
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def install_probes(api: FastAPI) -> None:
    @api.get("/health", tags=["health"])
    async def health(request: Request) -> dict[str, str]:
        """Liveness, and whether this process currently hears the bus (PostgreSQL
        `LISTEN` connection up, or the in-process bus)."""
        bus = request.app.state.app.bus
        return {"status": "ok", "bus": "connected" if bus.healthy else "reconnecting"}

    @api.get("/ready", tags=["health"], response_model=Ready, responses=NOT_READY)
    async def ready(request: Request) -> Ready | Response:
        """Readiness: the database answers, its schema is at this release's migration
        head, and the bus listens. `503` problem+json (`code: not_ready`, with
        `checks`) otherwise. Like `/health`, it needs no API key and is never rate
        limited."""
        state = request.app.state.app
        if state.draining:
            # Shutting down: load balancers stop sending traffic here (app/ops/drain.py).
            return problem_response(
                503,
                detail="shutting down (draining)",
                code="draining",
                extra={"checks": {"draining": "shutting down"}},
            )
        report = await readiness(state)
        if report.ready:
            return Ready(checks=report.checks)
        return problem_response(
            503, detail=report.detail, code="not_ready", extra={"checks": report.checks}
        )
