"""The stream side of the durable log: the frames of what committed in a range of
sequences (read once for every subscriber of a channel, or as this process wrote it),
and the order in which the streams send a checkpoint's events, snapshots and
Mutations."""

import uuid
from typing import Any, TypeVar

from app.db import models
from app.db.reads import Checkpoints
from app.live import frames
from app.live.outputs import EventMutationOut, EventOut, MessageOut, Out


def checkpoint_outs(
    session_id: uuid.UUID,
    read: Checkpoints,
    *,
    after: int,
    upto: int,
    retry_ms: int,
) -> tuple[int, list[Out]]:
    """The frames of what committed in (after, upto], in the order the streams send
    them, and the sequence they reach."""
    last = max(after, read.events[-1].sequence if read.events else upto)
    changes: list[tuple[int, int, Out]] = []
    for event in read.events:
        changes.append(
            (
                event.sequence,
                EVENT,
                EventOut(
                    event.sequence,
                    event.type,
                    frames.durable_event(event.id, event.type, event.body, retry_ms),
                ),
            )
        )
        mutation = frames.event_mutation(session_id, event.type, event.body)
        if mutation is not None:
            changes.append(
                (
                    event.sequence,
                    EVENT_MUTATION,
                    EventMutationOut(event.sequence, mutation),
                )
            )
    changes.extend(
        (
            row.changed_sequence,
            SNAPSHOT,
            MessageOut(
                row.changed_sequence, row.visible, message_frame(session_id, row)
            ),
        )
        for row in read.messages
    )
    return last, checkpoint_order(changes)


# The kinds of durable change, in the order they go out at one sequence.
EVENT, EVENT_MUTATION, SNAPSHOT = 0, 1, 2
T = TypeVar("T")


def checkpoint_order(changes: list[tuple[int, int, T]]) -> list[T]:
    """Durable changes (sequence, kind, value) in the order the streams send them.
    Events go out in sequence. A `message` snapshot carries its checkpoint's last
    sequence, so it follows the checkpoint's events. An event's `turn` or `session`
    Mutation waits for the snapshots of its checkpoint: a client that sees a turn end
    already has the message that ended it. (A checkpoint that changed no message lets
    its Mutations out at the next one's snapshots, or at the end.)"""
    changes.sort(key=lambda change: change[:2])
    out: list[T] = []
    deferred: list[T] = []
    for index, (sequence, kind, value) in enumerate(changes):
        if kind == EVENT_MUTATION:
            deferred.append(value)
            continue
        out.append(value)
        last_at_sequence = (
            index + 1 == len(changes) or changes[index + 1][0] != sequence
        )
        if kind == SNAPSHOT and last_at_sequence:
            out.extend(deferred)
            deferred.clear()
    out.extend(deferred)
    return out


# What a `message` Mutation is made of, as the fan-out and the replays read it.
MUTATION_COLUMNS = (
    models.Message.changed_sequence,
    models.Message.visibility,
    models.Message.snapshot,
    models.Message.id,
    models.Message.revision,
    models.Message.updated_at,
)


def message_frame(session_id: uuid.UUID, row: Any) -> bytes:
    """The `message` Mutation of a row of MUTATION_COLUMNS."""
    return frames.message_mutation(
        row.changed_sequence,
        row.snapshot,
        session_id=session_id,
        message_id=row.id,
        revision=row.revision,
        updated_at=row.updated_at,
    )
