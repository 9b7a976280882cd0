"""`serve --workers N`: several processes on one port, on PostgreSQL only."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests.support.api import create_session, list_messages, post_message
from tests.support.lanes import ROOT
from tests.support.servers import free_port
from tests.support.sse import SSEReader
from tests.support.waits import wait_idle, wait_until

pytestmark = pytest.mark.e2e


def serve(database_url: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "info"}
    env.setdefault("SCRIPTED_DELAY_MS", "5")
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "serve", *args],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def test_sqlite_refuses_more_than_one_worker(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    process = serve(
        f"sqlite+aiosqlite:///{tmp_path}/one.db",
        "--workers",
        "2",
        "--port",
        str(free_port()),
        log=log,
    )
    assert process.wait(30) == 2
    assert "--workers needs PostgreSQL" in log.read_text()
    # Nothing was served, nothing was created.
    assert not (tmp_path / "one.db").exists()


@pytest.mark.postgres_only(reason="workers need PostgreSQL")
async def test_two_workers_share_one_port_and_see_each_others_writes(
    settings: Settings, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "workers.log"
    process = serve(
        settings.database_url,
        "--workers",
        "2",
        "--port",
        str(port),
        log=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with (
            asyncio.timeout(60),
            httpx.AsyncClient(base_url=url, timeout=10) as api,
        ):
            # Both workers are up once each has logged its start-up.
            await wait_until(
                lambda: log.read_text().count("Application startup complete") >= 2,
                "both workers to start",
                within=45,
                interval=0.1,
            )
            # Connections land on either worker: a stream, a write and reads through
            # separate connections must agree whichever worker answers each.
            sid = await create_session(api, "workers")
            streams = [
                await SSEReader(
                    httpx.AsyncClient(base_url=url, timeout=10),
                    f"/v1/sessions/{sid}/messages/stream",
                ).start()
                for _ in range(4)
            ]
            posted = await post_message(api, sid, "hello from any worker")
            await wait_idle(api, sid)
            page = await list_messages(api, sid)
            assert page["data"][0]["id"] == posted["id"]
            agent = page["data"][-1]
            for stream in streams:
                await stream.wait_for(
                    lambda frames: any(
                        f.event == "message"
                        and f.json()["message"]["id"] == agent["id"]
                        and f.json()["message"]["state"] == "done"
                        for f in frames
                    ),
                    "the closed agent message on every stream",
                )
                await stream.close()
                await stream.client.aclose()
            # Fresh connections (spread over both workers) read the same page.
            for _ in range(20):
                async with httpx.AsyncClient(base_url=url, timeout=10) as fresh:
                    assert (await list_messages(fresh, sid)) == page
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
