"""The checkpoints that move a turn on: its agent message opening, a finished step,
the step cap, the turn's completion, and its end with an error (cancelled, failed).
Each `*_write` returns the unit `Fence.checkpoint` runs under the session's lock; it
works on a copy of the message, which the runner adopts once the checkpoint commits."""

import contextlib
import copy
import time
import uuid

from app import wire
from app.db.rows import LockedSession, MessageRow
from app.db.writes import Write
from app.ids import format_id
from app.journal import checkpoint
from app.journal.events import EventSpec
from app.journal.sessions import record_usage
from app.live.items import StepEnded
from app.runner.drivers.base import ToolCall
from app.runner.fence import TurnCancelled, WriteUnit
from app.runner.progress import LiveStep, TurnProgress
from app.runner.runtime import Runtime


def open_write(turn: TurnProgress, model: str) -> WriteUnit:
    """The turn's agent message opens (`output.message.started`, naming the model
    its first step runs)."""

    async def write(db: Write, session: LockedSession) -> MessageRow | None:
        opened = await checkpoint.open_agent_message(
            db, session, turn_id=turn.turn_id, model=model, iteration=turn.iteration
        )
        return opened.message

    return write


def step_write(
    turn: TurnProgress, step: LiveStep, tool_calls: list[ToolCall], last: bool
) -> WriteUnit:
    """A finished step commits whole. A step without tool calls is the answer
    (closing the message and the turn), unless input arrived that it did not see:
    then the next step of the same message answers that too. At the cap there is
    no next step."""

    async def write(db: Write, session: LockedSession) -> MessageRow | None:
        assert turn.message is not None
        message = copy.copy(turn.message)
        # A call that failed without running (its arguments were not JSON) gets its
        # result now, and the model a next step to see it.
        failed = step.failed_calls
        done = (
            not tool_calls
            and (not failed or last)
            and (last or session.last_input_sequence <= turn.consumed)
        )
        parts = [*step.parts]
        for call in failed:
            parts.append(
                {"type": "tool_result", "tool_call_id": call.id, "error": call.error}
            )
        if step.usage:
            turn.step_usage[turn.iteration] = step.usage
        # The answer's checkpoint ends the turn too: one checkpoint, which a group
        # commit can take (a unit of two would lock the session row).
        ending = await completion(db, session, turn, message) if done else []
        await checkpoint.commit_step(
            db,
            session,
            message,
            step_id=f"step_{turn.iteration}",
            parts=parts,
            phase=step.phase,
            phase_source="provider",
            close=done,
            usage=step.usage or None,
            then=[*(_failed_call(turn, call) for call in failed), *ending],
            finished=done,
        )
        await record_usage(db, session, turn.session_usage, step.usage)
        return message

    return write


def _failed_call(turn: TurnProgress, call: ToolCall) -> EventSpec:
    return EventSpec(
        "tool.completed",
        {
            "tool_call_id": call.id,
            "tool_name": call.name,
            "status": "error",
            "success": False,
            "error": call.error,
        },
        turn_id=turn.turn_id,
    )


def cap_write(turn: TurnProgress) -> WriteUnit:
    """The step cap was reached with tool calls: the message closes, the turn ends."""

    async def write(db: Write, session: LockedSession) -> MessageRow | None:
        assert turn.message is not None
        message = copy.copy(turn.message)
        ending = await completion(db, session, turn, message)
        await checkpoint.close_message(db, session, message, then=ending, finished=True)
        return message

    return write


async def completion(
    db: Write, session: LockedSession, turn: TurnProgress, message: MessageRow
) -> list[EventSpec]:
    """`turn.completed` and `session.idled`, for the checkpoint that closes `message`,
    the answer. Input the last step did not see (only possible at the step cap) is
    not dropped: a new turn starts for it in the same checkpoint."""
    unanswered = None
    if session.last_input_sequence > turn.consumed:
        unanswered = await db.first_input_after(session.id, turn.consumed)
    data = {
        "turn_id": format_id("turn", turn.turn_id),
        "iterations": turn.iteration,
        "status": "completed",
        "final_message_id": format_id("message", message.id),
        "duration_ms": int((time.monotonic() - turn.started) * 1000),
        "tool_call_count": turn.tool_count,
    }
    if turn.usage:
        data["usage"] = turn.usage
    return checkpoint.ending_turn(
        session,
        turn_id=turn.turn_id,
        outcome=EventSpec("turn.completed", data, turn_id=turn.turn_id),
        answer_next=unanswered,
    )


