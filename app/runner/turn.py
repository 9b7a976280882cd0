"""One turn, run as a loop of named steps: resume what another runner left, then for
each model step read the context, open the agent message, stream the step, commit it,
and run its tools, until a step answers (or the turn waits for the client, or reaches
its step cap). However it stops, it ends in one checkpoint that says why."""

import asyncio
import logging
import time
import uuid
from typing import Any

from app.db.rows import MessageRow
from app.ids import format_id
from app.journal.events import EventSpec
from app.live.items import StepEnded
from app.runner import outcomes, queries
from app.runner.drivers.base import ModelError, ToolCall, Turn
from app.runner.fence import LeaseLost, TurnCancelled, WriteUnit
from app.runner.history import Context
from app.runner.progress import LiveStep, TurnProgress
from app.runner.queries import ActiveTurn
from app.runner.runtime import Runtime
from app.runner.streaming import stream_step
from app.runner.tools import client_request_write, run_approved, run_tool
from app.telemetry import logs, traces
from app.tools.schemas import is_client_side, needs_approval

log = logging.getLogger("app.runner")


async def run_turn(rt: Runtime, session_id: uuid.UUID, active: ActiveTurn) -> str:
    """Step the model until a step answers without tool calls and no input arrived
    that it did not see, or until `max_iterations` steps. The runner holds the
    streaming message between checkpoints: it is its only writer while the turn
    runs (each checkpoint is fenced, see `Fence.checkpoint`, and the message update
    checks the revision). Returns how it ended: completed, waiting, cancelled,
    failed, or (when it stopped here unfinished) interrupted or taken over."""
    turn_id = active.turn_id
    assert turn_id is not None
    logs.TURN_ID.set(format_id("turn", turn_id))
    watch = rt.watches[session_id] = asyncio.Event()
    turn = TurnProgress(session_id, turn_id, time.monotonic())
    run = TurnRun(rt, turn, watch, active.session)
    try:
        run.outcome = await run.steps(active.max_iterations, active.resumed)
    except TurnCancelled:
        run.outcome = "cancelled"
        await run.end(*outcomes.cancelled(run.turn))
    except ModelError as exc:
        run.outcome = "failed"
        await run.end(*outcomes.failed(run.turn, "model_error", str(exc), str(exc)))
    except (asyncio.CancelledError, LeaseLost) as exc:
        # Shutting down: leave the turn for start-up recovery (or another node).
        # Or the turn is not this process's any more: write nothing.
        if isinstance(exc, LeaseLost):
            run.outcome = "taken over"
        raise
    except Exception as exc:
        run.outcome = "failed"
        log.exception("turn %s failed", turn_id)
        await run.end(
            *outcomes.failed(
                run.turn,
                "internal_error",
                "The turn failed unexpectedly",
                type(exc).__name__,
            )
        )
    finally:
        run.close()
    return run.outcome


