"""AG-UI 1.0 (the Agent-User Interaction protocol) over the session log.

A client (`@ag-ui/client`'s HttpAgent, CopilotKit) POSTs a `RunAgentInput` and reads
Server-Sent Events, one AG-UI event per `data:` line: `RUN_STARTED`, the run's text,
reasoning and tool-call events, then `RUN_FINISHED` (its `outcome` a success, an
`interrupt` waiting for approvals, or `cancelled`) or `RUN_ERROR`. A thread is a
session; a run is what one request streams of the session's turn: the turn it starts,
or the rest of the turn its answers let go on. The events encode the turn's projection
(app/frontends/projection.py), so a run is read from the durable log.
"""

from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from pydantic import Field

from app import wire
from app.frontends.answers import Answers
from app.frontends.projection import (
    ApprovalAsked,
    Begin,
    Denied,
    End,
    PartDelta,
    PartEnd,
    PartStart,
    Step,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    TurnProjection,
    part_text,
    project,
)
from app.messages.schemas import MessageCreate
from app.schemas import InputSchema

# Thread ids: a session id, or an id of the frontend's own (a UUID, the SDK's default).
THREAD_ID_PATTERN = r"^[A-Za-z0-9_.:~-]{1,200}$"
KEEPALIVE_COMMENT = b": ping\n\n"
# What an approval interrupt's answer (`resume[].payload`) holds.
APPROVAL_RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string"},
    },
}
# The newest messages a MESSAGES_SNAPSHOT holds; older ones are paged through
# `GET /v1/sessions/{id}/messages?before_sequence=`.
SNAPSHOT_MESSAGES = 100


class AgUiTool(InputSchema):
    name: str = Field(min_length=1, max_length=64)
    description: str = Field(default="", max_length=8000)
    parameters: dict[str, Any] | None = None


class ResumeEntry(InputSchema):
    interruptId: str = Field(min_length=1, max_length=200)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class RunAgentInput(InputSchema):
    """What a client sends to run the agent; `state`, `context` and `forwardedProps`
    are accepted and not used (the session holds the conversation's state)."""

    threadId: str = Field(pattern=THREAD_ID_PATTERN)
    runId: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[AgUiTool] = Field(default_factory=list)
    resume: list[ResumeEntry] | None = None


class UnsupportedContent(ValueError):
    """A user message's content this service does not store."""


def user_message(run: RunAgentInput) -> MessageCreate | None:
    """The last message, if it is the user's: stored with its id as its
    `client_message_id`, so a message the thread already holds is not stored twice.
    None when the last message is not the user's."""
    if not run.messages or run.messages[-1].get("role") != "user":
        return None
    last = run.messages[-1]
    content = last.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = (
                    part.get("type") if isinstance(part, dict) else type(part).__name__
                )
                raise UnsupportedContent(str(kind))
            parts.append({"type": "text", "text": part.get("text")})
    else:
        raise UnsupportedContent(type(content).__name__)
    return MessageCreate.model_validate(
        {
            "message": {"role": "user", "content": parts},
            "client_message_id": last.get("id"),
        }
    )


def answers(run: RunAgentInput) -> Answers:
    """The run's answers: `resume[]` entries decide approvals (`resolved` approves
    unless its payload says `approved: false`; `cancelled` denies), and the tool
    messages after the last assistant message are the results of frontend tools."""
    approvals: list[tuple[str, bool, str | None]] = []
    for entry in run.resume or ():
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        reason = payload.get("reason")
        approved = entry.status == "resolved" and payload.get("approved") is not False
        approvals.append(
            (
                entry.interruptId,
                approved,
                reason if isinstance(reason, str) else None,
            )
        )
    outputs: list[tuple[str, Any, str | None]] = []
    for message in reversed(run.messages):
        if message.get("role") != "tool":
            break
        call_id = message.get("toolCallId")
        if not isinstance(call_id, str):
            continue
        error = message.get("error")
        if isinstance(error, str):
            outputs.append((call_id, None, error))
        else:
            outputs.append((call_id, _output(message.get("content")), None))
    outputs.reverse()
    return Answers(approvals, outputs)


