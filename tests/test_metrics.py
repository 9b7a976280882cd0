"""`GET /metrics`: Prometheus text scraped from real server processes and parsed with
prometheus-client's own parser and checked by `promtool check metrics`; never rate-limited, never asks for a key; on a port of
its own with METRICS_PORT; gone with METRICS_ENABLED=false."""

import asyncio
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import auth, create_session, post_message
from tests.support.cli import create_cli_key
from tests.support.lanes import LANES, lane_database_url
from tests.support.problems import assert_problem
from tests.support.servers import free_port, server_process
from tests.support.waits import wait_idle

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Route templates within the API: /v1 and /api/v1 share them.
PAGE = "/sessions/{session_id}/messages"


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_value(family: Any, suffix: str, **labels: str) -> float:
    """The value of the family's sample named `name + suffix` with these labels."""
    for sample in family.samples:
        if sample.name == family.name + suffix and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            return float(sample.value)
    raise AssertionError(f"no {family.name}{suffix} with {labels}: {family.samples}")


def promtool_accepts(text: str) -> None:
    """Prometheus's own check of an exposition (Debian's `prometheus` package; CI
    installs it and sets REQUIRE_PROMTOOL)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("REQUIRE_PROMTOOL"):
            pytest.fail("REQUIRE_PROMTOOL is set, but promtool is not installed")
        return
    checked = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Exit 0: valid; lint findings (such as counters without _total) print and exit 3.
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(params=LANES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return lane_database_url(request, tmp_path)


async def test_metrics_count_requests_turns_and_checkpoints_without_a_key(
    database_url: str, tmp_path: Path
) -> None:
    key = await create_cli_key(database_url, "org_" + "0" * 31 + "1")
    async with (
        server_process(database_url, tmp_path, RATE_LIMIT_PER_SECOND="1") as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        session = await create_session(client, headers=auth(key))
        await post_message(client, session, "/scenario long 5", headers=auth(key))
        await wait_idle(client, session, headers=auth(key))
        for _ in range(3):
            page = await client.get(
                f"/v1/sessions/{session}/messages", headers=auth(key)
            )
            assert page.status_code in (200, 429)

        # Far past the rate limit, and without a key: every scrape is answered.
        answers = await asyncio.gather(*(client.get("/metrics") for _ in range(30)))
        assert {a.status_code for a in answers} == {200}
        answer = answers[-1]
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        parsed = families(answer.text)
        # One HELP and TYPE per family: Prometheus drops a whole scrape that repeats one.
        lines = answer.text.splitlines()
        helps = [line.split()[2] for line in lines if line.startswith("# HELP")]
        assert len(helps) == len(set(helps)), sorted(helps)
        promtool_accepts(answer.text)

    http = parsed["evermirror_http_request_duration_seconds"]
    assert http.type == "histogram"
    pages = sample_value(http, "_count", route=PAGE, method="GET")
    assert pages >= 1
    created = sample_value(http, "_count", route="/sessions", method="POST")
    assert created == 1
    # The histogram's buckets are cumulative and end at the count.
    assert sample_value(http, "_bucket", route="/sessions", le="+Inf") == created

    turns = parsed["evermirror_turn_duration_seconds"]
    assert sample_value(turns, "_count", outcome="completed") == 1
    commits = parsed["evermirror_checkpoint_commit_seconds"]
    # The session, the user message, the agent message's checkpoints, the turn's end.
    assert sample_value(commits, "_count", outcome="committed") >= 4
    assert sample_value(parsed["evermirror_turns_running"], "") == 0
    assert "evermirror_streams_open" in parsed
    assert "evermirror_stream_dropped_consumers" in parsed
    bus = parsed["evermirror_bus_notifications"]
    assert sample_value(bus, "_total", kind="TextDelta") >= 5
    assert sample_value(bus, "_total", kind="Wakeup") >= 1
    if database_url.startswith("postgresql"):
        assert sample_value(parsed["evermirror_db_pool_connections_in_use"], "") >= 0


async def test_open_streams_are_counted_by_kind(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        server_process(database_url, tmp_path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        base = f"/v1/sessions/{await create_session(client)}"
        async with (
            client.stream("GET", f"{base}/sse") as sse,
            client.stream("GET", f"{base}/messages/stream") as mutations,
        ):
            assert sse.status_code == mutations.status_code == 200
            parsed = families((await client.get("/metrics")).text)
            open_ = parsed["evermirror_streams_open"]
            assert sample_value(open_, "", stream="sse") == 1
            assert sample_value(open_, "", stream="mutations") == 1
        # A stream ends when the server notices its client left (at the latest, its
        # next heartbeat).
        for _ in range(200):
            parsed = families((await client.get("/metrics")).text)
            gauge = parsed["evermirror_streams_open"]
            if (
                sample_value(gauge, "", stream="sse")
                == sample_value(gauge, "", stream="mutations")
                == 0
            ):
                break
            await asyncio.sleep(0.05)
    assert sample_value(parsed["evermirror_streams_open"], "", stream="sse") == 0
    assert sample_value(parsed["evermirror_streams_open"], "", stream="mutations") == 0
    opened = parsed["evermirror_streams_opened"]
    assert sample_value(opened, "_total", stream="sse") == 1
    http = parsed["evermirror_http_request_duration_seconds"]
    assert (
        sample_value(http, "_count", route="/sessions/{session_id}/sse", status="200")
        == 1
    )


async def test_metrics_port_moves_them_off_the_main_port(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    async with (
        server_process(database_url, tmp_path, METRICS_PORT=str(port)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        await create_session(client)
        assert_problem(await client.get("/metrics"), 404)
        scraped = await client.get(f"http://127.0.0.1:{port}/metrics")
        assert scraped.status_code == 200
        http = families(scraped.text)["evermirror_http_request_duration_seconds"]
        assert sample_value(http, "_count", route="/sessions", method="POST") == 1
        assert (await client.get(f"http://127.0.0.1:{port}/other")).status_code == 404


async def test_metrics_can_be_turned_off(database_url: str, tmp_path: Path) -> None:
    async with (
        server_process(database_url, tmp_path, METRICS_ENABLED="false") as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        assert_problem(await client.get("/metrics"), 404)
        assert (await client.get("/health")).status_code == 200


async def test_a_scrape_with_another_method_is_a_405_problem(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        server_process(database_url, tmp_path) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10) as client,
    ):
        answer = await client.post("/metrics")
        assert_problem(answer, 405)
        assert answer.headers["allow"] == "GET, HEAD"
