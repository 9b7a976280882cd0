"""The clients' shared scenario, for the Python client as installed from its wheel:
page and walk back, sync through a turn, tool results, an approval, send-and-wait and
cancel. Run as `python scenario.py BASE_URL`; prints `ok` at the end."""

import asyncio
import sys
import time
from typing import Any

from evermirror_client import Evermirror, Message, Session

WEATHER = {
    "type": "client_side",
    "name": "get_weather",
    "description": "The weather",
    "parameters": {"type": "object"},
}
GUARDED = {
    "type": "builtin",
    "name": "lookup",
    "description": "Look something up",
    "parameters": {"type": "object"},
    "policy": "requires_approval",
}


def text_of(message: Message) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not await check():
        assert time.monotonic() < deadline, f"no {what} within 30 s"
        await asyncio.sleep(0.05)


async def idle(session: Session) -> None:
    async def check() -> bool:
        return bool((await session.get())["status"] == "idle")

    await until(check, "idle session")


async def main(base_url: str) -> None:
    async with Evermirror(base_url=base_url) as client:
        session = await client.create_session(title="packed", tools=[WEATHER, GUARDED])
        for index in range(3):
            done = await session.send_and_wait(f"message {index}")
            assert done.status == "completed", done
        # Page, then walk back to the first message.
        page = await session.messages(limit=4)
        items = list(page.items)
        while page.has_more:
            page = await session.messages(
                limit=4, before_sequence=page.next_before_sequence
            )
            items = list(page.items) + items
        assert [text_of(m) for m in items] == [
            text for index in range(3) for text in [f"message {index}"] * 2
        ], items
        # A live view through a turn.
        async with session.sync() as view:
            await session.send("seen live")
            messages = await view.wait_for(
                lambda ms: (
                    len(ms) == 8
                    and ms[-1]["role"] == "agent"
                    and ms[-1]["state"] == "done"
                )
            )
            assert text_of(messages[-1]) == "seen live"
        # A client-side tool: send-and-wait answers waiting, the result goes back.
        waiting = await session.send_and_wait(
            '/scenario call get_weather {"city": "Oslo"}'
        )
        assert (waiting.status, waiting.waiting_for) == ("waiting", "tool_results")
        (call,) = [
            p for p in waiting.messages[-1]["content"] if p["type"] == "tool_call"
        ]
        answer = await session.submit_tool_results(
            [{"tool_call_id": call["id"], "result": "sunny"}]
        )
        assert answer["accepted"] == 1, answer
        await idle(session)
        # An approval, decided.
        asked = await session.send_and_wait('/scenario call lookup {"query": "tea"}')
        assert (asked.status, asked.waiting_for) == ("waiting", "approval")
        (pending,) = await session.interactions("pending")
        decided = await session.respond(pending["interaction_id"], "approve")
        assert decided["status"] == "approved", decided
        await idle(session)
        # Cancel a turn while its reply streams.
        await session.send("/scenario long 500")

        async def streaming() -> bool:
            last = (await session.messages(limit=1)).items[-1]
            return bool(last["role"] == "agent" and last["state"] == "streaming")

        await until(streaming, "streaming reply")
        assert (await session.cancel())["status"] == "cancelled"
        await idle(session)
    print("ok")


asyncio.run(main(sys.argv[1]))
