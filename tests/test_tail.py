"""`evermirror tail`, a real `python -m app tail` process against a real server: it
prints the session's messages, then every new message and reply as it streams, each
part once, across the server cycling its connections and across a server restart
(reconnecting with Last-Event-ID); `--json` prints one Mutation a line; a missing key or
an unknown session ends it with status 1, Ctrl-C with status 0. The terminal output's
merging (a part, its deltas, then its snapshot, and reconnects repeating them) is
checked frame by frame in process."""

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from app.settings import Settings
from app.tail import Frame, Screen
from tests.support.api import auth, create_session, post_message, text_of
from tests.support.cli import create_cli_key
from tests.support.lanes import ROOT
from tests.support.servers import Server, free_port, server_process, start_server
from tests.support.waits import wait_idle, wait_until


class Tailing:
    """A running `tail`, its stdout and stderr read as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.out = ""
        self.err = ""
        self._readers = [
            asyncio.create_task(self._read(process.stdout, "out")),
            asyncio.create_task(self._read(process.stderr, "err")),
        ]

    async def _read(self, stream: asyncio.StreamReader | None, name: str) -> None:
        assert stream is not None
        while chunk := await stream.read(4096):
            setattr(self, name, getattr(self, name) + chunk.decode())

    async def wait_for(self, text: str, within: float = 20.0) -> None:
        await wait_until(
            lambda: text in self.out or self.process.returncode is not None,
            f"{text!r} in tail's output",
            within,
        )
        assert text in self.out, (self.out, self.err)

    async def interrupt(self) -> int:
        """Ctrl-C; its exit status."""
        self.process.send_signal(signal.SIGINT)
        return await self.finish()

    async def finish(self) -> int:
        code = await asyncio.wait_for(self.process.wait(), 15)
        await asyncio.gather(*self._readers)
        assert "Traceback" not in self.err, self.err
        return code

    def lines(self) -> list[str]:
        return self.out.splitlines()


@asynccontextmanager
async def tailing(
    url: str, session_id: str, *args: str, **env: str
) -> AsyncIterator[Tailing]:
    environment = {k: v for k, v in os.environ.items() if k != "EVERMIRROR_API_KEY"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "tail",
        session_id,
        "--url",
        url,
        *args,
        cwd=ROOT,
        env={**environment, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    tail = Tailing(process)
    try:
        yield tail
    finally:
        if process.returncode is None:
            process.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 10)


async def test_tail_prints_the_history_then_each_reply_as_it_streams(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        server_process(
            settings.database_url, tmp_path, SCRIPTED_DELAY_MS="40"
        ) as server,
        httpx.AsyncClient(base_url=server.url, timeout=20) as client,
    ):
        sid = await create_session(client, "tail")
        await post_message(client, sid, "first words")
        await wait_idle(client, sid)
        async with tailing(server.url, sid) as tail:
            await tail.wait_for("agent: first words\n")
            # A long reply: part of it is printed while the turn still runs.
            await post_message(client, sid, "/scenario long 40")
            await tail.wait_for("agent: chunk0 ")
            session = (await client.get(f"/v1/sessions/{sid}")).json()
            assert session["status"] != "idle", (
                "the reply was not printed as it streamed"
            )
            await wait_idle(client, sid)
            page = (await client.get(f"/v1/sessions/{sid}/messages")).json()
            reply = text_of(page["data"][-1])
            await tail.wait_for(f"agent: {reply}\n")
            assert await tail.interrupt() == 0
    # Each message once, in order, as plain lines (no terminal: no colours).
    assert tail.lines() == [
        "user: first words",
        "agent: first words",
        "user: /scenario long 40",
        f"agent: {reply}",
    ]
    assert "\033[" not in tail.out
    assert f"following {sid}" in tail.err


async def test_tail_json_prints_one_mutation_a_line(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        server_process(settings.database_url, tmp_path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=20) as client,
    ):
        sid = await create_session(client, "tail json")
        history = await post_message(client, sid, "before")
        await wait_idle(client, sid)
        async with tailing(server.url, sid, "--json") as tail:
            await tail.wait_for('"before"')
            posted = await post_message(client, sid, "streamed to json")
            await wait_idle(client, sid)
            page = (await client.get(f"/v1/sessions/{sid}/messages")).json()
            agent = page["data"][-1]
            await tail.wait_for(f'"revision":{agent["revision"]}')
            await wait_until(
                lambda: any(
                    json.loads(line)["data"].get("message", {}).get("id") == agent["id"]
                    and json.loads(line)["data"]["message"]["state"] == "done"
                    for line in tail.lines()
                ),
                "the reply's final snapshot",
            )
            assert await tail.interrupt() == 0
    mutations = [json.loads(line) for line in tail.lines()]
    assert all(set(m) == {"event", "id", "data"} for m in mutations), mutations
    # The history first: the first page's messages, at the page's cursor.
    assert mutations[0]["event"] == "message"
    assert mutations[0]["data"]["message"]["id"] == history["id"]
    assert mutations[0]["id"].isdigit()
    # Then the stream: the new user message, the reply's part and deltas, its snapshot.
    events = [m["event"] for m in mutations]
    assert {"part", "delta"} <= set(events), events
    final = max(
        i
        for i, m in enumerate(mutations)
        if m["event"] == "message" and m["data"]["message"]["id"] == agent["id"]
    )
    deltas = [m["data"] for m in mutations[:final] if m["event"] == "delta"]
    assert deltas
    assert all(d["message_id"] == agent["id"] for d in deltas)
    parts = [
        m["data"]["part"]
        for m in mutations
        if m["event"] == "part" and m["data"]["message_id"] == agent["id"]
    ]
    streamed = "".join(p.get("text", "") for p in parts) + "".join(
        d["text"] for d in deltas
    )
    assert streamed == text_of(agent) == "streamed to json"
    assert posted["id"] in {
        m["data"]["message"]["id"] for m in mutations if m["event"] == "message"
    }


async def test_tail_follows_across_cycles_and_a_server_restart(
    settings: Settings, tmp_path: Path
) -> None:
    """The server ends every stream within about a second; then it stops and comes
    back on the same port. Every message is printed once, none lost."""
    port = free_port()
    env = {"SSE_CYCLE_SECONDS": "1"}

    def serve() -> Server:
        return start_server(settings.database_url, tmp_path, port, **env)

    server = await asyncio.to_thread(serve)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            sid = await create_session(client, "tail reconnects")
            async with tailing(server.url, sid) as tail:
                for index in range(3):
                    await post_message(client, sid, f"cycle {index}")
                    await tail.wait_for(f"agent: cycle {index}\n")
                    await asyncio.sleep(1.3)  # the stream is cycled meanwhile
                await asyncio.to_thread(server.stop)
                await wait_until(lambda: "reconnecting" in tail.err, "the outage noted")
                server = await asyncio.to_thread(serve)
                await post_message(client, sid, "after the restart")
                await tail.wait_for("agent: after the restart\n", within=30)
                assert "reconnected" in tail.err, tail.err
                assert await tail.interrupt() == 0
    finally:
        await asyncio.to_thread(server.stop)
    expected = []
    for text in ("cycle 0", "cycle 1", "cycle 2", "after the restart"):
        expected += [f"user: {text}", f"agent: {text}"]
    assert tail.lines() == expected


async def test_tail_needs_the_key_and_a_session_that_exists(
    settings: Settings, tmp_path: Path
) -> None:
    key = await create_cli_key(settings.database_url, f"org_{uuid.uuid4().hex}")
    async with (
        server_process(settings.database_url, tmp_path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=20, headers=auth(key)) as client,
    ):
        sid = await create_session(client, "keyed")
        await post_message(client, sid, "for key holders")
        await wait_idle(client, sid)
        started = time.monotonic()
        async with tailing(server.url, sid) as refused:
            assert await refused.finish() == 1
        assert "401" in refused.err, refused.err
        assert time.monotonic() - started < 10
        ghost = f"session_{uuid.uuid4().hex}"
        async with tailing(server.url, ghost, "--key", key) as missing:
            assert await missing.finish() == 1
        assert "404" in missing.err, missing.err
        async with tailing(server.url, "sess_1", "--key", key) as malformed:
            assert await malformed.finish() == 2
        async with tailing(server.url, sid, EVERMIRROR_API_KEY=key) as keyed:
            await keyed.wait_for("agent: for key holders\n")
            assert await keyed.interrupt() == 0
    assert keyed.lines() == ["user: for key holders", "agent: for key holders"]


# ---- the terminal output, frame by frame ---------------------------------------------

MID = "message_" + "a" * 32


def frame(
    event: str, data: dict[str, Any], frame_id: str | None = None
) -> tuple[Frame, dict[str, Any]]:
    return Frame(event, frame_id, json.dumps(data)), data


def snapshot(
    content: list[dict[str, Any]], state: str, revision: int
) -> dict[str, Any]:
    return {
        "message": {
            "id": MID,
            "role": "agent",
            "state": state,
            "revision": revision,
            "content": content,
        }
    }


def render(frames: list[tuple[Frame, dict[str, Any]]], colour: bool = False) -> str:
    out = io.StringIO()
    screen = Screen(out, colour=colour)
    for item, data in frames:
        screen.frame(item, data)
    screen.finish()
    return out.getvalue()


TEXT = {"part_id": "agent-text:1", "sequence": 1, "type": "text"}
REASONING = {"part_id": "agent-reasoning:1", "sequence": 1, "type": "reasoning"}
TOOL = {
    "part_id": "agent-tool_call:2",
    "sequence": 2,
    "type": "tool_call",
    "id": "call_1",
    "name": "lookup",
    "arguments": {"query": "x"},
}


def delta(
    part: dict[str, Any], offset: int, text: str, revision: int = 0
) -> tuple[Frame, dict[str, Any]]:
    return frame(
        "delta",
        {
            "message_id": MID,
            "revision": revision,
            "part_id": part["part_id"],
            "offset": offset,
            "text": text,
        },
    )


def test_screen_prints_each_part_once() -> None:
    frames = [
        frame("part", {"message_id": MID, "revision": 0, "part": {**TEXT, "text": ""}}),
        delta(TEXT, 0, "Hello "),
        delta(TEXT, 0, "Hello "),  # repeated: nothing new
        delta(TEXT, 3, "lo wor"),  # overlapping: only "wor"
        delta(TEXT, 20, "gap"),  # past what was printed: the snapshot fills it in
        frame(
            "message",
            snapshot(
                [{**TEXT, "text": "Hello world"}, {**TOOL, "status": "running"}],
                "streaming",
                1,
            ),
            "7",
        ),
        # A reconnect sends the snapshot again; then the final one comes.
        frame(
            "message",
            snapshot(
                [{**TEXT, "text": "Hello world"}, {**TOOL, "status": "running"}],
                "streaming",
                1,
            ),
            "7",
        ),
        frame(
            "message",
            snapshot(
                [{**TEXT, "text": "Hello world"}, {**TOOL, "status": "completed"}],
                "done",
                2,
            ),
            "9",
        ),
    ]
    assert render(frames).splitlines() == [
        "agent: Hello world",
        'agent: [tool lookup {"query":"x"}: running]',
        'agent: [tool lookup {"query":"x"}: completed]',
    ]


def test_screen_reasoning_and_colours() -> None:
    frames = [
        frame(
            "part",
            {"message_id": MID, "revision": 0, "part": {**REASONING, "text": "Think"}},
        ),
        delta(REASONING, 5, "ing"),
        frame(
            "message",
            snapshot(
                [{**REASONING, "text": {"kind": "plain", "text": "Thinking"}}],
                "done",
                1,
            ),
        ),
    ]
    assert render(frames) == "agent (thinking): Thinking\n"
    coloured = render(frames, colour=True)
    assert "\033[1;32magent (thinking):\033[0m" in coloured
    assert "\033[2mThink\033[0m\033[2ming\033[0m" in coloured


def test_screen_prints_an_action_by_its_title() -> None:
    """It printed `[action None]` for every Action."""
    action = {
        "type": "action",
        "part_id": "agent-action:1",
        "sequence": 1,
        "action_id": "action_" + "a" * 32,
        "action_type": "tools_changed",
        "state": "completed",
        "title": "Tools changed: lookup",
        "data": {"field": "tools"},
    }
    frames = [frame("message", snapshot([action], "done", 1), "3")]
    assert render(frames).splitlines() == ["agent: [Tools changed: lookup]"]
