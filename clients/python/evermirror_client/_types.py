"""The shapes the client returns: the seed's Message and SessionMessagePage, and the
Mutations of the stream."""

from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

# A content part: every one has a stable `part_id` and `sequence`, and a `type`; the
# rest depends on the type (text, reasoning, tool_call, tool_result, error, ...).
Part = dict[str, Any]


class Message(TypedDict):
    """The seed's data-wrapped Message: upstream's fields plus revision, state,
    visibility and turn_id. It is the JSON object the service sent."""

    id: str
    session_id: str
    sequence: int
    role: Literal["user", "agent"]
    content: list[Part]
    revision: int
    state: Literal["streaming", "done"]
    visibility: Literal["visible", "internal"]
    created_at: str
    updated_at: str
    turn_id: NotRequired[str]
    phase: NotRequired[str]
    phase_source: NotRequired[str]
    controls: NotRequired[dict[str, Any]]
    metadata: NotRequired[dict[str, Any]]
    external_actor: NotRequired[dict[str, Any]]
    tags: NotRequired[list[str]]
    # Only on the answer to send(): started, steered, resumed or duplicate.
    delivery: NotRequired[str]


@dataclass(frozen=True)
class SessionMessagePage:
    """The seed's SessionMessagePage, plus `cursor`: the stream position it was read
    at. The optional fields are None where the service left them out."""

    items: list[Message]
    total: int
    has_more: bool
    start_sequence: int | None = None
    end_sequence: int | None = None
    next_before_sequence: int | None = None
    cursor: str | None = None


@dataclass(frozen=True)
class MessageMutation:
    """A committed snapshot; `cursor` is where a reconnect resumes after it."""

    message: Message
    cursor: str | None = None
    type: Literal["message"] = field(default="message", init=False)
    # What every Mutation carries beside its kind's fields (None where a frame
    # left one out).
    mutation_id: str | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class PartMutation:
    """A part began in the live projection of the committed `revision` (with its text
    so far)."""

    message_id: str
    revision: int
    part: Part
    type: Literal["part"] = field(default="part", init=False)
    # What every Mutation carries beside its kind's fields (None where a frame
    # left one out).
    mutation_id: str | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class DeltaMutation:
    """Text appended to a live part at `offset`, counted in UTF-16 code units (see
    `utf16_length`)."""

    message_id: str
    revision: int
    part_id: str
    offset: int
    text: str
    type: Literal["delta"] = field(default="delta", init=False)
    # What the part's text is: `text`, `reasoning` or `tool_input`.
    kind: str = field(default="text", kw_only=True)
    # What every Mutation carries beside its kind's fields (None where a frame
    # left one out).
    mutation_id: str | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class TurnMutation:
    """A turn's status changed: running, completed, failed or cancelled."""

    turn_id: str
    status: str
    mutation_id: str
    type: Literal["turn"] = field(default="turn", init=False)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class SessionMutation:
    """Session fields that changed (`status`, `title`, `model_id`)."""

    changes: dict[str, Any]
    mutation_id: str
    type: Literal["session"] = field(default="session", init=False)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class TurnResult:
    """`send_and_wait`: how the message's turn ended (`completed`, `failed`, or
    `timeout` if it had not ended in time), or `waiting` when it cannot go on without
    the client (`waiting_for`: `tool_results` or `approval`); the posted message as
    stored, the turn's agent messages (so far, holding the calls or approvals it waits
    on), and what went wrong (`{code, message}`) when it failed."""

    status: str
    message: Message
    messages: list[Message]
    error: dict[str, Any] | None = None
    waiting_for: str | None = None


@dataclass(frozen=True)
class ResetMutation:
    """The service cannot continue from the cursor: reload snapshots."""

    reason: str
    type: Literal["reset"] = field(default="reset", init=False)
    # What every Mutation carries beside its kind's fields (None where a frame
    # left one out).
    mutation_id: str | None = field(default=None, kw_only=True)
    session_id: str | None = field(default=None, kw_only=True)
    created_at: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class OtherMutation:
    """A kind this client does not know yet, as the service sent it."""

    type: str
    data: dict[str, Any]


Mutation = (
    MessageMutation
    | PartMutation
    | DeltaMutation
    | TurnMutation
    | SessionMutation
    | ResetMutation
    | OtherMutation
)

# What every Mutation's data starts with, beside what its kind carries.
COMMON_FIELDS = ("mutation_id", "session_id", "created_at")


def mutation_of(event: str, data: Any, event_id: str) -> Mutation | None:
    """The Mutation of one SSE event (`event_id` is the stream's last event ID)."""
    if not isinstance(data, dict):
        return None
    on = {"session_id": data.get("session_id"), "created_at": data.get("created_at")}
    try:
        if event == "message":
            return MessageMutation(
                data["message"],
                event_id or None,
                mutation_id=data.get("mutation_id"),
                **on,
            )
        if event == "part":
            return PartMutation(
                data["message_id"],
                data["revision"],
                data["part"],
                mutation_id=data.get("mutation_id"),
                **on,
            )
        if event == "delta":
            return DeltaMutation(
                data["message_id"],
                data["revision"],
                data["part_id"],
                data["offset"],
                data["text"],
                kind=data.get("kind") or "text",
                mutation_id=data.get("mutation_id"),
                **on,
            )
        if event == "turn":
            return TurnMutation(
                data["turn_id"], data["status"], data["mutation_id"], **on
            )
        if event == "session":
            changes = {k: v for k, v in data.items() if k not in COMMON_FIELDS}
            return SessionMutation(changes, data["mutation_id"], **on)
        if event == "reset":
            return ResetMutation(
                str(data.get("reason", "")), mutation_id=data.get("mutation_id"), **on
            )
    except KeyError:
        pass
    return OtherMutation(event, data)