class TurnRun:
    """The steps of one turn on this process."""

    # The step streaming now, or last streamed.
    step: LiveStep

    def __init__(
        self,
        rt: Runtime,
        turn: TurnProgress,
        watch: asyncio.Event,
        session: queries.SessionPart | None = None,
    ) -> None:
        self.rt = rt
        self.turn = turn
        self.watch = watch
        # The session's part as read with the turn, until the first step uses it.
        self.session = session
        # How the turn ended here, for its log line (left to recovery unless set).
        self.outcome = "interrupted"

    async def steps(self, max_iterations: int, resumed: bool) -> str:
        turn = self.turn
        if resumed:
            await self.resume()
        if turn.message is not None and turn.iteration >= max_iterations:
            # Resumed at the step cap (client results arrived for its last step, or
            # its runner stopped between the cap's tools and its close). Input its
            # steps saw is answered; newer input gets a turn of its own.
            turn.consumed = await self.rt.fence.retrying(self.seen_input)
            await self.checkpoint(outcomes.cap_write(turn))
            return "completed"
        while True:
            turn.iteration += 1
            last = turn.iteration >= max_iterations
            context = await self.rt.fence.retrying(self.context)
            turn.consumed = context.consumed
            turn.session_usage = context.usage
            if context.cancelled:
                raise TurnCancelled
            if turn.message is None:
                turn.message = await self.rt.fence.checkpoint(
                    turn.session_id,
                    turn.turn_id,
                    outcomes.open_write(turn, context.model or context.driver.name),
                )
            tool_calls = await self.stream(context)
            if await self.commit_step(tool_calls, last):
                return "completed"
            if await self.run_tools(tool_calls):
                return "waiting"
            if last:
                # The cap came with tool calls: their results are stored, and no
                # further step runs.
                await self.checkpoint(outcomes.cap_write(turn))
                return "completed"

    async def context(self) -> Context:
        # The first step starts from the session as the turn was read with it.
        session, self.session = self.session, None
        return await self.rt.history.context(self.turn.session_id, session)

    async def seen_input(self) -> int:
        return await queries.seen_input(
            self.rt.database, self.turn.session_id, self.turn.turn_id
        )

    async def checkpoint(self, write: WriteUnit) -> MessageRow | None:
        turn = self.turn
        return await self.rt.fence.checkpoint(
            turn.session_id, turn.turn_id, write, turn=turn
        )

    async def resume(self) -> None:
        """A turn another runner left unfinished (it drained, or lost its lease) goes
        on in the agent message it opened: the steps it committed stay, and the step it
        was streaming is run again from that message's last revision (its live parts
        were never committed; the same part ids start again from the beginning)."""
        turn = self.turn

        async def read() -> MessageRow | None:
            return await queries.open_message(
                self.rt.database, turn.session_id, turn.turn_id
            )

        message = await self.rt.fence.retrying(read)
        if message is None:
            return
        turn.message = message
        steps = [p["step_id"] for p in message.content if "step_id" in p]
        turn.iteration = len(set(steps))
        turn.tool_count = sum(p["type"] == "tool_call" for p in message.content)
        # What the last committed step's tools returned (client results, or built-in
        # tools run before a hand-over), as the next step would have seen it.
        last_step = steps[-1] if steps else None
        turn.tool_results = [
            {
                "tool_call_id": p["tool_call_id"],
                "result": p.get("result"),
                "error": p.get("error"),
            }
            for p in message.content
            if p["type"] == "tool_result" and p.get("step_id") == last_step
        ]
        log.info("turn resumed after step %d", turn.iteration)

    async def stream(self, context: Context) -> list[ToolCall]:
        """Stream the next model step into a live projection of the agent message."""
        turn = self.turn
        assert turn.message is not None
        self.step = step = LiveStep(
            turn.session_id,
            turn.message.id,
            turn.turn_id,
            turn.message.revision,
            len(turn.message.content) + 1,
        )
        self.rt.live[step.message_id] = step
        request = Turn(
            context.messages,
            turn.iteration,
            turn.tool_results,
            context.model_input,
            context.tools,
            context.model,
        )
        with traces.span(
            "model.step",
            {"gen_ai.system": context.driver.name, "evermirror.step": turn.iteration},
        ) as step_span:
            tool_calls = await stream_step(
                self.rt, turn, step, request, self.watch, context.driver
            )
            if step_span is not None:
                step_span.set_attribute("evermirror.step.tool_calls", len(tool_calls))
        return tool_calls

    async def commit_step(self, tool_calls: list[ToolCall], last: bool) -> bool:
        """The finished step's checkpoint; True when it answered the turn."""
        turn, step = self.turn, self.step
        turn.message = await self.checkpoint(
            outcomes.step_write(turn, step, tool_calls, last)
        )
        assert turn.message is not None
        self.rt.live.pop(step.message_id, None)
        with traces.span("bus.publish", {"evermirror.bus.item": "step_ended"}):
            self.rt.bus.publish(StepEnded(turn.session_id, step.message_id))
        return turn.message.state == "done"

    async def run_tools(self, tool_calls: list[ToolCall]) -> bool:
        """Run the step's tools (built-in ones here, approved first where the session
        asks); True when client-side ones made the turn wait for their results."""
        turn = self.turn
        turn.tool_results = []
        if not tool_calls:
            # The step answered, and input it did not see asks for another.
            return False

        async def read() -> tuple[list[dict[str, Any]], bool]:
            return await queries.session_tools(self.rt.database, turn.session_id)

        tools, ask = await self.rt.fence.retrying(read)
        client_calls: list[ToolCall] = []
        for call in tool_calls:
            turn.tool_count += 1
            if is_client_side(tools, call.name):
                client_calls.append(call)
            elif ask and needs_approval(tools, call.name):
                turn.tool_results.append(
                    await run_approved(self.rt, turn, call, self.watch)
                )
            else:
                turn.tool_results.append(await run_tool(self.rt, turn, call))
        if not client_calls:
            return False
        # The wait is durable: this runner lets the session go, and the results
        # (posted to any process) kick a runner to go on.
        turn.message = await self.checkpoint(
            client_request_write(turn, [c.id for c in client_calls])
        )
        return True

    async def end(self, error: tuple[str, str], outcome: EventSpec) -> None:
        turn = self.turn
        await outcomes.end_with_error(
            self.rt,
            turn.session_id,
            turn.turn_id,
            turn.message.id if turn.message else None,
            error,
            outcome,
        )

    def close(self) -> None:
        turn = self.turn
        if self.rt.watches.get(turn.session_id) is self.watch:
            del self.rt.watches[turn.session_id]
        if turn.message is not None:
            self.rt.live.pop(turn.message.id, None)
        log.info(
            "turn %s after %d step(s) in %.0f ms",
            self.outcome,
            turn.iteration,
            (time.monotonic() - turn.started) * 1000,
        )
