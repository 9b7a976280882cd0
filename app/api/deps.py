"""Annotated dependencies shared by the routers. All are `async def`: a plain `def`
dependency runs in the thread pool, a thread hop per request."""

import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.state import AppState
from app.auth import Caller
from app.catalog.registry import Catalog
from app.db.reads import Reads
from app.db.writes import Write
from app.ids import parse_or_400
from app.metrics import Metrics
from app.settings import Settings


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.app
    return state


# The whole state: only for what the hot path shares with the routes (app/api/
# endpoints.py and app/api/stream_open.py take it, as the hot path holds it); every
# other route takes the parts it uses.
StateDep = Annotated[AppState, Depends(get_state)]


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.app.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_reads(request: Request) -> Reads:
    reads: Reads = request.app.state.app.reads
    return reads


# The plain driver statements of the request path (app/db/reads.py).
ReadsDep = Annotated[Reads, Depends(get_reads)]


async def get_metrics(request: Request) -> Metrics | None:
    metrics: Metrics | None = request.app.state.app.metrics
    return metrics


# None when METRICS_ENABLED is off.
MetricsDep = Annotated[Metrics | None, Depends(get_metrics)]


async def get_catalog(request: Request) -> Catalog:
    catalog: Catalog = request.app.state.app.catalog
    return catalog


CatalogDep = Annotated[Catalog, Depends(get_catalog)]


async def current_caller(
    state: StateDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Caller:
    return await state.keys.resolve(authorization)


CallerDep = Annotated[Caller, Depends(current_caller)]


async def current_org(caller: CallerDep) -> uuid.UUID:
    return caller.organization_id


OrgId = Annotated[uuid.UUID, Depends(current_org)]


async def write_db(state: StateDep) -> AsyncIterator[Write]:
    async with state.database.write() as db:
        yield db


async def read_db(state: StateDep) -> AsyncIterator[AsyncSession]:
    async with state.database.read() as db:
        yield db


# scope="function": the unit of work commits before the response is sent, so a failed
# commit is an error response and no database session outlives the endpoint.
WriteDb = Annotated[Write, Depends(write_db, scope="function")]
ReadDb = Annotated[AsyncSession, Depends(read_db, scope="function")]


async def session_id_path(
    session_id: Annotated[
        str,
        Path(
            description="Session ID (format: session_{32-hex})",
            # Documented, not enforced here: parse_or_400 answers with upstream's texts.
            json_schema_extra={"pattern": "^session_[0-9a-f]{32}$"},
        ),
    ],
    request: Request,
) -> uuid.UUID:
    if session_id == "import" and request.url.path.endswith("/sessions/import"):
        # `POST /sessions/import` is a route of its own, not a session id: another
        # method there is a 405, not the 400 of a malformed id.
        raise StarletteHTTPException(405, headers={"Allow": "POST"})
    return parse_or_400("session", "session", session_id)


SessionId = Annotated[uuid.UUID, Depends(session_id_path)]


async def base_url(settings: SettingsDep, request: Request) -> str:
    """Where this API is reachable, for self_url/Location: configured, else the request's."""
    root = settings.public_url or str(request.base_url)
    root = root.rstrip("/")
    if request.url.path.startswith("/api/"):
        root += "/api"
    return root


BaseUrl = Annotated[str, Depends(base_url)]
