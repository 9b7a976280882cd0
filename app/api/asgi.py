"""The ASGI application the server runs: the hot front door, then FastAPI."""

import time
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.datastructures import State
from starlette.types import Message, Receive, Scope, Send

from app.api.hot import HotRoutes
from app.metrics import Metrics, answer as answer_metrics
from app.telemetry import traces


class Service:
    """The ASGI application: a plain wrapper in front of the FastAPI app. Hot requests
    are answered here (app/api/hot.py), everything else by FastAPI, timed for the
    metrics; `GET /metrics` on the main port when it has no port of its own."""

    def __init__(
        self,
        api: FastAPI,
        hot: HotRoutes | None,
        metrics: Metrics | None,
        metrics_here: bool,
    ) -> None:
        self.api = api
        self.hot = hot
        self.metrics = metrics
        self.metrics_here = metrics_here

    # What the server, the CLI and the tests read of the application: FastAPI's.
    @property
    def state(self) -> State:
        return self.api.state

    @property
    def router(self) -> APIRouter:
        return self.api.router

    def openapi(self) -> dict[str, Any]:
        return self.api.openapi()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot
        metrics = self.metrics
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        if hot is not None:
            # Answered on the hot path, or passed on with what FastAPI must read.
            passed = await hot.serve(scope, receive, send)
            if passed is None:
                return
            receive = passed
        if metrics is None:
            await self.api(scope, receive, send)
            return
        if scope["path"] == "/metrics" and self.metrics_here:
            await answer_metrics(metrics, scope, receive, send)
            return
        # The hot routes time themselves; FastAPI's are timed to their response start,
        # labelled with the route template the router matched.
        start = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                metrics.request(
                    getattr(route, "path", "unmatched"),
                    scope["method"],
                    message["status"],
                    time.perf_counter() - start,
                )
            await send(message)

        await self.api(scope, receive, timed)


class TracedService(Service):
    """The application while tracing is on (app/telemetry/traces.py): every HTTP request is
    answered inside its span. A plain `Service` otherwise, so untraced requests pay
    nothing for it."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        await traces.serve(super().__call__, scope, receive, send)
