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
from pydantic import ValidationError

from app.settings import Settings
from tests.support.api import list_messages, text_of
from tests.support.nats import Nats
from tests.support.pgbouncer import PgBouncer
from tests.support.servers import Server, free_port, server_process, wait_listening
from tests.support.sse import Frame, SSEReader
from tests.support.waits import wait_idle

pytestmark = pytest.mark.postgres_only

CONFIG = """global
    maxconn 2000
defaults
    mode http
    option http-no-delay
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
    database_url: str, tmp_path: Path, **env: str
) -> AsyncIterator[list[Server]]:
    async with (
        server_process(database_url, tmp_path, kill=False, **env) as a,
        server_process(database_url, tmp_path, kill=False, **env) as b,
        server_process(database_url, tmp_path, kill=False, **env) as c,
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
        three_nodes(settings.database_url, tmp_path, **env) as nodes,
    ):
        with balancer(tmp_path, nodes) as lb:
            async with httpx.AsyncClient(base_url=lb.url, timeout=10) as client:
                await converge(client)


async def test_nodes_behind_a_transaction_pooler_converge(
    settings: Settings, tmp_path: Path
) -> None:
    """The same with every node's statements through PgBouncer in transaction mode,
    which has fewer server connections than the nodes' pools hold (each transaction
    may run on another one), and the bus's LISTEN and the leases on the database
    directly (DATABASE_DIRECT_URL)."""
    pooler = PgBouncer(tmp_path, settings.database_url, server_connections=3)
    try:
        async with (
            asyncio.timeout(120),
            three_nodes(
                pooler.url,
                tmp_path,
                SCRIPTED_DELAY_MS="10",
                DATABASE_DIRECT_URL=settings.database_url,
            ) as nodes,
        ):
            with balancer(tmp_path, nodes) as lb:
                async with httpx.AsyncClient(base_url=lb.url, timeout=10) as client:
                    await converge(client)
                    await burst(client)
                    # The statements went through the pooler: without it the nodes
                    # answer 503, with the database itself still up.
                    pooler.stop()
                    refused = await client.post("/v1/sessions", json={})
                    assert refused.status_code == 503, refused.text
    finally:
        pooler.stop()


@pytest.mark.parametrize(
    ("database_url", "direct_url"),
    [
        ("sqlite+aiosqlite:///one.db", "postgresql://app@db/evermirror"),
        ("postgresql://app@pooler:6432/evermirror", "sqlite+aiosqlite:///one.db"),
    ],
)
def test_a_direct_url_is_refused_unless_both_urls_are_postgresql(
    database_url: str, direct_url: str
) -> None:
    with pytest.raises(ValidationError, match="both must be PostgreSQL URLs"):
        Settings(database_url=database_url, database_direct_url=direct_url)


def test_what_holds_a_session_connects_to_the_database_itself() -> None:
    pooled = Settings(
        database_url="postgres://app@pooler:6432/evermirror",
        database_direct_url="postgres://app@db:5432/evermirror",
    )
    assert pooled.pooled
    assert pooled.direct_url == "postgresql+asyncpg://app@db:5432/evermirror"
    direct = Settings(database_url="postgres://app@db:5432/evermirror")
    assert not direct.pooled
    assert direct.direct_url == direct.database_url


async def burst(client: httpx.AsyncClient) -> None:
    """Many requests at once, of every kind of statement the service sends (SQLAlchemy's,
    the write unit's, the hot reads', the group commit's), over the pooler's few server
    connections."""
    sessions = [
        (await client.post("/v1/sessions", json={"title": f"burst {i}"})).json()["id"]
        for i in range(6)
    ]

    async def post(sid: str, index: int) -> httpx.Response:
        body = {"message": {"content": [{"type": "text", "text": f"hello {index}"}]}}
        return await client.post(f"/v1/sessions/{sid}/messages", json=body)

    answers = await asyncio.gather(
        *(post(sid, i) for i in range(5) for sid in sessions),
        *(client.get(f"/v1/sessions/{sid}/messages") for sid in sessions),
        *(client.get("/v1/sessions", params={"search": "burst"}) for _ in range(6)),
        *(client.get("/v1/search", params={"q": "hello"}) for _ in range(6)),
    )
    assert [a.status_code for a in answers if a.status_code >= 300] == []
    for sid in sessions:
        # The turns the messages started run to their end through the pooler too.
        await wait_idle(client, sid)
        stored = (await list_messages(client, sid))["data"]
        posted = sorted(text_of(m) for m in stored if m["role"] == "user")
        assert posted == [f"hello {i}" for i in range(5)]


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
