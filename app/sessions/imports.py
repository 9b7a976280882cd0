"""Import: a session's JSON Lines export (`GET .../export?format=jsonl`) read back into
a new session of the caller's organization. The session line gives the title, tags and
settings; each message line a message with a new id and sequence, copied as a fork
copies (finished, in no turn, pending approvals left out) and keeping its `origin` (the
exported session, message and turn). Event lines are skipped: the new log holds each
message's own event. The whole input is checked before anything is written; the first
line that is not what an export holds is refused with its number."""

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app import wire
from app.db.writes import Write
from app.errors import Unprocessable
from app.journal.render import EXTRA_FIELDS
from app.journal.sessions import lock_session
from app.messages.schemas import Message
from app.sessions import fork, service
from app.sessions.schemas import Session


@dataclass(frozen=True)
class Exported:
    session: Session
    messages: list[Message]


def parse(body: bytes) -> Exported:
    """The export in `body`, or Unprocessable naming the first line that is wrong."""
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise Unprocessable("line 1: empty input; an export starts with its session")
    session: Session | None = None
    messages: list[Message] = []
    for number, line in enumerate(lines, start=1):
        try:
            item = wire.loads(line)
        except ValueError:
            raise Unprocessable(f"line {number}: not JSON") from None
        kind = item.get("type") if isinstance(item, dict) else None
        try:
            if number == 1:
                if kind != "session":
                    raise Unprocessable(f"line 1: expected the session, got {kind!r}")
                session = Session.model_validate(item.get("session"))
            elif kind == "message":
                messages.append(Message.model_validate(item.get("message")))
            elif kind != "event":
                raise Unprocessable(
                    f"line {number}: expected a message or an event, got {kind!r}"
                )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise Unprocessable(
                f"line {number}: {kind} {where}: {first['msg']}"
            ) from None
    assert session is not None
    return Exported(session, messages)


# The session's settings an import keeps (the rest is the new session's own).
SETTINGS = ("model_id", "system_prompt", "tools", "approval_mode", "goal", "locale")


async def import_session(
    db: Write, *, organization_id: uuid.UUID, exported: Exported
) -> Any:
    """A new session holding the exported messages, in their order."""
    source = exported.session
    dumped = source.model_dump(exclude_none=True)
    created = await service.insert_session(
        db,
        organization_id=organization_id,
        title=source.title,
        tags=list(source.tags),
        attributes={k: dumped[k] for k in SETTINGS if k in dumped},
    )
    locked = await lock_session(db, created.id)
    assert locked is not None
    for message in exported.messages:
        raw = message.model_dump(mode="json", exclude_none=True, by_alias=True)
        origin = {"session_id": message.session_id, "message_id": message.id}
        if message.turn_id is not None:
            origin["turn_id"] = message.turn_id
        await fork.append_copy(
            db,
            locked,
            role=message.role,
            visibility=message.visibility,
            content=raw["content"],
            extra={k: raw[k] for k in EXTRA_FIELDS if k in raw and k != "origin"},
            client_message_id=None,
            origin=origin,
        )
    return created
