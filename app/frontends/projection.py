"""One turn, as a frontend protocol tells it: the turn's Mutation stream read back and
projected onto protocol-neutral steps (a reply begins, a step, a text or reasoning part
streaming, a tool call and its result, an approval asked, the turn's end), which each
protocol then encodes in its own words (app/frontends/ai_sdk.py, ag_ui.py).

The stream is replayed from the turn's first checkpoint (or from where the frontend's
answers were applied) and then followed live, so a projection resumes from the durable
log on any process. Everything is told once: text by what the frontend has been given
(in UTF-16 units, the unit of the Mutation stream's offsets), tool calls, results and
approvals by their ids."""

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from app import wire

# The parts that stream text, by their type on the Mutation stream.
STREAMED_KINDS = ("text", "reasoning")
OUTCOMES = ("completed", "failed", "cancelled")
# A tool call in one of these waits for the frontend.
WAITING = ("awaiting_approval", "awaiting_client")


@dataclass(frozen=True, slots=True)
class Begin:
    """The reply begins: `message_id` is the turn's first agent message (None: the
    turn ended before it had one)."""

    message_id: str | None


@dataclass(frozen=True, slots=True)
class StepStart:
    index: int


@dataclass(frozen=True, slots=True)
class StepEnd:
    index: int


@dataclass(frozen=True, slots=True)
class PartStart:
    """A text or reasoning part: `key` is `{message id}/{part id}` (part ids are unique
    within a message only)."""

    key: str
    kind: str


@dataclass(frozen=True, slots=True)
class PartDelta:
    key: str
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class PartEnd:
    key: str
    kind: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: Any
    # The text part the call follows, or the message it belongs to.
    parent: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    key: str
    call_id: str
    output: Any
    error: str | None


@dataclass(frozen=True, slots=True)
class ApprovalAsked:
    interaction_id: str
    call_id: str
    prompt: str | None


@dataclass(frozen=True, slots=True)
class Denied:
    call_id: str


@dataclass(frozen=True, slots=True)
class End:
    """The turn ended (`completed`, `failed`, `cancelled`), or waits for the frontend
    (`waiting`: the approvals it asks, the calls it runs)."""

    status: str
    error_code: str | None = None
    error: str | None = None
    approvals: tuple[ApprovalAsked, ...] = ()
    client_calls: tuple[str, ...] = ()


Step = (
    Begin
    | StepStart
    | StepEnd
    | PartStart
    | PartDelta
    | PartEnd
    | ToolCall
    | ToolResult
    | ApprovalAsked
    | Denied
    | End
)


