"""The app in the test's own process, its lifespan running, called over httpx."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from app.main import create_app
from app.settings import Settings


@dataclass
class Running:
    app: Any
    client: httpx.AsyncClient


@asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[Running]:
    """The app with its lifespan running, called in-process over httpx."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test"
        ) as client:
            yield Running(app, client)
