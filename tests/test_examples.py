"""examples/: the curl, Node and Python examples each run one turn against a real
server (with an API key, which each must send) and print the reply; the browser page
is checked to load the JavaScript client and to render only as text."""

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.lanes import ROOT
from tests.support.servers import KeyedServer, keyed_server_fixture

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples"
keyed_server = keyed_server_fixture("examples")


def run_example(server: KeyedServer, *command: str) -> str:
    """Runs an example with the server's address and key; its stdout."""
    result = subprocess.run(
        command,
        cwd=ROOT,
        env={
            **os.environ,
            "BASE_URL": server.url,
            "API_KEY": server.api_key,
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
    return result.stdout


def assert_turn(output: str, text: str) -> None:
    """The example printed its session, the reply as it streamed, then the reply."""
    lines = output.splitlines()
    assert re.fullmatch(r"session: session_[0-9a-f]{32}", lines[0]), output
    assert lines[-1] == f"agent: {text}", output
    # The streamed reply, printed piece by piece, adds up to the committed one.
    assert lines[-2] == text, output


def test_curl_example(keyed_server: KeyedServer) -> None:
    for tool in ("curl", "jq", "bash"):
        assert shutil.which(tool), f"the curl example needs {tool}"
    output = run_example(
        keyed_server, "bash", str(EXAMPLES / "curl.sh"), "hello from curl"
    )
    assert_turn(output, "hello from curl")


def test_node_example(keyed_server: KeyedServer) -> None:
    node = shutil.which("node")
    assert node, "the Node example needs Node.js >= 18"
    output = run_example(
        keyed_server, node, str(EXAMPLES / "node.mjs"), "hello from node"
    )
    assert_turn(output, "hello from node")


def test_python_example(keyed_server: KeyedServer) -> None:
    output = run_example(
        keyed_server,
        sys.executable,
        str(EXAMPLES / "python_client.py"),
        "hello from python",
    )
    assert_turn(output, "hello from python")


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.modules: list[str] = []
        self._in_module = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_module = tag == "script" and ("type", "module") in attrs

    def handle_data(self, data: str) -> None:
        if self._in_module:
            self.modules.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in_module = False


def test_browser_page_loads_the_client(tmp_path: Path) -> None:
    page = EXAMPLES / "browser.html"
    parser = _Scripts()
    parser.feed(page.read_text())
    [script] = parser.modules
    # The client by relative import, resolved as a browser would from the page's URL.
    imports = re.findall(r'import \{([^}]*)\} from "([^"]+)"', script)
    assert len(imports) == 1, imports
    names, target = imports[0]
    module = (page.parent / target).resolve()
    assert module == ROOT / "clients/js/src/index.js"
    node = shutil.which("node")
    assert node, "needs Node.js >= 18"
    # The script parses as a module, and what it imports is exported.
    source = tmp_path / "page.mjs"
    source.write_text(script)
    check = subprocess.run(
        [node, "--check", str(source)], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stderr
    wanted = [name.strip() for name in names.split(",")]
    exported = subprocess.run(
        [
            node,
            "--input-type=module",
            "-e",
            f"const m = await import({str(module)!r}); "
            f"console.log({wanted!r}.filter((n) => !(n in m)).join(','))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.strip() == "", f"not exported: {exported.stdout}"
    # What it renders is set as text, never parsed as HTML.
    assert not re.search(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", script
    )
    assert "textContent" in script


# The manual's page holding the clients section.
STREAMS_DOC = ROOT / "docs/streams.md"


def clients_snippet(language: str) -> str:
    """The first `language` code block of the clients section of docs/streams.md."""
    page = STREAMS_DOC.read_text()
    heading = re.search(r"^#+ The clients", page, re.MULTILINE)
    assert heading, "no clients section in docs/streams.md"
    section = page[heading.start() :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert match, f"no {language} snippet in the clients section of docs/streams.md"
    return match.group(1)


def test_client_snippets_run(keyed_server: KeyedServer, tmp_path: Path) -> None:
    """The client snippets of docs/streams.md run as printed (only the address, the key
    and a `render` function are supplied), so the documentation cannot drift from the
    API."""
    js = clients_snippet("js").replace("http://127.0.0.1:8000", keyed_server.url)
    index = (ROOT / "clients/js/src/index.js").as_uri()
    js = js.replace('from "evermirror-client"', f'from "{index}"')
    script = tmp_path / "snippet.mjs"
    script.write_text(
        "const apiKey = process.env.API_KEY;\nconst render = () => {};\n"
        f"{js}\nsub.close();\nview.close();\n"
        "console.log(`ok ${page.items.length} ${view.messages.length}`);\n"
    )
    node = shutil.which("node")
    assert node, "needs Node.js >= 18"
    assert run_example(keyed_server, node, str(script)).splitlines()[-1] == "ok 2 2"

    python = clients_snippet("python").replace(
        "http://127.0.0.1:8000", keyed_server.url
    )
    body = "\n".join(f"    {line}" for line in python.splitlines())
    program = tmp_path / "snippet.py"
    program.write_text(
        "import asyncio\nimport os\n\n\nasync def main() -> None:\n"
        '    key = os.environ["API_KEY"]\n'
        f"{body}\n    print('ok', len(messages), page.total)\n\n\nasyncio.run(main())\n"
    )
    output = run_example(keyed_server, sys.executable, str(program)).splitlines()
    assert output[-2:] == ["message", "ok 2 2"], output


@pytest.mark.parametrize(
    ("example", "first_line"),
    [("ai_sdk.mjs", "chat: example-"), ("ag_ui.mjs", "thread: example-")],
)
def test_frontend_examples(
    keyed_server: KeyedServer, example: str, first_line: str
) -> None:
    """Run as a user who installed `ai` or `@ag-ui/client` would: resolved from
    tests/node's packages (module code read from stdin resolves its imports from the
    working directory)."""
    node = shutil.which("node")
    assert node, "the frontend examples need Node.js >= 20"
    source = (EXAMPLES / example).read_text()
    result = subprocess.run(
        [node, "--input-type=module", "-", "hello from a frontend"],
        input=source,
        cwd=ROOT / "tests" / "node",
        env={
            **os.environ,
            "BASE_URL": keyed_server.url,
            "API_KEY": keyed_server.api_key,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert lines[0].startswith(first_line), result.stdout
    assert lines[-2] == "hello from a frontend", result.stdout
    assert lines[-1] == "agent: hello from a frontend", result.stdout