@dataclass
class TurnProjection:
    """A message's parts stream one after another, so a part's first sight ends the
    text or reasoning before it; each agent message of the turn is one step."""

    turn_id: str
    started: bool = False
    step: int = 0
    step_open: bool = False
    done: bool = False
    # Text and reasoning parts still open: key -> (kind, UTF-16 units told).
    open: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Every part seen, and the tool calls, results and approvals told.
    seen: set[str] = field(default_factory=set)
    last_text: str | None = None
    error: tuple[str | None, str | None] = (None, None)

    def hold(self, message_id: str, content: list[dict[str, Any]]) -> None:
        """Mark a message's parts as told: the frontend holds them from the stream
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

    def feed(self, event: str, data: Any) -> list[Step]:
        out: list[Step] = []
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
                if self._new_part(key, out):
                    self._open(key, kind, out)
                self._text(key, data["offset"], data["text"], out)
        elif (
            event == "turn"
            and data.get("turn_id") == self.turn_id
            and data.get("status") in OUTCOMES
        ):
            self._end(End(data["status"], *self.error), out)
        return out

    def _begin(self, message_id: str, out: list[Step]) -> None:
        if not self.started:
            self.started = True
            out.append(Begin(message_id))
        if not self.step_open:
            self.step += 1
            self.step_open = True
            out.append(StepStart(self.step))

    def _new_part(self, key: str, out: list[Step]) -> bool:
        """Whether `key` is a part not seen before; if so, the parts before it end."""
        if key in self.seen:
            return False
        self.seen.add(key)
        self._close_parts(out)
        return True

    def _open(self, key: str, kind: str, out: list[Step]) -> None:
        out.append(PartStart(key, kind))
        self.open[key] = (kind, 0)
        if kind == "text":
            self.last_text = key

    def _text(self, key: str, offset: int, text: str, out: list[Step]) -> None:
        known = self.open.get(key)
        if known is None:
            return  # ended: a later part began
        kind, sent = known
        end = offset + wire.utf16_len(text)
        if end > sent and offset <= sent:
            out.append(PartDelta(key, kind, wire.utf16_tail(text, sent - offset)))
            self.open[key] = (kind, end)

    def _close_parts(self, out: list[Step]) -> None:
        for key, (kind, _) in self.open.items():
            out.append(PartEnd(key, kind))
        self.open.clear()

    def _close_step(self, out: list[Step]) -> None:
        self._close_parts(out)
        if self.step_open:
            self.step_open = False
            out.append(StepEnd(self.step))

    def _message(self, message: dict[str, Any], out: list[Step]) -> None:
        if message.get("role") != "agent" or message.get("turn_id") != self.turn_id:
            return
        message_id = message["id"]
        self._begin(message_id, out)
        content = message.get("content", ())
        for part in content:
            self._part(message_id, part, out)
        waiting = [
            p
            for p in content
            if p.get("type") == "tool_call" and p.get("status") in WAITING
        ]
        if waiting:
            # The turn waits for the frontend (a decision, or a tool it runs): the
            # reply so far is complete; the answer comes with the next request.
            approvals = tuple(_approvals(content))
            calls = tuple(
                p["id"] for p in waiting if p.get("status") == "awaiting_client"
            )
            self._end(End("waiting", approvals=approvals, client_calls=calls), out)
        elif message.get("state") == "done":
            self._close_step(out)

    def _part(self, message_id: str, part: dict[str, Any], out: list[Step]) -> None:
        kind = part.get("type")
        key = f"{message_id}/{part.get('part_id')}"
        first = self._new_part(key, out)
        if kind in STREAMED_KINDS:
            if first:
                self._open(key, str(kind), out)
            text = part_text(part)
            if text is not None:
                self._text(key, 0, text, out)
        elif kind == "tool_call" and self._once(f"call:{part['id']}"):
            out.append(
                ToolCall(
                    part["id"],
                    part["name"],
                    part.get("arguments"),
                    self.last_text or message_id,
                )
            )
        elif kind == "tool_result" and self._once(f"result:{part['tool_call_id']}"):
            error = part.get("error")
            out.append(
                ToolResult(
                    key,
                    part["tool_call_id"],
                    part.get("result"),
                    None if error is None else str(error),
                )
            )
        elif kind == "interaction":
            self._interaction(part, out)
        elif kind == "error":
            self.error = (part.get("code"), part.get("message"))

    def _interaction(self, part: dict[str, Any], out: list[Step]) -> None:
        call = part.get("tool_call_id")
        if part.get("interaction_type") != "approval" or call is None:
            return
        if part.get("status") == "pending" and self._once(
            f"approval:{part['interaction_id']}"
        ):
            out.append(ApprovalAsked(part["interaction_id"], call, part.get("prompt")))
        elif part.get("status") == "denied" and self._once(f"denied:{call}"):
            # The tool's failed result that follows says the same: told once.
            self.seen.add(f"result:{call}")
            out.append(Denied(call))

    def _once(self, key: str) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def _end(self, end: End, out: list[Step]) -> None:
        self._close_step(out)
        if not self.started:
            self.started = True
            out.insert(0, Begin(None))
        out.append(end)
        self.done = True


def _approvals(content: list[dict[str, Any]]) -> Iterator[ApprovalAsked]:
    for part in content:
        if (
            part.get("type") == "interaction"
            and part.get("interaction_type") == "approval"
            and part.get("status") == "pending"
            and part.get("tool_call_id") is not None
        ):
            yield ApprovalAsked(
                part["interaction_id"], part["tool_call_id"], part.get("prompt")
            )


def part_text(part: dict[str, Any]) -> str | None:
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


# ---- the Mutation stream, read back -----------------------------------------------------

KEEPALIVE = ":"


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


# What a projection yields besides its steps: the stream is quiet (a keep-alive is
# due), or the server closed it before the turn's end (the frontend resumes).
Quiet = object()


async def project(
    frames: AsyncIterator[bytes], turn: TurnProjection
) -> AsyncIterator[list[Step] | object]:
    """The turn's steps, batch by batch, as its Mutation stream delivers them; ends
    after the turn's End, or without one when the server closes the stream first
    (its connection cycle, a slow client, the session deleted)."""
    try:
        async for data in frames:
            for event, body in parse_frames(data):
                if event == KEEPALIVE:
                    yield Quiet
                    continue
                if event in ("disconnecting", "reset"):
                    return
                steps = turn.feed(event, body)
                if steps:
                    yield steps
                if turn.done:
                    return
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()
