"""What travels on the bus, as typed values. The PostgreSQL bus is the only place that
knows their encoding (`app.live.bus`); everything else works with these classes."""

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Wakeup:
    """Checkpoints of the session committed up to `sequence`: read them from the
    database. Sent inside the committing transaction (PostgreSQL) or after it."""

    session_id: uuid.UUID
    sequence: int


@dataclass(frozen=True, slots=True)
class Deleted:
    """The session was deleted: drop what is held of it, end its streams."""

    session_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class KeysChanged:
    """An API key was created or revoked: re-check the keys this process trusts, and end
    the streams of revoked ones. Sent with the change's COMMIT (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class PartStarted:
    """A part began in the live projection of a streaming message (carries its text so
    far), extending the committed `revision`."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    revision: int
    turn_id: str | None
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text appended to a live part at `offset`. `event_type` and `event_id` are its
    identity on upstream's stream, where it is an ephemeral event."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    revision: int
    turn_id: str | None
    part_id: str
    offset: int
    text: str
    event_type: str
    event_id: str
    ts: str


@dataclass(frozen=True, slots=True)
class StepEnded:
    """The live projection of a message is over (its step committed or was discarded)."""

    session_id: uuid.UUID
    message_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Kick:
    """This process committed a new turn for the session: run it."""

    session_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class RepublishParts:
    """A process joined a message's live projection mid-stream: its runner republishes
    the parts so far."""

    message_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Resync:
    """This process may have missed items (the listener reconnected): re-read from the
    database."""


BusItem = (
    Wakeup
    | Deleted
    | KeysChanged
    | PartStarted
    | TextDelta
    | StepEnded
    | Kick
    | RepublishParts
    | Resync
)
LiveItem = PartStarted | TextDelta | StepEnded
