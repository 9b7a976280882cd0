"""The JavaScript client's own tests (clients/js/test, `node --test`) on each lane, so
`make test` and both database lanes include them. Each test file starts its own
server: on a scratch PostgreSQL database beside TEST_DATABASE_URL on the PostgreSQL
lane, on a SQLite file otherwise (clients/js/test/server.js)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.lanes import LANES, PG_URL, ROOT

pytestmark = pytest.mark.e2e

JS = ROOT / "clients" / "js"


@pytest.mark.parametrize("lane", LANES)
def test_node_suite(lane: str) -> None:
    node = shutil.which("node")
    # The client runs on Node 18; its test runner's flags below need 20.14.
    assert node, "the JavaScript client's tests need Node.js >= 20.14 on PATH"
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout
    major, minor = (int(n) for n in version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (20, 14), version
    env = {
        **os.environ,
        "EVERMIRROR_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("TEST_DATABASE_URL", None)
    if lane == "postgresql":
        assert PG_URL is not None
        env["TEST_DATABASE_URL"] = PG_URL
    files = sorted(str(p.relative_to(JS)) for p in (JS / "test").glob("*.test.js"))
    assert files, "no test files under clients/js/test"
    # Each test has its own timeout and the runner exits once the tests end, even if a
    # handle stays open; a hang of the whole run still reports what it printed.
    command = [node, "--test", "--test-reporter=tap", "--test-timeout=90000"]
    try:
        result = subprocess.run(
            [*command, "--test-force-exit", *files],
            cwd=JS,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        printed = hung.stdout or b""
        text = (
            printed.decode(errors="replace") if isinstance(printed, bytes) else printed
        )
        pytest.fail(f"the Node suite ran past 240 s; it printed:\n{text[-20000:]}")
    report = f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", result.stdout, re.M))
    assert counts.get("fail") == "0", report
    assert counts.get("cancelled") == "0", report
    assert int(counts.get("pass", "0")) >= 22, report
