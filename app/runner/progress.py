"""Where a running turn is (`TurnProgress`) and the live projection of the step it
streams (`LiveStep`): the runner's state between checkpoints, held in memory only."""

import uuid
from dataclasses import dataclass, field
from typing import Any

from app import wire
from app.db.rows import MessageRow
from app.ids import event_id, format_id
from app.journal import lifecycle
from app.journal.parts import part_id
from app.journal.sessions import add_usage
from app.live.fanout import text_key
from app.live.items import PartStarted, TextDelta as LiveDelta
from app.runner.drivers.base import ToolCall


@dataclass(slots=True)
class TurnProgress:
    """Where a running turn is: its step, its tool calls so far, the newest input its
    step has seen, and its agent message as last committed."""

    session_id: uuid.UUID
    turn_id: uuid.UUID
    started: float
    iteration: int = 0
    tool_count: int = 0
    consumed: int = 0
    message: MessageRow | None = None
    # The results of the previous step's tool calls, for the next step.
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    # Token usage of each committed step, by step number (set again, never added, so a
    # retried checkpoint counts once).
    step_usage: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The session's token usage as the step's context read it: the turn's runner is
    # its only writer while the turn runs (its checkpoints are fenced), so a step's
    # checkpoint writes the new total without reading it again.
    session_usage: dict[str, Any] | None = None

    @property
    def usage(self) -> dict[str, Any] | None:
        total: dict[str, Any] | None = None
        for usage in self.step_usage.values():
            total = add_usage(total, usage)
        return total


@dataclass
class LiveStep:
    """The projection of one model Step of a streaming message."""

    session_id: uuid.UUID
    message_id: uuid.UUID
    turn_id: uuid.UUID
    revision: int
    first_sequence: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    phase: str | None = None
    # The UTF-16 length of each live part's text (the offset of its next delta), kept
    # per delta: measuring the whole text on every delta would be quadratic.
    units: dict[str, int] = field(default_factory=dict)
    # What deltas streamed into each part since its text was last joined (`joined`):
    # appending to the part's string itself would copy the whole text every delta.
    pending: dict[str, list[str]] = field(default_factory=dict)
    # The step's token usage, as the model reported it.
    usage: dict[str, Any] = field(default_factory=dict)
    # Tool calls whose arguments were not valid JSON: committed failed, never run. The
    # turn goes on, so the model sees why.
    failed_calls: list[ToolCall] = field(default_factory=list)
    # The turn's wire id, which every delta carries.
    turn_ref: str = ""

    def __post_init__(self) -> None:
        self.turn_ref = format_id("turn", self.turn_id)

    def new_part(self, part: dict[str, Any]) -> dict[str, Any]:
        sequence = self.first_sequence + len(self.parts)
        part = {
            "part_id": part_id("agent", part["type"], sequence),
            "sequence": sequence,
            **part,
        }
        self.parts.append(part)
        return part

    def extend(self, part: dict[str, Any], text: str) -> None:
        """Stream `text` into the part (its text, or a tool call's input)."""
        pending = self.pending.get(part["part_id"])
        if pending is None:
            self.pending[part["part_id"]] = [text]
        else:
            pending.append(text)

    def joined(self) -> None:
        """Bring every part's text up to date with what was streamed into it."""
        for part in self.parts:
            pending = self.pending.pop(part["part_id"], None)
            if pending:
                key = text_key(part)
                part[key] = part.get(key, "") + "".join(pending)

    def part_started(self, part: dict[str, Any]) -> PartStarted:
        self.joined()
        return PartStarted(
            self.session_id,
            self.message_id,
            self.revision,
            self.turn_ref,
            dict(part),
        )

    def delta(
        self,
        part_id: str,
        offset: int,
        text: str,
        event_type: str,
        tool_call_id: str | None = None,
    ) -> LiveDelta:
        return LiveDelta(
            self.session_id,
            self.message_id,
            self.revision,
            self.turn_ref,
            part_id,
            offset,
            text,
            event_type,
            event_id(),
            wire.event_now(),
            tool_call_id,
        )

    def restart(self) -> None:
        """The model request is tried again: what it streamed is void. The same part
        ids start over (their `part` frames replace what clients hold)."""
        self.parts = []
        self.units = {}
        self.pending = {}
        self.phase = None
        self.usage = {}
        self.failed_calls = []

    def settled(self) -> list[dict[str, Any]]:
        """The step's parts as they stand, in their committed form: reasoning text in
        upstream's structure, a tool call's streamed input replaced by its arguments,
        and tool calls that never got to run (the step was cut off) failed."""
        self.joined()
        parts = []
        for live in self.parts:
            part = dict(live)
            if part["type"] == "reasoning" and isinstance(part.get("text"), str):
                part["text"] = {"kind": "plain", "text": part["text"]}
            elif part["type"] == "tool_call":
                part.pop("input_text", None)
                if lifecycle.current(part.get("status")) in (
                    lifecycle.INPUT_STREAMING,
                    lifecycle.READY,
                ):
                    part["status"] = lifecycle.FAILED
                    part.setdefault("error", "The turn ended before this tool ran")
                    part.setdefault("arguments", {})
            parts.append(part)
        return parts
