"""Upstream's event type registry (crates/core/src/events/mod.rs, VALID_EVENT_TYPES)."""

from collections.abc import Sequence

from app.errors import InvalidParameter

# Never persisted: no sequence, no SSE `id:`; they travel on the bus only.
EPHEMERAL_TYPES = frozenset(
    {
        "output.message.delta",
        "reason.thinking.delta",
        "tool.output.delta",
        "voice.input_transcript.delta",
        "voice.output_transcript.delta",
    }
)

VALID_EVENT_TYPES = frozenset(
    {
        "input.message",
        "output.message.started",
        "output.message.delta",
        "output.message.completed",
        "output.message.replaced",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "turn.sealed",
        "turn.cancelled",
        "reason.started",
        "reason.completed",
        "reason.recovered",
        "act.started",
        "act.completed",
        "tool.started",
        "tool.completed",
        "tool.progress",
        "tool.output.delta",
        "tool.call_requested",
        "tool.call_repaired",
        "transcript.repaired",
        "llm.generation",
        "reason.thinking.started",
        "reason.thinking.delta",
        "reason.thinking.completed",
        "reason.item",
        "session.started",
        "session.activated",
        "session.idled",
        "session.title.updated",
        "session.model.changed",
        "schedule.triggered",
        "context.compacting",
        "context.compacted",
        "context.compaction.skipped",
        "context.compaction.failed",
        "budget.warning",
        "budget.paused",
        "budget.exhausted",
        "budget.resumed",
        "voice.session.started",
        "voice.session.ended",
        "voice.session.failed",
        "voice.input_transcript.delta",
        "voice.input_transcript.completed",
        "voice.output_transcript.delta",
        "voice.output_transcript.completed",
        "file.written",
        "capability.usage",
        "task.created",
        "task.updated",
        "task.message.sent",
        "task.message.received",
        "tool.hosted_call",
        "sandbox.instance_lost",
        "sandbox.recovered",
    }
)

MAX_TYPE_FILTERS = 64


def validate_types(
    name: str, values: Sequence[str] | None, also: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """Upstream's filter rules: known type names only (upstream's, and `also`), at
    most 64 values."""
    if not values:
        return ()
    if len(values) > MAX_TYPE_FILTERS:
        raise InvalidParameter(f"{name}: too many values (max {MAX_TYPE_FILTERS})")
    for value in values:
        if value not in VALID_EVENT_TYPES and value not in also:
            raise InvalidParameter(f"{name}: unknown event type '{value}'")
    return tuple(values)
