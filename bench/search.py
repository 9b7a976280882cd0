"""The search row: `GET /v1/search` over a corpus of `SEARCH_MESSAGES` messages (100,000;
2,000 in the smoke run), side by side with the same statement run by SQLAlchemy in this
process against the same database, which is the index's own cost: the ratio is what
HTTP, the key check and the snippets add.

The corpus is written straight into the service's database (its sessions and messages,
done and visible, with `search_text` set, so each database's index is built as the
checkpoint builds it): 100 messages per session, each 40 words drawn from a vocabulary
of 5,000 with Zipf weights, so one query word is rare, one common and one everywhere."""

import random
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.backend import Backend
from app.db import models
from app.db.search import hits, words as query_words
from bench.rows import Database, Line, ratio
from bench.servers import Proc

PER_SESSION = 100
WORDS_PER_MESSAGE = 40
VOCABULARY = [f"v{n}" for n in range(5000)]
# Zipf weights: v0 is in nearly every message, v50 in a few percent, v4000 in few.
WEIGHTS = [1 / (n + 1) for n in range(len(VOCABULARY))]
QUERIES = {
    "rare word": "v4000",
    "common word": "v50",
    "two words, phrase ranked": "v1 v2",
}
REQUESTS = 40


def corpus_size(db: Database) -> int:
    return 2000 if db.profile.smoke else 100_000


def _engine(db: Database) -> AsyncEngine:
    if db.pg_dsn is not None:
        url = db.pg_dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
        return create_async_engine(url)
    assert db.sqlite_path is not None
    return create_async_engine(f"sqlite+aiosqlite:///{db.sqlite_path}")


async def _seed(engine: AsyncEngine, organization_id: uuid.UUID, total: int) -> None:
    rng = random.Random(7)
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        for first in range(0, total, PER_SESSION):
            sid = uuid.uuid4()
            await conn.execute(
                insert(models.Session).values(
                    id=sid,
                    organization_id=organization_id,
                    title=f"corpus {first // PER_SESSION}",
                    status="idle",
                    tags=[],
                    attributes={},
                    last_sequence=PER_SESSION,
                    visible_message_count=PER_SESSION,
                    internal_message_count=0,
                    created_at=now,
                    updated_at=now,
                    last_activity_at=now,
                )
            )
            rows = []
            for n in range(1, min(PER_SESSION, total - first) + 1):
                body = " ".join(rng.choices(VOCABULARY, WEIGHTS, k=WORDS_PER_MESSAGE))
                content = [{"type": "text", "text": body, "id": "p0"}]
                rows.append(
                    {
                        "id": uuid.uuid4(),
                        "session_id": sid,
                        "sequence": n,
                        "role": "user" if n % 2 else "agent",
                        "state": "done",
                        "visibility": "visible",
                        "revision": 1,
                        "content": content,
                        "extra": {},
                        "snapshot": orjson.dumps({"content": content}).decode(),
                        "changed_sequence": n,
                        "created_at": now,
                        "updated_at": now,
                        "search_text": body,
                    }
                )
            await conn.execute(insert(models.Message), rows)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def row_search(db: Database, server: Proc) -> list[Line]:
    total = corpus_size(db)
    backend = Backend.POSTGRESQL if db.is_postgres else Backend.SQLITE
    engine = _engine(db)
    lines: list[Line] = []
    try:
        async with httpx.AsyncClient(
            base_url=server.url, headers=db.auth, timeout=30
        ) as client:
            created = await client.post("/v1/sessions", json={"title": "search"})
            sid = uuid.UUID(hex=created.json()["id"].removeprefix("session_"))
            async with engine.connect() as conn:
                organization_id = (
                    await conn.execute(
                        select(models.Session.organization_id).where(
                            models.Session.id == sid
                        )
                    )
                ).scalar_one()
            started = time.monotonic()
            await _seed(engine, organization_id, total)
            seeded = time.monotonic() - started
            # The planner's statistics of the grown tables, as autovacuum (PostgreSQL)
            # would gather them soon after such a load: stale ones can join sessions
            # to the index once per session instead of once.
            async with engine.begin() as conn:
                await conn.execute(text("ANALYZE"))
            db.notes.append(
                f"search: {total:,} messages written and indexed in {seeded:.1f} s"
                f" ({total / seeded:,.0f}/s, straight into the database), then ANALYZE"
            )
            details: dict[str, Any] = {"messages": total, "seed_seconds": seeded}
            for label, q in QUERIES.items():
                service, raw, found = await _measure(
                    client, engine, backend, organization_id, q
                )
                details[label] = {
                    "query": q,
                    "hits_on_first_page": found,
                    "service_ms": service,
                    "query_ms": raw,
                }
                p50, p99 = statistics.median(service), _percentile(service, 0.99)
                raw50 = statistics.median(raw)
                lines.append(
                    Line(
                        "search",
                        f"{label} ({q!r}) at {total:,} messages, p50 ms vs the query"
                        f" alone (p99 {p99:.1f} ms)",
                        p50,
                        raw50,
                        ratio(p50, raw50),
                        "—",
                        None,
                        "ms",
                    )
                )
            db.details["search"] = details
    finally:
        await engine.dispose()
    return lines


async def _measure(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    backend: Backend,
    organization_id: uuid.UUID,
    q: str,
) -> tuple[list[float], list[float], int]:
    """Milliseconds per request and per query alone, alternated, REQUESTS of each."""
    service: list[float] = []
    raw: list[float] = []
    found = 0
    statement = hits(
        backend, query_words(q), organization_id=organization_id, limit=21, offset=0
    )
    for _ in range(REQUESTS):
        started = time.perf_counter()
        response = await client.get("/v1/search", params={"q": q, "limit": 20})
        service.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"search answered {response.status_code}")
        found = len(response.json()["data"])
        started = time.perf_counter()
        async with engine.connect() as conn:
            (await conn.execute(statement)).all()
        raw.append((time.perf_counter() - started) * 1000)
    return service, raw, found
