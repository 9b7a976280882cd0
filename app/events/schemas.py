"""Event wire shapes (upstream's `Event` envelope and `ListResponse<Event>`)."""

from typing import Any

from pydantic import Field

from app.schemas import Schema


class EventContext(Schema):
    turn_id: str | None = None
    input_message_id: str | None = None
    # Present only while the service sends traces (app/telemetry/traces.py): the span of the
    # checkpoint that wrote the event, in W3C hex.
    trace_id: str | None = Field(
        default=None,
        description="Trace of the request or turn that wrote this event (W3C hex, "
        "32 digits); only while the service sends traces.",
    )
    span_id: str | None = Field(
        default=None,
        description="Span of the checkpoint that wrote this event (16 hex digits).",
    )
    parent_span_id: str | None = Field(
        default=None,
        description="That checkpoint's parent span: the request's or the turn's.",
    )


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
    # Beyond upstream, present only when MAX_LIST_BYTES ended the page early.
    has_more: bool | None = Field(
        default=None,
        description="True when the byte cap (MAX_LIST_BYTES) ended this page early; "
        "absent when the page holds every event asked for.",
    )
    next_after_sequence: int | None = Field(
        default=None,
        description="Reading forward (no `limit`): pass as `after_sequence` to continue.",
    )
    next_before_sequence: int | None = Field(
        default=None,
        description="Reading the last N (`limit`): pass as `before_sequence` for the "
        "older events this page left out.",
    )
