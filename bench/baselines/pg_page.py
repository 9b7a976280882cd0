"""An older page straight from the service's own `messages` table with asyncpg, two
ways: `join` (the stored snapshot texts joined as bytes into the service's envelope, so
the body is byte-identical to the service's) and `pydantic` (the same rows parsed into
pydantic models and re-serialized by FastAPI's response model: the naive route)."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import asyncpg
import orjson
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel

from bench.baselines import arguments, serve

QUERY = (
    "SELECT sequence, snapshot FROM messages "
    "WHERE session_id = $1 AND visibility = 'visible' AND sequence < $2 "
    "ORDER BY sequence DESC LIMIT $3"
)


class Part(BaseModel):
    type: str
    part_id: str
    sequence: int
    text: str | None = None
    step_id: str | None = None


class Message(BaseModel):
    id: str
    session_id: str
    sequence: int
    role: str
    content: list[Part]
    phase: str | None = None
    phase_source: str | None = None
    created_at: datetime
    updated_at: datetime
    revision: int
    state: str
    visibility: str
    turn_id: str | None = None


class Page(BaseModel):
    data: list[Message]
    total: int
    has_more: bool
    start_sequence: int | None = None
    end_sequence: int | None = None
    next_before_sequence: int | None = None
    cursor: str


def create_app(dsn: str, mode: str, total: int, cursor: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The service's pool size (DB_POOL_SIZE).
        app.state.pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
        try:
            yield
        finally:
            await app.state.pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def rows(
        request: Request, session_id: str, before_sequence: int, limit: int
    ) -> tuple[list[Any], bool]:
        found = await request.app.state.pool.fetch(
            QUERY,
            uuid.UUID(hex=session_id.removeprefix("session_")),
            before_sequence,
            limit + 1,
        )
        page = found[:limit]
        page.reverse()
        return page, len(found) > limit

    def tail(page: list[Any], has_more: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"total": total, "has_more": has_more}
        if page:
            out["start_sequence"] = page[0][0]
            out["end_sequence"] = page[-1][0]
            if has_more:
                out["next_before_sequence"] = page[0][0]
        out["cursor"] = cursor
        return out

    if mode == "join":

        @app.get("/v1/sessions/{session_id}/messages")
        async def joined(
            request: Request, session_id: str, before_sequence: int, limit: int = 50
        ) -> Response:
            page, has_more = await rows(request, session_id, before_sequence, limit)
            body = (
                b'{"data":['
                + b",".join(row[1].encode() for row in page)
                + b"],"
                + orjson.dumps(tail(page, has_more))[1:]
            )
            return Response(body, media_type="application/json")

    else:

        @app.get("/v1/sessions/{session_id}/messages")
        async def naive(
            request: Request, session_id: str, before_sequence: int, limit: int = 50
        ) -> Page:
            page, has_more = await rows(request, session_id, before_sequence, limit)
            data = [Message.model_validate(json.loads(row[1])) for row in page]
            return Page(data=data, **tail(page, has_more))

    return app


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--mode", choices=("join", "pydantic"), required=True)
    parser.add_argument("--total", type=int, required=True)
    parser.add_argument("--cursor", required=True)
    args = parser.parse_args()
    serve(create_app(args.dsn, args.mode, args.total, args.cursor), args.port)


if __name__ == "__main__":
    main()