def cancelled(turn: TurnProgress) -> tuple[tuple[str, str], EventSpec]:
    """The error part and the event of a turn the user cancelled."""
    return ("cancelled", "The turn was cancelled by the user"), EventSpec(
        "turn.cancelled",
        {
            "turn_id": format_id("turn", turn.turn_id),
            "reason": "cancelled_by_user",
            # Upstream's "usage before cancellation": the committed steps'.
            **({"usage": turn.usage} if turn.usage else {}),
        },
        turn_id=turn.turn_id,
    )


def failed(
    turn: TurnProgress, code: str, part_text: str, error: str
) -> tuple[tuple[str, str], EventSpec]:
    """The error part and the event of a failed turn (`model_error`, `internal_error`)."""
    return (code, part_text), EventSpec(
        "turn.failed",
        {
            "turn_id": format_id("turn", turn.turn_id),
            "error": error,
            "error_code": code,
        },
        turn_id=turn.turn_id,
    )


async def end_with_error(
    rt: Runtime,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    message_id: uuid.UUID | None,
    error: tuple[str, str],
    outcome: EventSpec,
) -> None:
    """Close the message with an error part and end the turn, in one checkpoint.
    What the unfinished step streamed is kept ahead of the error part, as it stood
    (a cancel or a model failure loses nothing that was shown; a crash still does:
    nothing in memory survives it). The message is read again under the lock:
    what is stored is what the step and the error part follow."""
    step = rt.live.get(message_id) if message_id is not None else None

    async def end(db: Write, session: LockedSession) -> MessageRow | None:
        if message_id is not None:
            message = await checkpoint.get_message_for_update(db, message_id)
            if message.state == "streaming":
                await _close_with_error(db, session, message, step, error)
        await checkpoint.finish_turn(db, session, turn_id=turn_id, outcome=outcome)
        return None

    with contextlib.suppress(TurnCancelled):
        await rt.fence.checkpoint(session_id, turn_id, end, ending=True)
    if message_id is not None:
        rt.bus.publish(StepEnded(session_id, message_id))


async def abandon(
    rt: Runtime, session_id: uuid.UUID, turn_id: uuid.UUID, reason: str
) -> None:
    """The last resort when a turn could not be ended the usual way (its error could
    not be written: something it holds cannot be stored or rendered). Its streaming
    messages close with the parts that can still be encoded and an error part, and
    the turn ends `failed`, so the session takes new messages again instead of
    staying active with no runner. Nothing from this process's memory is used."""
    error = ("internal_error", "The turn failed unexpectedly")

    async def end(db: Write, session: LockedSession) -> MessageRow | None:
        turn = TurnProgress(session_id, turn_id, time.monotonic())
        for message in await checkpoint.streaming_messages(db, session_id):
            if message.turn_id != turn_id:
                continue
            message = copy.copy(message)
            message.content = [p for p in message.content if _encodes(p)]
            await checkpoint.close_message(db, session, message, error=error)
        _, outcome = failed(turn, *error, reason)
        await checkpoint.finish_turn(db, session, turn_id=turn_id, outcome=outcome)
        return None

    with contextlib.suppress(TurnCancelled):
        await rt.fence.checkpoint(session_id, turn_id, end, ending=True)


def _encodes(part: dict[str, object]) -> bool:
    try:
        wire.dumps(part)
    except TypeError:
        return False
    return True


async def _close_with_error(
    db: Write,
    session: LockedSession,
    message: MessageRow,
    step: LiveStep | None,
    error: tuple[str, str],
) -> None:
    # Only if the step is not stored yet (an attempt whose COMMIT went unanswered
    # may have committed it).
    stored = {p["part_id"] for p in message.content}
    partial = (
        step.settled()
        if step is not None
        and not stored.intersection(p["part_id"] for p in step.parts)
        else []
    )
    step_number = 1 + len({p["step_id"] for p in message.content if "step_id" in p})
    await checkpoint.close_message(
        db,
        session,
        message,
        error=error,
        partial=partial,
        step_id=f"step_{step_number}",
    )
