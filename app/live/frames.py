"""SSE frame encoding, as functions of typed values. The fan-out encodes each frame once
per item and hands the same bytes to every local subscriber."""

import uuid
from datetime import UTC, datetime
from typing import Any

from app import wire
from app.ids import format_id
from app.live.items import MODEL_RETRY, TOOL_INPUT_DELTA, ModelWarning, TextDelta

# What text a delta extends, on the Mutation stream, by its upstream event type.
DELTA_KINDS = {
    "output.message.delta": "text",
    "reason.thinking.delta": "reasoning",
    TOOL_INPUT_DELTA: "tool_input",
}


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def frame(
    event: str,
    data: bytes | str,
    *,
    event_id: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    out = f"event: {event}\n"
    if event_id is not None:
        out += f"id: {event_id}\n"
    if retry_ms is not None:
        out += f"retry: {retry_ms}\n"
    body = data if isinstance(data, bytes) else data.encode()
    return out.encode() + b"data: " + body + b"\n\n"


def retry(retry_ms: int) -> bytes:
    """A block with only `retry:`: it sets an EventSource's reconnection time and
    dispatches no event (no `data:`). The Mutation stream opens with it, so a browser
    that loses the connection before any other frame still reconnects in `retry_ms`,
    not in its default 3 s."""
    return f"retry: {retry_ms}\n\n".encode()


def connected(retry_ms: int) -> bytes:
    # `retry:` here too: a stream that is quiet until it cycles sends no other frame
    # that carries one.
    return frame("connected", b'{"status":"connected"}', retry_ms=retry_ms)


def disconnecting(reason: str, retry_ms: int) -> bytes:
    """The last frame of a stream the server closes. Its `retry:` line is what a browser
    acts on (an EventSource reconnects after the last reconnection time it was given,
    and ignores the JSON); `retry_ms` repeats it for clients that read the data."""
    return frame(
        "disconnecting",
        wire.dumps({"reason": reason, "retry_ms": retry_ms}),
        retry_ms=retry_ms,
    )


def durable_event(
    event_id: uuid.UUID | str, event_type: str, body: str | bytes, retry_ms: int
) -> bytes:
    """Upstream stream: a durable event carries `id:` (its event id)."""
    if isinstance(event_id, uuid.UUID):
        event_id = format_id("event", event_id)
    return frame(event_type, body, event_id=event_id, retry_ms=retry_ms)


def delta_event(delta: TextDelta, accumulated: str, retry_ms: int) -> bytes:
    """Upstream stream: ephemeral deltas, no `id:` (they cannot be replayed)."""
    data: dict[str, Any] = {
        "turn_id": delta.turn_id,
        "delta": delta.text,
        "accumulated": accumulated,
    }
    if delta.event_type in ("output.message.delta", TOOL_INPUT_DELTA):
        data["message_id"] = format_id("message", delta.message_id)
    if delta.tool_call_id is not None:
        data["tool_call_id"] = delta.tool_call_id
    envelope = {
        "id": delta.event_id,
        "type": delta.event_type,
        "ts": delta.ts,
        "session_id": format_id("session", delta.session_id),
        "context": {"turn_id": delta.turn_id} if delta.turn_id else {},
        "data": data,
    }
    return frame(delta.event_type, wire.dumps(envelope), retry_ms=retry_ms)


# ---- the Mutation stream ------------------------------------------------------------
# Every Mutation's data starts with `mutation_id` (the same change always has the same
# one, so a client drops a frame it already applied), `session_id` and `created_at`.

# `turn` Mutations, from the durable events that change a turn's status.
TURN_STATUS = {
    "turn.started": "running",
    "turn.completed": "completed",
    "turn.failed": "failed",
    "turn.cancelled": "cancelled",
}
# `session` Mutations: the session field each event changes, and its value (None: the
# value is the event data's field of that name).
SESSION_CHANGES: dict[str, tuple[str, str | None]] = {
    "session.started": ("status", "started"),
    "session.activated": ("status", "active"),
    "session.idled": ("status", "idle"),
    "session.title.updated": ("title", None),
    "session.model.changed": ("model_id", None),
    # A client-side tool call: the session waits for its result (and its last result
    # is followed by `session.activated`).
    "tool.call_requested": ("status", "waitingfortoolresults"),
}
EVENT_MUTATIONS = frozenset(TURN_STATUS) | frozenset(SESSION_CHANGES)


def _head(mutation_id: str, session_id: uuid.UUID, created_at: str) -> bytes:
    return (
        b'{"mutation_id":"'
        + mutation_id.encode()
        + b'","session_id":"'
        + format_id("session", session_id).encode()
        + b'","created_at":"'
        + created_at.encode()
        + b'"'
    )


def message_mutation(
    changed_sequence: int,
    snapshot: str | bytes,
    *,
    session_id: uuid.UUID,
    message_id: uuid.UUID,
    revision: int,
    updated_at: datetime,
) -> bytes:
    """A committed snapshot, spliced in as stored; `id:` is its checkpoint's sequence
    (the stream's cursor)."""
    body = snapshot.encode() if isinstance(snapshot, str) else snapshot
    mutation_id = f"{format_id('message', message_id)}/{revision}"
    head = _head(mutation_id, session_id, wire.event_ts(updated_at))
    return frame(
        "message", head + b',"message":' + body + b"}", event_id=str(changed_sequence)
    )


def part_mutation(
    session_id: uuid.UUID, message_id: uuid.UUID, revision: int, part: dict[str, Any]
) -> bytes:
    message = format_id("message", message_id)
    body = {
        "mutation_id": f"{message}/{revision}/{part['part_id']}",
        "session_id": format_id("session", session_id),
        "created_at": wire.event_ts(datetime.now(UTC)),
        "message_id": message,
        "revision": revision,
        "part": part,
    }
    return frame("part", wire.dumps(body))


def delta_mutation(delta: TextDelta, offset: int, text: str) -> bytes:
    message = format_id("message", delta.message_id)
    body = {
        "mutation_id": f"{message}/{delta.revision}/{delta.part_id}/{offset}",
        "session_id": format_id("session", delta.session_id),
        "created_at": delta.ts,
        "message_id": message,
        "revision": delta.revision,
        "part_id": delta.part_id,
        "kind": DELTA_KINDS.get(delta.event_type, "text"),
        "offset": offset,
        "text": text,
    }
    if delta.tool_call_id is not None:
        body["tool_call_id"] = delta.tool_call_id
    return frame("delta", wire.dumps(body))


def event_mutation(
    session_id: uuid.UUID, event_type: str, body: str | bytes
) -> bytes | None:
    """The `turn` or `session` Mutation of a durable event, or None for the events
    that change neither. No `id:`: the cursor stays with message checkpoints, and a
    replay that sends one again is dropped by its `mutation_id`."""
    if event_type not in EVENT_MUTATIONS:
        return None
    event = wire.loads(body)
    data = event.get("data") or {}
    status = TURN_STATUS.get(event_type)
    if status is not None:
        turn_id = data.get("turn_id") or event.get("context", {}).get("turn_id")
        head = _head(f"{turn_id}/{status}", session_id, event["ts"])
        return frame(
            "turn", head + b"," + wire.dumps({"turn_id": turn_id, "status": status})[1:]
        )
    field, value = SESSION_CHANGES[event_type]
    change = {field: data.get(field) if value is None else value}
    head = _head(event["id"], session_id, event["ts"])
    return frame("session", head + b"," + wire.dumps(change)[1:])


def warning_event(warning: ModelWarning, retry_ms: int) -> bytes:
    """Upstream stream: a live event (no `id:`) announcing a model request retry."""
    data: dict[str, Any] = {"turn_id": warning.turn_id, **warning.data}
    if warning.message_id is not None:
        data["message_id"] = format_id("message", warning.message_id)
    envelope = {
        "id": warning.event_id,
        "type": MODEL_RETRY,
        "ts": warning.ts,
        "session_id": format_id("session", warning.session_id),
        "context": {"turn_id": warning.turn_id} if warning.turn_id else {},
        "data": data,
    }
    return frame(MODEL_RETRY, wire.dumps(envelope), retry_ms=retry_ms)


def warning_mutation(warning: ModelWarning) -> bytes:
    """Mutation stream: `warning`, the seed's retry notice."""
    body: dict[str, Any] = {
        "mutation_id": warning.event_id,
        "session_id": format_id("session", warning.session_id),
        "created_at": warning.ts,
        "kind": "model_retry",
        "turn_id": warning.turn_id,
        **warning.data,
    }
    if warning.message_id is not None:
        body["message_id"] = format_id("message", warning.message_id)
    return frame("warning", wire.dumps(body))


def reset(reason: str) -> bytes:
    return frame("reset", wire.dumps({"reason": reason}))
