"""A session as JSON Lines (`GET /v1/sessions/{id}/export?format=jsonl`).

One JSON object per line, each with its `type`: the session first (as `GET
/v1/sessions/{id}` answers it), then every message oldest first, internal ones
included (as the message routes answer them), then every event of the log oldest
first (as `GET .../events` answers them):

    {"type":"session","session":{...}}
    {"type":"message","message":{...}}
    {"type":"event","event":{...}}

The export covers the session up to the sequence it had when the export began: a turn
that runs meanwhile adds nothing to it, and a message it holds is written as stored
when its batch is read. Messages and events are read in batches of EXPORT_BATCH rows,
each on its own short read, and written out as stored, so a long session streams
without holding a connection or its whole history in memory.
"""

import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from app import wire
from app.db.reads import Reads

# Rows per read: large enough that a read's round trip is small beside its rows.
EXPORT_BATCH = 500

_LINES: tuple[tuple[Literal["messages", "events"], bytes], ...] = (
    ("messages", b'{"type":"message","message":'),
    ("events", b'{"type":"event","event":'),
)


async def jsonl(
    reads: Reads, session_id: uuid.UUID, upto: int, session: dict[str, Any]
) -> AsyncIterator[bytes]:
    yield b'{"type":"session","session":' + wire.dumps(session) + b"}\n"
    for table, head in _LINES:
        after = 0
        while True:
            rows = await reads.rows_after(
                table, session_id, after=after, upto=upto, limit=EXPORT_BATCH
            )
            if rows:
                yield b"".join(head + body + b"}\n" for _, body in rows)
            if len(rows) < EXPORT_BATCH:
                break
            after = rows[-1][0]
