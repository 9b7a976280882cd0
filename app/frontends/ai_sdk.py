"""The Vercel AI SDK's UI message stream (protocol v1) over the session log.

`useChat` with its `DefaultChatTransport` POSTs `{id, messages, trigger, messageId}`
and reads Server-Sent Events whose `data:` is one chunk each (`start`, `start-step`,
`text-start`/`-delta`/`-end`, `reasoning-*`, `tool-input-*`, `tool-output-*`,
`tool-approval-request`, `finish-step`, `finish`, `error`), then `data: [DONE]`. Its
resume is `GET {api}/{id}/stream`, answered 204 when nothing runs, else the running
turn's reply from its start: the SDK replaces its partial message with the replay.

Here the chunks are a projection of the Mutation stream of one turn: its replay from
the turn's first checkpoint gives the committed snapshots, then the live parts and
deltas follow. So a stream resumes from the durable log on any process, and nothing
is kept in memory for it. One turn is one UI message (the turn's first agent message
names it); each agent message of the turn is one step.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from app import wire
from app.messages.schemas import MessageCreate
from app.schemas import InputSchema, Label

HEADERS = [(b"x-vercel-ai-ui-message-stream", b"v1")]
DONE = b"data: [DONE]\n\n"
KEEPALIVE = ":"
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


@dataclass(frozen=True)
class Answers:
    """What the last (assistant) message answers: approvals the user decided
    (`approval-responded`: approval id, approved, reason) and the outputs of the
    tools the frontend ran (`output-available` / `output-error`: call id, output,
    error). Which of them the session waits for is the session's to say."""

    approvals: list[tuple[str, bool, str | None]]
    outputs: list[tuple[str, Any, str | None]]


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


# ---- the Mutation stream, read back -----------------------------------------------------


def parse_frames(data: bytes) -> list[tuple[str, Any]]:
    """The (event, data) of each complete frame in `data` (the Mutation stream writes
    whole frames, several at once when a subscriber catches up); a keep-alive comment
    is KEEPALIVE, and a block with neither (`retry:`) is skipped."""
    out: list[tuple[str, Any]] = []
    for block in data.split(b"\n\n"):
        if block.startswith(b":"):
            out.append((KEEPALIVE, None))
            continue
        event = ""
        body: bytes | None = None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                event = line[7:].decode()
            elif line.startswith(b"data: "):
                body = line[6:]
        if body is not None:
            out.append((event, wire.loads(body)))
    return out


STREAMED_KINDS = {"text": "text", "reasoning": "reasoning"}
OUTCOMES = ("completed", "failed", "cancelled")
# A tool call in one of these waits for the frontend.
WAITING = ("awaiting_approval", "awaiting_client")


