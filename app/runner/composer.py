"""The Composer: canonical history in, model input out. The only module that knows the
model's message format (OpenAI Chat Completions messages, which every compatible server
reads); drivers send what it returns as it is.

* The session's `system_prompt` comes first.
* User and agent messages follow in sequence order, internal ones included: they are
  instructions to the model, hidden from people, not from it.
* An agent message becomes one `assistant` message per model step (its text and its tool
  calls), each followed by one `tool` message per call, in call order, as the protocol
  requires. A call without a result (the turn ended before it ran) gets one saying so:
  a request whose calls lack results is refused by every provider.
* Images become `image_url` content; `context` parts become `<tag>text</tag>` with the
  tag name and the text escaped, so text inside can never close the tag early.
* `provider_opaque` parts are replayed only to the provider that produced them (their
  `content` is merged into the message of their step); reasoning, error, interaction
  and action parts are not model input.
* Everything must fit the token budget (`MODEL_CONTEXT_TOKENS` less the reply's share).
  No tokenizer is installable offline for arbitrary models (tiktoken downloads its
  encodings, and local models use their own), so tokens are estimated: a token per 4
  characters, rounded up, plus 4 per message. When history does not fit, the runner has
  the model summarize the oldest messages (`summary_request`) and the next request is
  the summary plus the recent messages (`fit(..., summary=...)`); what still does not
  fit is left out whole, oldest first (a step and its tool results go together), with
  a note saying how many. The newest user message is always sent.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app import wire

ChatMessage = dict[str, Any]

# Per-message overhead of the estimate (role and framing tokens).
MESSAGE_OVERHEAD_TOKENS = 4
# The share of the context window left for the model's reply.
REPLY_SHARE = 0.25
NO_RESULT = "No result: the turn ended before this tool ran."


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """One canonical message as the Composer reads it: every part, hidden ones included."""

    sequence: int
    role: str
    visibility: str
    content: list[dict[str, Any]]


def estimate_tokens(message: ChatMessage) -> int:
    """ceil(characters / 4) + 4: characters of the text, of image URLs, and of the JSON
    of tool calls."""
    chars = 0
    content = message.get("content")
    if isinstance(content, str):
        chars += len(content)
    elif isinstance(content, list):
        for item in content:
            if item.get("type") == "text":
                chars += len(item.get("text", ""))
            else:
                # An image costs what the provider decides; its URL is a floor.
                chars += len(item.get("image_url", {}).get("url", "")) // 8 + 340
    for call in message.get("tool_calls") or ():
        chars += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return math.ceil(chars / 4) + MESSAGE_OVERHEAD_TOKENS


def escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_tag(tag: str) -> str:
    """A tag name of letters, digits, `_`, `-` and `.` (anything else becomes `_`), so
    it cannot carry markup; starting with a letter, as XML names do."""
    name = "".join(
        c if c.isascii() and (c.isalnum() or c in "_-.") else "_" for c in tag
    )
    if not name or not name[0].isalpha():
        name = "context_" + name
    return name


def context_text(tag: str, text: str) -> str:
    name = escape_tag(tag)
    return f"<{name}>{escape_text(text)}</{name}>"


def _image(part: dict[str, Any]) -> dict[str, Any] | None:
    if part.get("url"):
        url = part["url"]
    elif part.get("base64"):
        url = f"data:{part.get('media_type') or 'image/png'};base64,{part['base64']}"
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _opaque(part: dict[str, Any], provider: str) -> dict[str, Any]:
    """What a provider_opaque part replays: its content, to its own provider only."""
    content = part.get("content")
    if part.get("provider") != provider or not isinstance(content, dict):
        return {}
    return {k: v for k, v in content.items() if k not in ("role", "tool_calls")}


def _user(message: HistoryMessage, provider: str) -> ChatMessage | None:
    items: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    for part in message.content:
        kind = part.get("type")
        if kind == "text":
            items.append({"type": "text", "text": part.get("text", "")})
        elif kind == "context":
            text = context_text(part.get("tag", ""), part.get("context", ""))
            items.append({"type": "text", "text": text})
        elif kind == "image":
            image = _image(part)
            if image is not None:
                items.append(image)
        elif kind in ("image_file", "file"):
            name = part.get("filename") or part.get("image_id") or part.get("file_id")
            items.append({"type": "text", "text": f"[attached file: {name}]"})
        elif kind == "provider_opaque":
            extra.update(_opaque(part, provider))
    if not items:
        return None
    if all(item["type"] == "text" for item in items):
        # Plain text where it can be: every server reads it, not all read lists.
        content: Any = "\n\n".join(item["text"] for item in items)
    else:
        content = items
    return {**extra, "role": "user", "content": content}


def _tool_content(result: dict[str, Any] | None) -> str:
    if result is None:
        return NO_RESULT
    if result.get("error") is not None:
        return f"Error: {result['error']}"
    value = result.get("result")
    return value if isinstance(value, str) else wire.dumps(value).decode()


def _agent(message: HistoryMessage, provider: str) -> list[list[ChatMessage]]:
    """The agent message's steps, each a group: its assistant message, then its tool
    results. Groups are what the budget keeps or leaves out whole."""
    results = {
        part["tool_call_id"]: part
        for part in message.content
        if part.get("type") == "tool_result" and "tool_call_id" in part
    }
    steps: dict[str, list[dict[str, Any]]] = {}
    for part in message.content:
        steps.setdefault(str(part.get("step_id", "")), []).append(part)
    groups: list[list[ChatMessage]] = []
    for parts in steps.values():
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        extra: dict[str, Any] = {}
        for part in parts:
            kind = part.get("type")
            if kind == "text" and part.get("text"):
                texts.append(part["text"])
            elif kind == "tool_call":
                arguments = part.get("arguments")
                calls.append(
                    {
                        "id": part["id"],
                        "type": "function",
                        "function": {
                            "name": part["name"],
                            "arguments": wire.dumps(
                                arguments if arguments is not None else {}
                            ).decode(),
                        },
                    }
                )
            elif kind == "provider_opaque":
                extra.update(_opaque(part, provider))
        if not texts and not calls:
            continue
        assistant: ChatMessage = {
            **extra,
            "role": "assistant",
            "content": "".join(texts) if texts else None,
        }
        if calls:
            assistant["tool_calls"] = calls
        group = [assistant]
        for call in calls:
            group.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": _tool_content(results.get(call["id"])),
                }
            )
        groups.append(group)
    return groups


@dataclass(frozen=True, slots=True)
class Summary:
    """A model-written summary standing in for a session's messages up to
    `last_sequence` (derived data: `composer_summaries`)."""

    last_sequence: int
    text: str


@dataclass(frozen=True, slots=True)
class Composition:
    """The model input, and what of the history did not fit: the newest sequence left
    out (None: nothing was), for a summary to cover next time."""

    messages: list[ChatMessage]
    omitted_through: int | None


def _groups(
    history: Sequence[HistoryMessage], provider: str
) -> list[tuple[int, list[ChatMessage]]]:
    groups: list[tuple[int, list[ChatMessage]]] = []
    for message in sorted(history, key=lambda m: m.sequence):
        if message.role == "user":
            user = _user(message, provider)
            if user is not None:
                groups.append((message.sequence, [user]))
        elif message.role == "agent":
            groups.extend((message.sequence, g) for g in _agent(message, provider))
    return groups


def fit(
    history: Sequence[HistoryMessage],
    *,
    system_prompt: str | None,
    provider: str,
    context_tokens: int,
    summary: Summary | None = None,
) -> Composition:
    """The model input for the next step of a turn (`history` in any order): with a
    `summary`, the messages it covers are replaced by it."""
    groups = _groups(history, provider)
    head: list[ChatMessage] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    if summary is not None:
        groups = [g for g in groups if g[0] > summary.last_sequence]
        head.append(
            {
                "role": "system",
                "content": "Summary of the earlier conversation:\n" + summary.text,
            }
        )
    budget = int(context_tokens * (1 - REPLY_SHARE)) - sum(map(estimate_tokens, head))
    # Newest first, keep whole groups while they fit; the newest user message (and
    # what follows it) always goes.
    last_user = max(
        (i for i, (_, g) in enumerate(groups) if g[0]["role"] == "user"), default=0
    )
    kept = 0
    used = 0
    for index in range(len(groups) - 1, -1, -1):
        cost = sum(map(estimate_tokens, groups[index][1]))
        if used + cost > budget and index < last_user:
            break
        kept += 1
        used += cost
    omitted = groups[: len(groups) - kept]
    if omitted:
        head.append(
            {
                "role": "system",
                "content": f"[{len(omitted)} earlier part(s) of this conversation were "
                "left out to fit the context window.]",
            }
        )
    messages = [*head, *(m for _, group in groups[len(omitted) :] for m in group)]
    return Composition(messages, omitted[-1][0] if omitted else None)


def compose(
    history: Sequence[HistoryMessage],
    *,
    system_prompt: str | None,
    provider: str,
    context_tokens: int,
    summary: Summary | None = None,
) -> list[ChatMessage]:
    """`fit`'s messages."""
    return fit(
        history,
        system_prompt=system_prompt,
        provider=provider,
        context_tokens=context_tokens,
        summary=summary,
    ).messages


def summary_request(
    history: Sequence[HistoryMessage],
    *,
    provider: str,
    context_tokens: int,
    previous: Summary | None,
    through: int,
) -> list[ChatMessage]:
    """The model input that asks for a summary of the messages up to `through` (those
    after `previous`, which it extends), fitted to the budget like any request."""
    covered = [m for m in history if m.sequence <= through]
    instruction = (
        "Summarize the conversation above for your own later use: the user's goals "
        "and questions, facts established, decisions, tool results that matter, and "
        "what is still open. Plain prose, at most 300 words; no preamble."
    )
    messages = fit(
        covered,
        system_prompt=None,
        provider=provider,
        context_tokens=context_tokens,
        summary=previous,
    ).messages
    return [*messages, {"role": "user", "content": instruction}]


def tool_definitions(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Upstream's ToolDefinitions as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("parameters")
                or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
        if tool.get("name")
    ]
