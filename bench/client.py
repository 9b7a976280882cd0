"""The service's API as the bench uses it: sessions, messages, waiting for idle, and
seeding a conversation through the API (the scripted model echoes each message)."""

import asyncio
import time
from typing import Any

import httpx

from bench.servers import BenchError

SENTENCE = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly box "
    "jackdaws near the riverbank and every pilot checks their compass before the "
    "long flight across northern mountains under pale winter light"
)
WORDS = SENTENCE.split()


def text_of(size: int, seed: int) -> str:
    """About `size` bytes of plain words (no JSON escapes), different per seed."""
    words = [f"m{seed:05d}"]
    index = seed
    while sum(len(w) + 1 for w in words) < size:
        words.append(WORDS[index % len(WORDS)])
        index += 7
    return " ".join(words)[:size]


class Api:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.authorization = f"Bearer {key}"
        self.client = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": self.authorization},
            timeout=httpx.Timeout(30.0),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def _json(self, response: httpx.Response, *ok: int) -> Any:
        if response.status_code not in ok:
            raise BenchError(
                f"{response.request.method} {response.request.url.path} answered "
                f"{response.status_code}: {response.text[:300]}"
            )
        return response.json()

    async def create_session(self, title: str = "bench") -> str:
        body = await self._json(
            await self.client.post("/v1/sessions", json={"title": title}), 201, 200
        )
        return str(body["id"])

    async def post_message(self, session_id: str, text: str) -> dict[str, Any]:
        body: dict[str, Any] = await self._json(
            await self.client.post(
                f"/v1/sessions/{session_id}/messages",
                json={"message": {"content": [{"type": "text", "text": text}]}},
            ),
            201,
        )
        return body

    async def status(self, session_id: str) -> str:
        body = await self._json(
            await self.client.get(f"/v1/sessions/{session_id}"), 200
        )
        return str(body.get("status"))

    async def wait_idle(self, session_id: str, within: float) -> None:
        deadline = time.monotonic() + within
        pause = 0.002
        while time.monotonic() < deadline:
            if await self.status(session_id) == "idle":
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
        raise BenchError(f"session {session_id} not idle after {within:.0f} s")

    async def page(
        self, session_id: str, query: str, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        return await self.client.get(
            f"/v1/sessions/{session_id}/messages?{query}", headers=headers
        )

    async def seed(
        self, session_id: str, messages: int, text_bytes: int, within: float
    ) -> int:
        """Post user messages one turn at a time until the session holds `messages`
        visible messages (each turn adds the message and the agent's echo). Returns
        the count reached."""
        deadline = time.monotonic() + within
        total = 0
        seed = 0
        while total < messages:
            if time.monotonic() > deadline:
                raise BenchError(f"seeding reached {total}/{messages} messages in time")
            await self.post_message(session_id, text_of(text_bytes, seed))
            seed += 1
            await self.wait_idle(session_id, max(1.0, deadline - time.monotonic()))
            total = seed * 2
        page = await self._json(await self.page(session_id, "limit=1"), 200)
        return int(page["total"])
