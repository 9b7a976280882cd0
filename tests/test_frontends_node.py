"""The frontends' own client code (tests/node's packages, installed by `make install`)
against a real server on each lane: ai-sdk.test.mjs reads turns through the AI SDK's
DefaultChatTransport and readUIMessageStream (every chunk checked by the SDK's schema),
resumes a cut stream, and answers an approval and a client-side tool; ag-ui.test.mjs
runs @ag-ui/client's HttpAgent through text, a frontend tool round trip and an
approval interrupt resumed."""

import os
import re
import shutil
import subprocess

import pytest

from tests.support.lanes import ROOT
from tests.support.servers import KeyedServer, keyed_server_fixture

pytestmark = pytest.mark.e2e

NODE_TESTS = ROOT / "tests" / "node"
keyed_server = keyed_server_fixture("frontends-node", SCRIPTED_DELAY_MS="20")


def test_the_frontends_own_clients(keyed_server: KeyedServer) -> None:
    node = shutil.which("node")
    assert node, "the frontend tests need Node.js >= 20 on PATH"
    files = sorted(p.name for p in NODE_TESTS.glob("*.test.mjs"))
    assert files == ["ag-ui.test.mjs", "ai-sdk.test.mjs"], files
    assert (NODE_TESTS / "node_modules" / "@ag-ui" / "client").is_dir(), (
        "tests/node has no node_modules: run `make install`"
    )
    env = {
        **os.environ,
        "EVERMIRROR_URL": keyed_server.url,
        "EVERMIRROR_KEY": keyed_server.api_key,
    }
    try:
        result = subprocess.run(
            [
                node,
                "--test",
                "--test-reporter=tap",
                "--test-timeout=60000",
                "--test-force-exit",
                *files,
            ],
            cwd=NODE_TESTS,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        printed = hung.stdout or b""
        text = (
            printed.decode(errors="replace") if isinstance(printed, bytes) else printed
        )
        pytest.fail(
            f"the frontend tests ran past 180 s; they printed:\n{text[-20000:]}"
        )
    report = f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", result.stdout, re.M))
    assert counts.get("fail") == "0", report
    assert counts.get("cancelled") == "0", report
    assert int(counts.get("pass", "0")) >= 7, report