class TurnChunks:
    """One turn's Mutations as UI message chunks. Everything is sent once: text by
    what the client has (in UTF-16 units, the unit of the Mutation stream's offsets),
    tool calls, results and approvals by their ids. A message's parts stream one
    after another, so a part's first sight ends the text or reasoning before it; a
    part of another model step (its `step_id`) ends the step. A text or reasoning
    chunk's `id` is `{message id}/{part id}`: part ids are unique within a message."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.started = False
        self.step_open = False
        self.step_id: str | None = None
        self.done = False
        # Text and reasoning parts still open: key -> (kind, UTF-16 units sent).
        self.open: dict[str, tuple[str, int]] = {}
        # Every part seen, and the tool calls, results and approvals sent.
        self.seen: set[str] = set()
        self.error: str | None = None

    def feed(self, event: str, data: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if event == "message":
            self._message(data["message"], out)
        elif event == "part":
            self._begin(data["message_id"], out)
            self._part(data["message_id"], data["part"], out)
        elif event == "delta":
            kind = data.get("kind")
            if kind in STREAMED_KINDS:
                self._begin(data["message_id"], out)
                key = f"{data['message_id']}/{data['part_id']}"
                if self._new_part(key, None, out):
                    out.append({"type": f"{kind}-start", "id": key})
                    self.open[key] = (kind, 0)
                self._text(key, data["offset"], data["text"], out)
        elif (
            event == "turn"
            and data.get("turn_id") == self.turn_id
            and data.get("status") in OUTCOMES
        ):
            self._end(data["status"], out)
        return out

    def _begin(self, message_id: str, out: list[dict[str, Any]]) -> None:
        if not self.started:
            self.started = True
            out.append({"type": "start", "messageId": message_id})
        if not self.step_open:
            self.step_open = True
            out.append({"type": "start-step"})

    def _new_part(
        self, key: str, step_id: str | None, out: list[dict[str, Any]]
    ) -> bool:
        """Whether `key` is a part not seen before; if so, the parts before it end,
        and so does the step if it belongs to another."""
        if key in self.seen:
            return False
        self.seen.add(key)
        self._close_parts(out)
        if step_id is not None:
            if self.step_id is not None and step_id != self.step_id and self.step_open:
                out.append({"type": "finish-step"})
                out.append({"type": "start-step"})
            self.step_id = step_id
        return True

    def _text(
        self, key: str, offset: int, text: str, out: list[dict[str, Any]]
    ) -> None:
        known = self.open.get(key)
        if known is None:
            return  # ended: a later part began
        kind, sent = known
        end = offset + wire.utf16_len(text)
        if end > sent and offset <= sent:
            tail = wire.utf16_tail(text, sent - offset)
            out.append({"type": f"{kind}-delta", "id": key, "delta": tail})
            self.open[key] = (kind, end)

    def _close_parts(self, out: list[dict[str, Any]]) -> None:
        for key, (kind, _) in self.open.items():
            out.append({"type": f"{kind}-end", "id": key})
        self.open.clear()

    def _message(self, message: dict[str, Any], out: list[dict[str, Any]]) -> None:
        if message.get("role") != "agent" or message.get("turn_id") != self.turn_id:
            return
        self._begin(message["id"], out)
        content = message.get("content", ())
        for part in content:
            self._part(message["id"], part, out)
        if any(
            p.get("type") == "tool_call" and p.get("status") in WAITING for p in content
        ):
            # The turn waits for the frontend (a decision, or a tool it runs): the
            # reply so far is complete; the answer comes with the next POST.
            self._end("waiting", out)
        elif message.get("state") == "done":
            self._close_parts(out)
            if self.step_open:
                self.step_open = False
                out.append({"type": "finish-step"})

    def _part(
        self, message_id: str, part: dict[str, Any], out: list[dict[str, Any]]
    ) -> None:
        kind = part.get("type")
        key = f"{message_id}/{part.get('part_id')}"
        first = self._new_part(key, part.get("step_id"), out)
        if kind in STREAMED_KINDS:
            if first:
                out.append({"type": f"{kind}-start", "id": key})
                self.open[key] = (kind, 0)
            text = _part_text(part)
            if text is not None:
                self._text(key, 0, text, out)
        elif kind == "tool_call" and self._once(f"call:{part['id']}"):
            call = {"toolCallId": part["id"], "toolName": part["name"]}
            out.append({"type": "tool-input-start", **call})
            out.append(
                {"type": "tool-input-available", **call, "input": part.get("arguments")}
            )
        elif kind == "tool_result" and self._once(f"result:{part['tool_call_id']}"):
            call_id = part["tool_call_id"]
            if part.get("error") is not None:
                out.append(
                    {
                        "type": "tool-output-error",
                        "toolCallId": call_id,
                        "errorText": str(part["error"]),
                    }
                )
            else:
                out.append(
                    {
                        "type": "tool-output-available",
                        "toolCallId": call_id,
                        "output": part.get("result"),
                    }
                )
        elif kind == "interaction":
            self._interaction(part, out)
        elif kind == "error":
            self.error = f"{part.get('code')}: {part.get('message')}"

    def _interaction(self, part: dict[str, Any], out: list[dict[str, Any]]) -> None:
        call = part.get("tool_call_id")
        if part.get("interaction_type") != "approval" or call is None:
            return
        if part.get("status") == "pending" and self._once(
            f"approval:{part['interaction_id']}"
        ):
            out.append(
                {
                    "type": "tool-approval-request",
                    "approvalId": part["interaction_id"],
                    "toolCallId": call,
                }
            )
        elif part.get("status") == "denied" and self._once(f"denied:{call}"):
            out.append({"type": "tool-output-denied", "toolCallId": call})

    def hold(self, message_id: str, content: list[dict[str, Any]]) -> None:
        """Mark a message's parts as sent: the frontend holds them from the stream
        that ended when the turn began to wait for it."""
        for part in content:
            self.seen.add(f"{message_id}/{part.get('part_id')}")
            kind = part.get("type")
            if kind == "tool_call":
                self.seen.add(f"call:{part.get('id')}")
            elif kind == "tool_result":
                self.seen.add(f"result:{part.get('tool_call_id')}")
            elif kind == "interaction":
                self.seen.add(f"approval:{part.get('interaction_id')}")

    def _once(self, key: str) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def _end(self, status: str, out: list[dict[str, Any]]) -> None:
        self._close_parts(out)
        if self.step_open:
            self.step_open = False
            out.append({"type": "finish-step"})
        if not self.started:
            self.started = True
            out.insert(0, {"type": "start"})
        if status == "waiting":
            out.append({"type": "finish", "finishReason": "tool-calls"})
        elif status == "failed":
            out.append({"type": "error", "errorText": self.error or "the turn failed"})
        elif status == "cancelled":
            out.append({"type": "abort", "reason": "the turn was stopped"})
        else:
            out.append({"type": "finish", "finishReason": "stop"})
        self.done = True


def _part_text(part: dict[str, Any]) -> str | None:
    """A text or reasoning part's text so far (a committed reasoning part keeps it in
    `text.text`, a live one as a string)."""
    text = part.get("text")
    if isinstance(text, str):
        return text
    if isinstance(text, dict):
        inner = text.get("text")
        if isinstance(inner, str):
            return inner
        pieces = text.get("parts")
        if isinstance(pieces, list):
            return "".join(p for p in pieces if isinstance(p, str))
    return None


async def ui_chunks(
    frames: AsyncIterator[bytes], turn: TurnChunks
) -> AsyncIterator[bytes]:
    """The turn's UI message stream, read from its Mutation stream: ends after the
    turn's outcome with `[DONE]`. A stream the server closes first (its connection
    cycle, a slow client, the session deleted) ends without `[DONE]`: the client
    resumes it through `GET /v1/chat/{id}/stream`."""
    try:
        async for data in frames:
            for event, body in parse_frames(data):
                if event == KEEPALIVE:
                    # Read by no parser; it keeps proxies from closing a quiet stream.
                    yield KEEPALIVE_COMMENT
                    continue
                if event in ("disconnecting", "reset"):
                    return
                sent = turn.feed(event, body)
                if sent:
                    yield b"".join(chunk(c) for c in sent)
                if turn.done:
                    yield DONE
                    return
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()
