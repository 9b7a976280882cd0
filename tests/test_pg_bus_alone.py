"""The PostgreSQL bus sends no NOTIFY while its process is alone on the database: a
process that starts says hello, and from then on the first one NOTIFYs again, so a
stream on the new process follows a turn run by the first; once the second stops, the
first is alone again within a few seconds."""

import asyncio
from pathlib import Path

import httpx
import pytest

from app.live.pg_bus import ALONE_CHECK_SECONDS, HELLO
from app.settings import Settings
from tests.support.api import create_session, post_message, text_of
from tests.support.notify import notifications
from tests.support.servers import server_process
from tests.support.sse import Frame, SSEReader, agent_done as agent_message_done
from tests.support.waits import wait_idle

pytestmark = pytest.mark.postgres_only


def agent_done(frames: list[Frame]) -> bool:
    return any(map(agent_message_done, frames))


def not_hello(heard: list[str]) -> list[str]:
    return [payload for payload in heard if not payload.endswith(HELLO)]


async def test_a_process_alone_sends_no_notify_until_another_starts(
    settings: Settings, tmp_path: Path
) -> None:
    env = {"SCRIPTED_DELAY_MS": "10"}
    async with (
        asyncio.timeout(120),
        notifications(settings.database_url) as heard,
        server_process(settings.database_url, tmp_path, kill=False, **env) as a,
        httpx.AsyncClient(base_url=a.url, timeout=10) as client_a,
    ):
        sid = await create_session(client_a, "alone")
        await post_message(client_a, sid, "/scenario long 20", role="user")
        await wait_idle(client_a, sid)
        # A's own hello, and nothing of its checkpoints or deltas.
        assert heard, "A said no hello"
        assert not_hello(heard) == []

        async with (
            server_process(settings.database_url, tmp_path, kill=False, **env) as b,
            httpx.AsyncClient(base_url=b.url, timeout=10) as client_b,
        ):
            stream = await SSEReader(
                client_b, f"/v1/sessions/{sid}/messages/stream"
            ).start()
            try:
                await post_message(client_a, sid, "/scenario long 30", role="user")
                await stream.wait_for(agent_done, "the closed agent message on B")
            finally:
                await stream.close()
            assert any(f.event == "delta" for f in stream.frames), "no delta reached B"
            final = [f.json()["message"] for f in stream.frames if f.event == "message"]
            assert text_of(final[-1]) == "".join(f"chunk{i} " for i in range(30))
            assert not_hello(heard), "A sent no NOTIFY with B listening"

        # B is gone: A counts the listeners again and stops notifying.
        await asyncio.sleep(ALONE_CHECK_SECONDS + 1.5)
        heard.clear()
        await post_message(client_a, sid, "/scenario long 20", role="user")
        await wait_idle(client_a, sid)
        assert not_hello(heard) == []