def _output(content: Any) -> Any:
    """A tool message's content as the tool's result: JSON when it parses as JSON."""
    if isinstance(content, str):
        try:
            return wire.loads(content)
        except ValueError:
            return content
    return content


def client_tools(run: RunAgentInput) -> list[dict[str, Any]]:
    """The frontend's tools as this service's client-side tool definitions."""
    return [
        {
            "type": "client_side",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        }
        for tool in run.tools
    ]


# ---- the events -------------------------------------------------------------------------


def event(value: dict[str, Any]) -> bytes:
    return b"data: " + wire.dumps(value) + b"\n\n"


class RunEvents:
    """A run's projected steps as AG-UI events."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.run = {"threadId": thread_id, "runId": run_id}

    def started(self) -> dict[str, Any]:
        return {"type": "RUN_STARTED", **self.run}

    def finished(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {"type": "RUN_FINISHED", **self.run, "outcome": outcome}

    def encode(self, step: Step) -> Iterator[dict[str, Any]]:
        if isinstance(step, PartDelta):
            if step.text:
                kind = "TEXT" if step.kind == "text" else "REASONING"
                yield {
                    "type": f"{kind}_MESSAGE_CONTENT",
                    "messageId": step.key,
                    "delta": step.text,
                }
        elif isinstance(step, PartStart):
            if step.kind == "text":
                yield {
                    "type": "TEXT_MESSAGE_START",
                    "messageId": step.key,
                    "role": "assistant",
                }
            else:
                yield {"type": "REASONING_START", "messageId": step.key}
                yield {
                    "type": "REASONING_MESSAGE_START",
                    "messageId": step.key,
                    "role": "reasoning",
                }
        elif isinstance(step, PartEnd):
            if step.kind == "text":
                yield {"type": "TEXT_MESSAGE_END", "messageId": step.key}
            else:
                yield {"type": "REASONING_MESSAGE_END", "messageId": step.key}
                yield {"type": "REASONING_END", "messageId": step.key}
        elif isinstance(step, StepStart | StepEnd):
            kind = "STEP_STARTED" if isinstance(step, StepStart) else "STEP_FINISHED"
            yield {"type": kind, "stepName": f"step-{step.index}"}
        elif isinstance(step, ToolCall):
            yield {
                "type": "TOOL_CALL_START",
                "toolCallId": step.call_id,
                "toolCallName": step.name,
                "parentMessageId": step.parent,
            }
            yield {
                "type": "TOOL_CALL_ARGS",
                "toolCallId": step.call_id,
                "delta": wire.dumps(step.arguments).decode(),
            }
            yield {"type": "TOOL_CALL_END", "toolCallId": step.call_id}
        elif isinstance(step, ToolResult):
            yield {
                "type": "TOOL_CALL_RESULT",
                "messageId": step.key,
                "toolCallId": step.call_id,
                "content": step.error if step.error is not None else _text(step.output),
                "role": "tool",
            }
        elif isinstance(step, Denied):
            yield {
                "type": "TOOL_CALL_RESULT",
                "messageId": f"{step.call_id}/denied",
                "toolCallId": step.call_id,
                "content": "denied",
                "role": "tool",
            }
        elif isinstance(step, End):
            yield self._end(step)
        # Begin and ApprovalAsked: the run has begun already; approvals are its
        # interrupt outcome.

    def _end(self, end: End) -> dict[str, Any]:
        if end.status == "failed":
            return {
                "type": "RUN_ERROR",
                "message": end.error or "the turn failed",
                "code": end.error_code or "turn_failed",
            }
        if end.status == "cancelled":
            return self.finished({"type": "cancelled"})
        if end.approvals:
            return self.finished(
                {
                    "type": "interrupt",
                    "interrupts": [_interrupt(a) for a in end.approvals],
                }
            )
        outcome: dict[str, Any] = {"type": "success"}
        if end.client_calls:
            outcome["pendingToolCallIds"] = list(end.client_calls)
        return self.finished(outcome)


def _interrupt(asked: ApprovalAsked) -> dict[str, Any]:
    interrupt: dict[str, Any] = {
        "id": asked.interaction_id,
        "reason": "tool_approval",
        "toolCallId": asked.call_id,
        "responseSchema": APPROVAL_RESPONSE_SCHEMA,
    }
    if asked.prompt:
        interrupt["message"] = asked.prompt
    return interrupt


def _text(value: Any) -> str:
    return value if isinstance(value, str) else wire.dumps(value).decode()


async def run_events(
    frames: AsyncIterator[bytes] | None,
    turn: TurnProjection | None,
    events: RunEvents,
    snapshot: list[dict[str, Any]] | None = None,
) -> AsyncIterator[bytes]:
    """The run: `RUN_STARTED`, the thread's history when asked for (`snapshot`), the
    turn's events, and its end. Without a turn the run finishes at once. A stream the
    server closes before the turn's end (the session deleted, a key revoked, a client
    too slow) ends with `RUN_ERROR` `stream_closed`: the client runs again, without new
    input, to reconnect."""
    yield event(events.started())
    if snapshot is not None:
        yield event({"type": "MESSAGES_SNAPSHOT", "messages": snapshot})
    if frames is None or turn is None:
        yield event(events.finished({"type": "success"}))
        return
    async for batch in project(frames, turn):
        if not isinstance(batch, list):
            yield KEEPALIVE_COMMENT
            continue
        out = bytearray()
        for step in batch:
            if isinstance(step, Begin):
                continue
            for one in events.encode(step):
                out += event(one)
        if out:
            yield bytes(out)
    if not turn.done:
        yield event(
            {
                "type": "RUN_ERROR",
                "message": "the stream was closed before the run ended; run again "
                "without new messages to reconnect",
                "code": "stream_closed",
            }
        )


# ---- the thread's history ---------------------------------------------------------------


def history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored message snapshots (oldest first) as AG-UI messages: a user message under
    the id its frontend gave it; an agent message as its parts, each under the id its
    streamed events used (`{message id}/{part id}`), tool calls on the assistant
    message they follow, results as tool messages."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "user":
            text = "".join(
                p.get("text", "") for p in message["content"] if p.get("type") == "text"
            )
            out.append(
                {
                    "id": message.get("client_message_id") or message["id"],
                    "role": "user",
                    "content": text,
                }
            )
            continue
        assistant: dict[str, Any] | None = None
        for part in message.get("content", ()):
            key = f"{message['id']}/{part.get('part_id')}"
            kind = part.get("type")
            if kind == "text":
                assistant = {"id": key, "role": "assistant", "content": part["text"]}
                out.append(assistant)
            elif kind == "reasoning":
                thought = part_text(part)
                if thought:
                    out.append({"id": key, "role": "reasoning", "content": thought})
            elif kind == "tool_call":
                if assistant is None:
                    assistant = {"id": key, "role": "assistant"}
                    out.append(assistant)
                assistant.setdefault("toolCalls", []).append(
                    {
                        "id": part["id"],
                        "type": "function",
                        "function": {
                            "name": part["name"],
                            "arguments": wire.dumps(part.get("arguments")).decode(),
                        },
                    }
                )
            elif kind == "tool_result":
                tool = {
                    "id": key,
                    "role": "tool",
                    "toolCallId": part["tool_call_id"],
                    "content": _text(part.get("result")),
                }
                if part.get("error") is not None:
                    tool["error"] = str(part["error"])
                out.append(tool)
                assistant = None
    return out


CAPABILITIES: dict[str, dict[str, Any]] = {
    "identity": {
        "name": "evermirror",
        "type": "session-service",
        "description": "The Everruns session API's agent, its threads kept as sessions",
    },
    "transport": {"streaming": True, "resumable": True},
    "tools": {"supported": True, "clientProvided": True, "parallelCalls": True},
    "reasoning": {"supported": True, "streaming": True},
    "humanInTheLoop": {"supported": True, "approvals": True, "interrupts": True},
    "state": {},
    "multimodal": {"input": {"image": False}},
}
