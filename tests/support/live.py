"""Live items as a runner publishes them, for tests of the fan-out and the bus."""

import uuid

from app.live.items import TextDelta


def text_delta(
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    offset: int,
    text: str,
    part_id: str = "agent-text:1",
) -> TextDelta:
    """A live text delta of revision 1, as a runner publishes it."""
    return TextDelta(
        session_id,
        message_id,
        1,
        None,
        part_id,
        offset,
        text,
        "output.message.delta",
        f"event_{uuid.uuid4().hex}",
        "2026-01-01T00:00:00.000Z",
    )
