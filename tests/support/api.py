"""The session API as plain calls over httpx (each asserts its success status and
returns the body), the request bodies and headers tests send, and what a turn writes."""

import uuid
from typing import Any

import httpx

# The durable events of a plain turn, and of one that calls a tool, in upstream's order.
TURN_EVENTS = [
    "input.message",
    "session.activated",
    "turn.started",
    "output.message.started",
    "output.message.completed",
    "turn.completed",
    "session.idled",
]
TOOL_TURN_EVENTS = [
    *TURN_EVENTS[:5],
    "tool.started",
    "tool.completed",
    *TURN_EVENTS[4:],
]


# Text whose length in UTF-16 code units (the unit of stream offsets, JavaScript's
# `String.length`) differs from its code point count in every way a browser meets: an
# emoji (one astral code point, two units), a ZWJ family (seven code points, eleven
# units, one glyph), a flag (two regional indicators), a combining mark (two code
# points, one glyph, no astral), CJK (one unit each), an emoji with a variation
# selector, and mathematical letters (astral). The scripted model echoes it word by
# word, one delta a word.
ASTRAL_TEXT = (
    "hi \U0001f600 then \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family "
    "\U0001f1fa\U0001f1e6 flag e\u0301 combining \u6f22\u5b57 CJK \u2764\ufe0f heart "
    "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522 done"
)


def utf16_units(text: str) -> int:
    """What JavaScript's `String.length` is for `text` (measured independently of the
    server's own helper)."""
    return len(text.encode("utf-16-le")) // 2


def text_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    """A message request body with one text part; `extra` are top-level fields."""
    return {"message": {"content": [{"type": "text", "text": text}]}, **extra}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def uuid_of(wire_id: str) -> uuid.UUID:
    """The UUID of a prefixed wire id (`session_<32 hex>`, `event_<32 hex>`, ...)."""
    return uuid.UUID(hex=wire_id.partition("_")[2])


def text_of(message: dict[str, Any]) -> str:
    """The text parts of a message, joined."""
    return "".join(p.get("text", "") for p in message["content"] if p["type"] == "text")


# ---- the session API ------------------------------------------------------------------


async def create_session(
    client: httpx.AsyncClient,
    title: str = "test",
    *,
    headers: dict[str, str] | None = None,
) -> str:
    response = await client.post("/v1/sessions", json={"title": title}, headers=headers)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


async def get_session(
    client: httpx.AsyncClient,
    session_id: str,
    *,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    response = await client.get(f"/v1/sessions/{session_id}", headers=headers)
    assert response.status_code == 200, response.text
    session: dict[str, Any] = response.json()
    return session


async def post_message(
    client: httpx.AsyncClient,
    session_id: str,
    text: str,
    *,
    headers: dict[str, str] | None = None,
    **message: Any,
) -> dict[str, Any]:
    """POST a text message (`message` adds fields to it, e.g. `visibility`); the 201
    body."""
    response = await client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"message": {"content": [{"type": "text", "text": text}], **message}},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_messages(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> dict[str, Any]:
    """The messages page (up to 200 messages unless `params` say otherwise)."""
    response = await client.get(
        f"/v1/sessions/{session_id}/messages", params={"limit": 200, **params}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def all_messages(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> list[dict[str, Any]]:
    """Every message, oldest first, walking back page by page (a page also ends early
    at MAX_LIST_BYTES)."""
    messages: list[dict[str, Any]] = []
    while True:
        page = await list_messages(client, session_id, **params)
        messages[:0] = page["data"]
        if not page["has_more"]:
            return messages
        params = {**params, "before_sequence": page["next_before_sequence"]}


async def list_events(
    client: httpx.AsyncClient, session_id: str
) -> list[dict[str, Any]]:
    """Every durable event, oldest first, following the cursor of a list that
    MAX_LIST_BYTES ended early."""
    events: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    while True:
        response = await client.get(f"/v1/sessions/{session_id}/events", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        events.extend(body["data"])
        if not body.get("has_more"):
            return events
        params = {"after_sequence": body["next_after_sequence"]}
