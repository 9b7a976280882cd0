"""Event wire shapes (upstream's `Event` envelope and `ListResponse<Event>`)."""

from typing import Any

from app.schemas import Schema


class EventContext(Schema):
    turn_id: str | None = None
    input_message_id: str | None = None


class Event(Schema):
    id: str
    type: str
    ts: str
    session_id: str
    sequence: int | None = None
    context: EventContext
    data: dict[str, Any]


class EventList(Schema):
    data: list[Event]
