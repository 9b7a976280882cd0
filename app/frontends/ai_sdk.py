"""The Vercel AI SDK's UI message stream (protocol v1) over the session log.

`useChat` with its `DefaultChatTransport` POSTs `{id, messages, trigger, messageId}`
and reads Server-Sent Events whose `data:` is one chunk each (`start`, `start-step`,
`text-start`/`-delta`/`-end`, `reasoning-*`, `tool-input-*`, `tool-output-*`,
`tool-approval-request`, `finish-step`, `finish`, `error`), then `data: [DONE]`. Its
resume is `GET {api}/{id}/stream`, answered 204 when nothing runs, else the running
turn's reply from its start: the SDK replaces its partial message with the replay.

Here the chunks encode a turn's projection (app/frontends/projection.py): one turn is
one UI message (the turn's first agent message names it), each agent message of the
turn one step.
"""

from collections.abc import AsyncIterator
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
    project,
)
from app.messages.schemas import MessageCreate
from app.schemas import InputSchema, Label

HEADERS = [(b"x-vercel-ai-ui-message-stream", b"v1")]
DONE = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": ping\n\n"

# Chat ids: what the SDK's generateId and UUIDs are made of, up to the column's width.
CHAT_ID_PATTERN = r"^[A-Za-z0-9_.:~-]{1,200}$"


class UIMessage(InputSchema):
    """A message as `useChat` holds it; only what a user message needs is read."""

    id: str = Field(min_length=1, max_length=200)
    role: Label
    parts: list[dict[str, Any]] = Field(default_factory=list)


class ChatRequest(InputSchema):
    """The body `DefaultChatTransport` sends; other fields (its `body` option's) are
    ignored."""

    id: str = Field(
        pattern=CHAT_ID_PATTERN,
        description="The chat's id: a session id (`session_...`) of the caller's, or "
        "any id of the frontend's own, which names a session created on first use.",
    )
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None


def user_message(request: ChatRequest) -> MessageCreate | None:
    """The message to store for a `submit-message`: the last UI message, if it is the
    user's (its UI id is the idempotency key, so a message the session already holds
    is not stored twice). None when the last message is not the user's."""
    last = request.messages[-1]
    if last.role != "user":
        return None
    content: list[dict[str, Any]] = []
    for part in last.parts:
        kind = part.get("type")
        if kind == "text":
            content.append({"type": "text", "text": part.get("text")})
        elif kind == "file" and str(part.get("mediaType", "")).startswith("image/"):
            content.append(_image(part))
        elif kind not in ("step-start", "source-url", "source-document"):
            raise UnsupportedPart(str(kind))
    return MessageCreate.model_validate(
        {
            "message": {"role": "user", "content": content},
            "client_message_id": last.id,
        }
    )


def answers(message: UIMessage) -> Answers:
    approvals: list[tuple[str, bool, str | None]] = []
    outputs: list[tuple[str, Any, str | None]] = []
    for part in message.parts:
        kind = str(part.get("type", ""))
        call_id = part.get("toolCallId")
        if not (kind.startswith("tool-") or kind == "dynamic-tool"):
            continue
        if not isinstance(call_id, str):
            continue
        state = part.get("state")
        approval = part.get("approval")
        if (
            state == "approval-responded"
            and isinstance(approval, dict)
            and isinstance(approval.get("id"), str)
        ):
            reason = approval.get("reason")
            approvals.append(
                (
                    approval["id"],
                    approval.get("approved") is True,
                    reason if isinstance(reason, str) else None,
                )
            )
        elif state == "output-available":
            outputs.append((call_id, part.get("output"), None))
        elif state == "output-error":
            outputs.append((call_id, None, str(part.get("errorText") or "failed")))
    return Answers(approvals, outputs)


class UnsupportedPart(ValueError):
    """A user message part this service does not store."""


def _image(part: dict[str, Any]) -> dict[str, Any]:
    url = str(part.get("url", ""))
    media_type = str(part.get("mediaType"))
    if url.startswith("data:") and ";base64," in url:
        return {
            "type": "image",
            "base64": url.split(";base64,", 1)[1],
            "media_type": media_type,
        }
    return {"type": "image", "url": url, "media_type": media_type}


def chunk(value: dict[str, Any]) -> bytes:
    return b"data: " + wire.dumps(value) + b"\n\n"


def encode(step: Step) -> dict[str, Any] | tuple[dict[str, Any], ...] | None:
    """A projected step as the chunk (or chunks) that tell it."""
    if isinstance(step, PartDelta):
        return {"type": f"{step.kind}-delta", "id": step.key, "delta": step.text}
    if isinstance(step, PartStart):
        return {"type": f"{step.kind}-start", "id": step.key}
    if isinstance(step, PartEnd):
        return {"type": f"{step.kind}-end", "id": step.key}
    if isinstance(step, Begin):
        if step.message_id is None:
            return {"type": "start"}
        return {"type": "start", "messageId": step.message_id}
    if isinstance(step, StepStart):
        return {"type": "start-step"}
    if isinstance(step, StepEnd):
        return {"type": "finish-step"}
    if isinstance(step, ToolCall):
        call = {"toolCallId": step.call_id, "toolName": step.name}
        return (
            {"type": "tool-input-start", **call},
            {"type": "tool-input-available", **call, "input": step.arguments},
        )
    if isinstance(step, ToolResult):
        if step.error is not None:
            return {
                "type": "tool-output-error",
                "toolCallId": step.call_id,
                "errorText": step.error,
            }
        return {
            "type": "tool-output-available",
            "toolCallId": step.call_id,
            "output": step.output,
        }
    if isinstance(step, ApprovalAsked):
        return {
            "type": "tool-approval-request",
            "approvalId": step.interaction_id,
            "toolCallId": step.call_id,
        }
    if isinstance(step, Denied):
        return {"type": "tool-output-denied", "toolCallId": step.call_id}
    return _end(step)


def _end(end: End) -> dict[str, Any]:
    if end.status == "waiting":
        return {"type": "finish", "finishReason": "tool-calls"}
    if end.status == "failed":
        text = f"{end.error_code}: {end.error}" if end.error else "the turn failed"
        return {"type": "error", "errorText": text}
    if end.status == "cancelled":
        return {"type": "abort", "reason": "the turn was stopped"}
    return {"type": "finish", "finishReason": "stop"}


async def ui_chunks(
    frames: AsyncIterator[bytes], turn: TurnProjection
) -> AsyncIterator[bytes]:
    """The turn's UI message stream: ends after the turn's end with `[DONE]`. A
    stream the server closes first ends without it: the client resumes through
    `GET /v1/chat/{id}/stream`."""
    async for batch in project(frames, turn):
        if not isinstance(batch, list):
            # Read by no parser; it keeps proxies from closing a quiet stream.
            yield KEEPALIVE_COMMENT
            continue
        out = bytearray()
        for step in batch:
            encoded = encode(step)
            if isinstance(encoded, dict):
                out += chunk(encoded)
            elif encoded is not None:
                for one in encoded:
                    out += chunk(one)
        yield bytes(out)
    if turn.done:
        yield DONE
