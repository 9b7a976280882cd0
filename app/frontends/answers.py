"""A frontend's answers to a waiting turn: the approvals its user decided and the
results of the tools it ran, applied as the native routes apply them
(`POST .../tool-approvals`, `POST .../tool-results`), in the caller's unit of work."""

import uuid
from dataclasses import dataclass
from typing import Any

from app.db.writes import Write
from app.errors import Conflict
from app.frontends.projection import TurnProjection
from app.ids import format_id
from app.interactions import schemas as interaction_schemas, service as interactions
from app.journal import lifecycle
from app.journal.sessions import lock_owned_session
from app.tools import schemas as tool_schemas, service as tools


@dataclass(frozen=True)
class Answers:
    """What a frontend's request answers: approvals the user decided
    (interaction id, approved, reason) and the outputs of the tools the frontend ran
    (call id, output, error), however its protocol says them. Which of them the
    session waits for is the session's to say."""

    approvals: list[tuple[str, bool, str | None]]
    outputs: list[tuple[str, Any, str | None]]


class NothingWaits(Conflict):
    code = "nothing_waits"


@dataclass(frozen=True)
class Applied:
    """Where the turn's stream goes on from: the log's position before the answers,
    the turn, its messages as the frontend already holds them, and the calls whose
    results the frontend gave."""

    cursor: int
    turn_id: uuid.UUID
    held: list[tuple[uuid.UUID, list[dict[str, Any]]]]
    answered_calls: list[str]

    def prime(self, turn: TurnProjection) -> None:
        """Tell `turn` what the frontend holds, so it is not told again."""
        for message_id, content in self.held:
            turn.hold(format_id("message", message_id), content)
        turn.seen.update(f"result:{call_id}" for call_id in self.answered_calls)


async def apply(
    db: Write, *, organization_id: uuid.UUID, session_id: uuid.UUID, answers: Answers
) -> Applied:
    """Decide the pending approvals and store the results of the calls awaiting the
    client that `answers` holds; answers to what no longer waits (sent before) are
    left out. 409 `nothing_waits` when none of them answers anything waiting."""
    session = await lock_owned_session(
        db, organization_id=organization_id, session_id=session_id
    )
    cursor, turn_id = session.last_sequence, session.active_turn_id
    messages = [
        m for m in await db.streaming_messages(session_id) if m.turn_id == turn_id
    ]
    pending_approvals: set[str] = set()
    awaiting_calls: set[str] = set()
    for message in messages:
        for part in message.content:
            if part.get("type") == "interaction" and part.get("status") == "pending":
                pending_approvals.add(str(part.get("interaction_id")))
            elif (
                part.get("type") == "tool_call"
                and lifecycle.current(part.get("status")) == lifecycle.AWAITING_CLIENT
            ):
                awaiting_calls.add(str(part.get("id")))
    decisions = [
        interaction_schemas.ToolDecision(
            interaction_id=approval_id,
            decision="approve" if approved else "deny",
            reason=reason,
        )
        for approval_id, approved, reason in answers.approvals
        if approval_id in pending_approvals
    ]
    results = [
        tool_schemas.ToolResult(tool_call_id=call_id, result=output, error=error)
        for call_id, output, error in answers.outputs
        if call_id in awaiting_calls
    ]
    if turn_id is None or not (decisions or results):
        raise NothingWaits(
            "messages: the last message answers nothing the session waits for "
            "(no pending approval, no tool call awaiting the client)"
        )
    held = [(m.id, list(m.content)) for m in messages]
    if decisions:
        await interactions.resolve_many(
            db,
            organization_id=organization_id,
            session_id=session_id,
            decisions=decisions,
        )
    if results:
        await tools.submit_tool_results(
            db,
            organization_id=organization_id,
            session_id=session_id,
            data=tool_schemas.ToolResultsRequest(tool_results=results),
        )
    return Applied(cursor, turn_id, held, [r.tool_call_id for r in results])
