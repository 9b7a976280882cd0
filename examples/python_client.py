"""One turn from Python with the Python client (clients/python, `pip install -e
clients/python`): a live view of the session prints the reply as it streams, then the
committed reply.

    BASE_URL=http://127.0.0.1:8000 API_KEY=evm_... python examples/python_client.py "hello there"
"""

import asyncio
import os
import sys

from evermirror_client import Evermirror, Message, SyncView


def text_of(message: Message) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


def agent_done(messages: list[Message]) -> bool:
    return (
        bool(messages)
        and messages[-1]["role"] == "agent"
        and messages[-1]["state"] == "done"
    )


async def main(text: str) -> None:
    base_url = os.environ.get("BASE_URL", "http://127.0.0.1:8000")
    async with Evermirror(
        base_url=base_url, api_key=os.environ.get("API_KEY")
    ) as client:
        session = await client.create_session(title="python example")
        print(f"session: {session.id}")
        printed = ""

        def show(view: SyncView) -> None:
            nonlocal printed
            messages = view.messages
            if messages and messages[-1]["role"] == "agent":
                shown = text_of(messages[-1])
                if shown.startswith(printed):
                    print(shown[len(printed) :], end="", flush=True)
                printed = shown

        async with session.sync() as view:
            view.on_change(show)
            await session.send(text)
            messages = await view.wait_for(agent_done)
        print(f"\nagent: {text_of(messages[-1])}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "hello from python"))
