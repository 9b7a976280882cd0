"""The least a POST that commits a row costs on the service's uvicorn: a raw ASGI app
that reads `POST .../sessions/{id}/messages`, parses its JSON body and commits its text
in a checkpoint's shape (`bench.baselines.writes`: a counter row of the session updated
under its lock, one row inserted), then answers 201 with a small JSON object.

Writes go out as a group commit, as the service's checkpoints do: the requests that
arrive while a transaction is on its way wait for the next one, which carries all of
them in one statement. One transaction at a time was the fastest of 1, 2 and 8 (on
the `writes` row's 64 writers: 5,700-6,450, 4,800-5,000 and 3,150-3,180 POSTs a
second), as it is for the service.

No authentication, no validation past the JSON, no event log, no live wake-ups, no
turn: what is left of the `writes` row when the service's own work is taken away.

    python -m bench.baselines.http_writes --port P --dsn postgresql://...
"""

import asyncio
import json
from typing import Any

import asyncpg

from bench.baselines import arguments, respond, serve
from bench.baselines.writes import create_tables

# Sessions map onto this many counter rows (the row's 64 writers, one each).
COUNTERS = 64
WRITE = """
WITH bumped AS (
    UPDATE bench_counter AS c SET n = c.n + b.k
    FROM (SELECT id, count(*) AS k FROM unnest($1::integer[]) AS id GROUP BY id) AS b
    WHERE c.id = b.id
    RETURNING c.id
)
INSERT INTO bench_rows (counter_id, n, body)
SELECT id, 0, body FROM unnest($1::integer[], $2::text[]) AS t(id, body)
"""


class GroupCommit:
    """`write` waits for the transaction that carries its row; while one is on its
    way, the next gathers."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.pending: list[tuple[int, str, asyncio.Future[None]]] = []
        self.sender: asyncio.Task[None] | None = None

    async def write(self, counter: int, body: str) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append((counter, body, done))
        if self.sender is None:
            self.sender = asyncio.create_task(self._send())
        await done

    async def _send(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                try:
                    async with self.conn.transaction():
                        await self.conn.execute(
                            WRITE, [c for c, _, _ in batch], [b for _, b, _ in batch]
                        )
                except Exception as exc:
                    for *_, done in batch:
                        done.set_exception(exc)
                else:
                    for *_, done in batch:
                        done.set_result(None)
        finally:
            self.sender = None


class App:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.writes: GroupCommit | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["method"] == "GET":  # /health, which the bench waits for
            await respond(send, 200, b'{"status":"ok"}')
            return
        assert self.writes is not None
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        text = json.loads(body)["message"]["content"][0]["text"]
        counter = hash(scope["path"].split("/")[-2]) % COUNTERS
        try:
            await self.writes.write(counter, text)
        except asyncpg.PostgresError:
            await respond(send, 503, b'{"stored":false}')
            return
        await respond(send, 201, b'{"stored":true}')

    async def lifespan(self, receive: Any, send: Any) -> None:
        await receive()
        conn = await asyncpg.connect(self.dsn)
        await create_tables(conn, COUNTERS)
        self.writes = GroupCommit(conn)
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await conn.close()
        await send({"type": "lifespan.shutdown.complete"})


def main() -> None:
    parser = arguments(__doc__ or "")
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args()
    serve(App(args.dsn), args.port)


if __name__ == "__main__":
    main()
