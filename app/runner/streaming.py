"""A step's streaming: the driver's model events become the step's live parts, each
published to the bus as it grows, while a watch on the session stops the step at once
on a cancel or moves it onto a new revision when an Action joins the message."""

import asyncio
import contextlib
from typing import Any

from app import wire
from app.db.types import utcnow
from app.ids import format_id, uuid7
from app.journal import lifecycle
from app.live.items import TOOL_INPUT_DELTA, ModelWarning, StepEnded
from app.runner import queries
from app.runner.drivers.base import (
    Annotations,
    Driver,
    ModelEvent,
    ReasoningDelta,
    Retrying,
    StepFinish,
    TextDelta,
    ToolCall,
    ToolCallStarted,
    ToolInputDelta,
    Turn,
)
from app.runner.fence import Fence, TurnCancelled
from app.runner.progress import LiveStep, TurnProgress
from app.runner.runtime import Runtime


async def stream_step(
    rt: Runtime,
    progress: TurnProgress,
    step: LiveStep,
    turn: Turn,
    watch: asyncio.Event,
    driver: Driver,
) -> list[ToolCall]:
    """Stream one model step into the live projection; returns the tool calls to
    run. A cancel request stops it at once, however long the model takes to send
    its next chunk: the driver's stream is closed (and with it the provider's
    response) and TurnCancelled raised."""
    consumer = StepConsumer(rt.fence, step, driver.name)
    streaming = asyncio.create_task(consumer.consume(driver, turn))
    watching = asyncio.create_task(watch_step(rt, progress, step, watch))
    try:
        await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
        if streaming.done():
            return streaming.result()
        # A cancel was requested (or reading whether one was failed: raised here,
        # as the step's own failure would be).
        watching.result()
        streaming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await streaming
        raise TurnCancelled
    finally:
        for task in (streaming, watching):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def watch_step(
    rt: Runtime, turn: TurnProgress, step: LiveStep, watch: asyncio.Event
) -> None:
    """Return once a cancel of the session's turn was requested; each wake-up of
    the session is a moment to check. The same read tells whether an Action
    joined the streaming message: then the step goes on from its new revision."""

    async def read() -> tuple[bool, int | None]:
        # The step's end cancels this watch, mostly while a read is in flight: the read
        # is left to finish and free its connection, for cancelling it would cost the
        # database a cancel request (a connection of its own) or abandon a pool
        # connection half opened, so that the pool never grew past one connection.
        reading = asyncio.ensure_future(
            rt.reads.turn_watch(step.session_id, step.message_id)
        )
        reading.add_done_callback(_retrieve)
        return await asyncio.shield(reading)

    while True:
        await watch.wait()
        watch.clear()
        cancelled, revision = await rt.fence.retrying(read)
        if cancelled:
            return
        if revision is not None and revision > step.revision:
            await rebase(rt, turn, step)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a shielded read's failure as seen: its watch is gone, and the failure of
    a read nobody waits for is not worth a warning."""
    if not task.cancelled():
        task.exception()


async def rebase(rt: Runtime, turn: TurnProgress, step: LiveStep) -> None:
    """An Action was committed to the message while this step streams: the step's
    live parts now extend the new revision and follow the Action's parts (their
    part ids stay; their sequences move on). Clients dropped the old projection
    with the new snapshot; they get the parts again, text so far included."""

    async def read() -> Any:
        return await queries.read_message(rt.database, step.message_id)

    stored = await rt.fence.retrying(read)
    if stored.revision <= step.revision:
        return
    turn.message = stored
    step.revision = stored.revision
    step.first_sequence = len(stored.content) + 1
    for offset, part in enumerate(step.parts):
        part["sequence"] = step.first_sequence + offset
    await republish(rt, step)


async def republish(rt: Runtime, step: LiveStep) -> None:
    """Every live part of the step again, as it stands (processes that dropped their
    projection of the message rebuild it from these)."""
    if not rt.fence.leases.holds(step.session_id):
        return
    for part in list(step.parts):
        rt.bus.publish(step.part_started(part))


class StepConsumer:
    """The driver's events of one step, applied to its live parts and published."""

    def __init__(self, fence: Fence, step: LiveStep, provider: str) -> None:
        self.fence = fence
        self.step = step
        self.provider = provider
        self.tool_calls: list[ToolCall] = []
        self.text_part: dict[str, Any] | None = None
        self.reasoning_part: dict[str, Any] | None = None
        self.tool_parts: dict[str, dict[str, Any]] = {}

    async def consume(self, driver: Driver, turn: Turn) -> list[ToolCall]:
        step = self.step
        # Closed at once however this ends (a cancel cancels this task): the driver's
        # `finally` closes its provider stream.
        async with contextlib.aclosing(driver.step(turn)) as events:
            async for event in events:
                await self.apply(event)
        step.joined()
        # The committed form of a reasoning part keeps upstream's shape.
        for part in step.parts:
            if part["type"] == "reasoning":
                part["text"] = {"kind": "plain", "text": part["text"]}
        return self.tool_calls

    async def apply(self, event: ModelEvent) -> None:
        step = self.step
        if isinstance(event, TextDelta):
            if self.text_part is None:
                self.text_part = await self.start({"type": "text", "text": ""})
            await self.delta(self.text_part, event.text, "output.message.delta")
        elif isinstance(event, ReasoningDelta):
            if self.reasoning_part is None:
                self.reasoning_part = await self.start(
                    {"type": "reasoning", "provider": self.provider, "text": ""}
                )
            await self.delta(self.reasoning_part, event.text, "reason.thinking.delta")
        elif isinstance(event, ToolCallStarted):
            # The part exists from the call's first chunk; its input streams.
            self.tool_parts[event.id] = await self.start(
                {
                    "type": "tool_call",
                    "id": event.id,
                    "name": event.name,
                    "arguments": {},
                    "status": lifecycle.INPUT_STREAMING,
                    "input_text": "",
                }
            )
            self.text_part = None
        elif isinstance(event, ToolInputDelta):
            part = self.tool_parts[event.id]
            await self.delta(
                part,
                event.text,
                TOOL_INPUT_DELTA,
                tool_call_id=event.id,
            )
        elif isinstance(event, ToolCall):
            await self.tool_call(event)
        elif isinstance(event, Retrying):
            await self.retrying(event)
        elif isinstance(event, Annotations) and self.text_part is not None:
            self.text_part["annotations"] = event.items
        elif isinstance(event, StepFinish):
            step.phase = event.phase
            step.usage = dict(event.usage)

    async def start(self, part: dict[str, Any]) -> dict[str, Any]:
        """A new live part of the step, announced."""
        part = self.step.new_part(part)
        await self.fence.publish(self.step.session_id, self.step.part_started(part))
        return part

    async def delta(
        self,
        part: dict[str, Any],
        text: str,
        event_type: str,
        *,
        tool_call_id: str | None = None,
    ) -> None:
        step = self.step
        part_id = part["part_id"]
        offset = step.units.get(part_id, 0)
        step.units[part_id] = offset + wire.utf16_len(text)
        step.extend(part, text)
        await self.fence.publish(
            step.session_id,
            step.delta(part_id, offset, text, event_type, tool_call_id),
        )

    async def tool_call(self, event: ToolCall) -> None:
        """A tool call complete: its part (streamed or new) is `ready` to run, or
        `failed` when its arguments were not a JSON object."""
        step = self.step
        complete: dict[str, Any] = {
            "type": "tool_call",
            "id": event.id,
            "name": event.name,
            "arguments": event.arguments,
            "status": lifecycle.READY if event.error is None else lifecycle.FAILED,
        }
        if event.error is not None:
            complete["error"] = event.error
        streamed = self.tool_parts.get(event.id)
        if streamed is None:
            part = step.new_part(complete)
        else:
            part = streamed
            step.pending.pop(part["part_id"], None)
            part.pop("input_text", None)
            part.update(complete)
        await self.fence.publish(step.session_id, step.part_started(part))
        if event.error is None:
            self.tool_calls.append(event)
        else:
            step.failed_calls.append(event)
        self.text_part = None

    async def retrying(self, event: Retrying) -> None:
        """The model request failed and is retried (or not): a live notice; when it is
        retried, what the step streamed so far is void."""
        step = self.step
        await self.fence.publish(step.session_id, warning(step, event))
        if event.will_retry and step.parts:
            # The step starts over; the parts so far are void. Processes drop their
            # projection of them (late joiners get only the new ones); clients
            # holding them get the same part ids again from empty.
            step.restart()
            await self.fence.publish(
                step.session_id, StepEnded(step.session_id, step.message_id)
            )
            self.tool_calls = []
            self.text_part = self.reasoning_part = None
            self.tool_parts = {}


def warning(step: LiveStep, event: Retrying) -> ModelWarning:
    """The live notice of a retry (the driver logged it)."""
    return ModelWarning(
        step.session_id,
        step.message_id,
        format_id("turn", step.turn_id),
        format_id("event", uuid7()),
        wire.event_ts(utcnow()),
        {
            "attempt": event.attempt,
            "max_attempts": event.max_attempts,
            "code": event.code,
            "message": event.message,
            "will_retry": event.will_retry,
            "retry_in_ms": event.delay_ms,
        },
    )
