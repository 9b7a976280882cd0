"""What travels on the bus, as typed values. The PostgreSQL bus is the only place that
knows their encoding (`app.live.bus`); everything else works with these classes."""

import uuid
from dataclasses import dataclass, field
from typing import Any

from app.db.reads import Checkpoints


@dataclass(frozen=True, slots=True)
class Wakeup:
    """Checkpoints of the session committed up to `sequence`: read them from the
    database. Sent inside the committing transaction (PostgreSQL) or after it."""

    session_id: uuid.UUID
    sequence: int
    # Those checkpoints hold nothing a running step reacts to (a cancel request, an
    # Action on its message, a decision): they only added user messages (the next step
    # reads them) or were written by the turn's own runner. Its runner need not look.
    quiet: bool = False
    # The first sequence those checkpoints committed (None: not known, or none new).
    first: int | None = None
    # What they wrote, when they wrote every sequence from `first` on: this process's
    # own commits carry it, and its fan-out need not read it back. Not sent to other
    # processes (they read).
    rows: Checkpoints | None = field(default=None, compare=False, repr=False)


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
    # Set on a tool's streamed input (`event_type` TOOL_INPUT_DELTA): the call it is of.
    tool_call_id: str | None = None


# The live event type of a tool call's streamed arguments on `/sse`. Upstream has no
# such event (its tool calls arrive whole); the Mutation stream's `delta` says
# `kind: "tool_input"`.
TOOL_INPUT_DELTA = "tool.call.input.delta"
# The live event of a model request being retried, on `/sse`; `warning` on the
# Mutation stream.
MODEL_RETRY = "llm.retry"
# This service's live events on `/sse`, which its `types`/`exclude` filters also name.
LIVE_ONLY_TYPES = frozenset({TOOL_INPUT_DELTA, MODEL_RETRY})


@dataclass(frozen=True, slots=True)
class ModelWarning:
    """A model request of a running turn failed and is (or is not) tried again: live
    only, never stored. `data` holds attempt, max_attempts, code, message, will_retry
    and retry_in_ms."""

    session_id: uuid.UUID
    message_id: uuid.UUID | None
    turn_id: str | None
    event_id: str
    ts: str
    data: dict[str, Any]


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
    | ModelWarning
    | StepEnded
    | Kick
    | RepublishParts
    | Resync
)
LiveItem = PartStarted | TextDelta | ModelWarning | StepEnded
