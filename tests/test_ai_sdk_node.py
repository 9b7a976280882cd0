"""The AI SDK's own code (the `ai` package of tests/node, installed by `make install`)
against a real server on each lane: tests/node/ai-sdk.test.mjs reads turns through
DefaultChatTransport and readUIMessageStream (every chunk checked by the SDK's schema),
resumes a cut stream, and answers an approval and a client-side tool."""

import os
import re
import shutil
import subprocess

import pytest

from tests.support.lanes import ROOT
from tests.support.servers import KeyedServer, keyed_server_fixture

pytestmark = pytest.mark.e2e

NODE_TESTS = ROOT / "tests" / "node"
keyed_server = keyed_server_fixture("ai-sdk-node", SCRIPTED_DELAY_MS="20")


def test_the_ai_sdk_reads_and_resumes_chats(keyed_server: KeyedServer) -> None:
    node = shutil.which("node")
    assert node, "the AI SDK tests need Node.js >= 20 on PATH"
    assert (NODE_TESTS / "node_modules" / "ai").is_dir(), (
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
                "ai-sdk.test.mjs",
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
        pytest.fail(f"the AI SDK tests ran past 180 s; they printed:\n{text[-20000:]}")
    report = f"{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", result.stdout, re.M))
    assert counts.get("fail") == "0", report
    assert counts.get("cancelled") == "0", report
    assert int(counts.get("pass", "0")) >= 4, report
