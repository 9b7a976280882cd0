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

from tests.conftest import LANES, PG_URL, ROOT

pytestmark = pytest.mark.e2e

JS = ROOT / "clients" / "js"


@pytest.mark.parametrize("lane", LANES)
def test_node_suite(lane: str) -> None:
    node = shutil.which("node")
    assert node, "the JavaScript client's tests need Node.js >= 18 on PATH"
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert int(version.lstrip("v").split(".")[0]) >= 18, version
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
    result = subprocess.run(
        [node, "--test", "--test-reporter=tap", *files],
        cwd=JS,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", result.stdout, re.M))
    assert counts.get("fail") == "0" and counts.get("cancelled") == "0", report
    assert int(counts.get("pass", "0")) >= 22, report
