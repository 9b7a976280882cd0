"""Three server processes behind HAProxy (round-robin, no affinity: Debian's `haproxy`;
CI installs it and sets REQUIRE_HAPROXY) on one PostgreSQL database, on the PostgreSQL
bus and on the NATS bus. Consecutive requests land on different processes, so a
session is created on one, watched on another and posted to on a third, and every
client converges on what the database holds."""

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests.support.api import list_messages, text_of
from tests.support.nats import Nats
from tests.support.servers import Server, free_port, server_process, wait_listening
from tests.support.sse import Frame, SSEReader

pytestmark = pytest.mark.postgres_only

CONFIG = """global
    maxconn 2000
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend front
    bind 127.0.0.1:{port}
    default_backend nodes
backend nodes
    balance roundrobin
    http-response set-header X-Node %[srv_name]
{servers}
"""


class Balancer:
    def __init__(self, tmp_path: Path, nodes: list[Server]) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            if os.environ.get("REQUIRE_HAPROXY"):
                pytest.fail("REQUIRE_HAPROXY is set, but haproxy is not installed")
            pytest.skip("haproxy is not installed (Debian: apt-get install haproxy)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        servers = "\n".join(
            f"    server node{i} {node.url.removeprefix('http://')}"
            for i, node in enumerate(nodes)
        )
        config = tmp_path / f"haproxy-{self.port}.cfg"
        config.write_text(CONFIG.format(port=self.port, servers=servers))
        self.log = tmp_path / f"haproxy-{self.port}.log"
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(config)],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.port, "haproxy", self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def balancer(tmp_path: Path, nodes: list[Server]) -> Iterator[Balancer]:
    lb = Balancer(tmp_path, nodes)
    try:
        yield lb
    finally:
        lb.stop()


@contextlib.asynccontextmanager
async def three_nodes(
    settings: Settings, tmp_path: Path, **env: str
) -> AsyncIterator[list[Server]]:
    async with (
        server_process(settings.database_url, tmp_path, kill=False, **env) as a,
        server_process(settings.database_url, tmp_path, kill=False, **env) as b,
        server_process(settings.database_url, tmp_path, kill=False, **env) as c,
    ):
        yield [a, b, c]


def agent_done(frames: list[Frame]) -> bool:
    return any(
        f.event == "message"
        and f.json()["message"]["role"] == "agent"
        and f.json()["message"]["state"] == "done"
        for f in frames
    )


@pytest.mark.parametrize("bus", ["postgresql", "nats"])
async def test_clients_behind_a_round_robin_balancer_converge(
    settings: Settings, tmp_path: Path, bus: str, request: pytest.FixtureRequest
) -> None:
    env = {"SCRIPTED_DELAY_MS": "10"}
    if bus == "nats":
        nats: Nats = request.getfixturevalue("nats_server")
        env["BUS_URL"] = nats.url
    async with (
        asyncio.timeout(120),
        three_nodes(settings, tmp_path, **env) as nodes,
    ):
        with balancer(tmp_path, nodes) as lb:
            async with httpx.AsyncClient(base_url=lb.url, timeout=10) as client:
                await converge(client)


async def converge(client: httpx.AsyncClient) -> None:
    """Three sessions, each created, watched and posted to through the balancer (so
    on three different processes), then every stream checked against the database."""
    watched: list[tuple[str, SSEReader, dict[str, str]]] = []
    try:
        for index in range(3):
            created = await client.post("/v1/sessions", json={"title": f"lb {index}"})
            sid = created.json()["id"]
            stream = await SSEReader(
                client, f"/v1/sessions/{sid}/messages/stream?after=0"
            ).start()
            posted = await client.post(
                f"/v1/sessions/{sid}/messages",
                json={
                    "message": {
                        "content": [{"type": "text", "text": "/scenario long 30"}]
                    }
                },
            )
            assert posted.status_code == 201, posted.text
            assert stream.headers is not None
            nodes = {
                "created": created.headers["x-node"],
                "watched": stream.headers["x-node"],
                "posted": posted.headers["x-node"],
            }
            watched.append((sid, stream, nodes))
        for sid, stream, nodes in watched:
            await stream.wait_for(agent_done, f"the closed agent message of {sid}")
            final = [f.json()["message"] for f in stream.frames if f.event == "message"]
            stored = (await list_messages(client, sid))["data"]
            assert [(m["id"], m["revision"]) for m in stored] == [
                (m["id"], m["revision"]) for m in final if m["state"] == "done"
            ][-2:], (nodes, final)
            assert text_of(stored[-1]) == "".join(f"chunk{i} " for i in range(30))
    finally:
        for _, stream, _ in watched:
            await stream.close()
    # Round-robin: every session's three requests went to three different processes.
    for _, _, nodes in watched:
        assert len(set(nodes.values())) == 3, nodes
