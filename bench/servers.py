"""Processes the benchmark starts: the service, the baseline apps, load generators; CPU
pinning; scratch databases; API keys. Every process is registered so it is stopped at
exit, and every wait is bounded."""

import asyncio
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import asyncpg
import httpx

BENCH_ROOT = Path(__file__).resolve().parents[1]
SERVER_CORE = 1
LOAD_CORE = 0

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> tuple[str, list[str]]:
    """A process's name and the fields of /proc/PID/stat after it (state first)."""
    with open(f"/proc/{pid}/stat") as handle:
        head, _, rest = handle.read().rpartition(")")
    return head.partition("(")[2], rest.split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = _stat(pid)[1]
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have exited (wrk's, once
    it has been waited for)."""
    times = os.times()
    return times.children_user + times.children_system


def postgres_cpu_seconds() -> float | None:
    """User + system CPU time of every PostgreSQL process on this machine so far, those
    that exited included (their time is in the postmaster's children's): None where
    none is visible (a server elsewhere)."""
    total = 0
    seen = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            name, fields = _stat(entry)
        except OSError:
            continue  # gone meanwhile
        if name != "postgres":
            continue
        seen = True
        # utime, stime, cutime, cstime
        total += sum(int(v) for v in fields[11:15])
    return total / CLOCK_TICKS if seen else None


def core_times() -> dict[int, tuple[int, int]]:
    """Per core, (busy, total) jiffies so far, from /proc/stat."""
    times = {}
    with open("/proc/stat") as handle:
        for line in handle:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]  # idle + iowait
                times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def core_busy(before: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Each core's busy fraction since `before` (a `core_times()` reading)."""
    after = core_times()
    return {
        core: (after[core][0] - busy) / max(after[core][1] - total, 1)
        for core, (busy, total) in before.items()
    }


class BenchError(Exception):
    """A step that could not produce its figure; the row reports the message."""


# ---- pinning ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pinning:
    """Server (and baseline apps) on one core, load generators on the other, so the
    process under test never competes with the client measuring it."""

    enabled: bool
    reason: str = ""

    def _prefix(self, cores: str) -> list[str]:
        return ["taskset", "-c", cores] if self.enabled else []

    @property
    def server(self) -> list[str]:
        return self._prefix(str(SERVER_CORE))

    @property
    def load(self) -> list[str]:
        return self._prefix(str(LOAD_CORE))

    @property
    def all_cores(self) -> list[str]:
        # Children inherit the bench process's own affinity (the load core), so an
        # unpinned server has to be given every core explicitly.
        return self._prefix(f"0-{(os.cpu_count() or 1) - 1}")

    def describe(self) -> str:
        if not self.enabled:
            return f"no ({self.reason})"
        return f"yes (server core {SERVER_CORE}, load core {LOAD_CORE}, taskset)"


def detect_pinning(disabled: bool = False) -> Pinning:
    if disabled:
        return Pinning(False, "--no-pin")
    if shutil.which("taskset") is None:
        return Pinning(False, "taskset not found")
    if (os.cpu_count() or 1) < 2:
        return Pinning(False, "fewer than 2 cores")
    return Pinning(True)


def pin_self(pinning: Pinning) -> None:
    """The bench process itself is part of the load generator (probe, API calls)."""
    if pinning.enabled and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {LOAD_CORE})


def raise_fd_limit() -> None:
    """A thousand streams need more descriptors than the usual soft limit of 1,024;
    children (servers, load generators) inherit the raised limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def ensure_wrk() -> str:
    """wrk is the HTTP load generator; install it when missing and we may."""
    found = shutil.which("wrk")
    if found:
        return found
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "install", "-y", "-q", "wrk"],
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "wrk"],
        ):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    command, env=env, check=False, capture_output=True, timeout=300
                )
            found = shutil.which("wrk")
            if found:
                return found
    raise SystemExit(
        "wrk is required (the HTTP load generator) and could not be installed: "
        "install it with `apt-get install wrk` (or your package manager) and rerun."
    )


# ---- processes -------------------------------------------------------------------------


def free_port() -> int:
    """A bindable port picked at random below the kernel's ephemeral range (32768 up
    here), where no outgoing connection can take it before the server binds it; at
    random, because the kernel's sequential assignment collides with other runs."""
    for _ in range(200):
        port = random.randint(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise BenchError("no free port")


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    log: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.returncode is None

    def rss_kb(self) -> int:
        """VmRSS of the process itself (not its children), in kB."""
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise BenchError(f"cannot read the RSS of {self.name} (pid {self.pid})")

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self, within: float = 10.0) -> None:
        """SIGTERM to the process group we created for it (uvicorn's workers included),
        then SIGKILL if it lingers."""
        if self.alive():
            _signal_group(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), within)
            except TimeoutError:
                _signal_group(self.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), 5)
        # Workers of a supervisor that exited first are still in the group.
        _signal_group(self.pid, signal.SIGKILL)
        RUNNING.discard(self)

    def __hash__(self) -> int:
        return id(self)


RUNNING: set[Proc] = set()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_all() -> None:
    """Last resort at exit: every process group this run started, by its id."""
    for proc in list(RUNNING):
        _signal_group(proc.pid, signal.SIGKILL)
    RUNNING.clear()


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")


async def listening(port: int, within: float = 5.0) -> bool:
    """Whether something accepts connections on 127.0.0.1:port within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return True
    return False


async def spawn(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    stdin: int | None = subprocess.DEVNULL,
    stdout: int | None = None,
) -> Proc:
    handle = _open_log(log)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=stdout if stdout is not None else handle,
            stderr=handle,
            # Its own process group: stopping it reaches uvicorn's worker processes too,
            # and nothing else.
            start_new_session=True,
        )
    finally:
        handle.close()
    proc = Proc(name, process, log)
    RUNNING.add(proc)
    return proc


async def wait_healthy(proc: Proc, url: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise BenchError(
                    f"{proc.name} exited with {proc.process.returncode}: {proc.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    proc.url = url
                    return
            await asyncio.sleep(0.1)
    await proc.stop()
    raise BenchError(f"{proc.name} did not answer /health in {within:.0f} s")


def python_env(root: Path, **extra: str) -> dict[str, str]:
    """The venv's interpreter with `root` first on the path, so `app` (or `bench`)
    resolves to that checkout even where another one is installed editable."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = str(root)
    env.pop("PYTHONSTARTUP", None)
    return env


@dataclass
class ServiceConfig:
    app_root: Path
    database_url: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)


def service_env(config: ServiceConfig, **extra: str) -> dict[str, str]:
    return python_env(
        config.app_root,
        DATABASE_URL=config.database_url,
        RATE_LIMIT_PER_SECOND="0",
        LOG_LEVEL="warning",
        AUTO_MIGRATE="true",
        SSE_MAX_PER_SESSION="100000",
        SSE_MAX_PER_PROCESS="100000",
        SSE_QUEUE_SIZE="100000",
        # Longer than any measurement, so no stream is cycled in the middle of one.
        SSE_CYCLE_SECONDS="3600",
        **config.env,
        **extra,
    )


async def run_cli(
    config: ServiceConfig, *args: str, within: float = 120.0
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        cwd=config.app_root,
        env=service_env(config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), within)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BenchError(f"`python -m app {' '.join(args)}` timed out") from None
    return process.returncode or 0, out.decode(), err.decode()


async def create_api_key(config: ServiceConfig) -> str:
    """Migrate, then create one key: production runs with keys, so every request the
    bench sends is authenticated (`keys create` prints the key on its first line)."""
    code, _, err = await run_cli(config, "migrate")
    if code != 0:
        raise BenchError(f"migrate failed: {err.strip()[-500:]}")
    org = f"org_{uuid.uuid4().hex}"
    code, out, err = await run_cli(
        config, "keys", "create", "--org", org, "--name", "bench"
    )
    key = out.strip().splitlines()[0].strip() if out.strip() else ""
    if code != 0 or not key:
        raise BenchError(f"keys create failed: {err.strip()[-500:]}")
    return key


async def supports_workers(config: ServiceConfig) -> bool:
    code, out, _ = await run_cli(config, "serve", "--help", within=60)
    return code == 0 and "--workers" in out


async def start_service(
    config: ServiceConfig,
    name: str,
    pin: list[str],
    env: dict[str, str],
    workers: int | None = None,
) -> Proc:
    port = free_port()
    argv = [*pin, sys.executable, "-m", "app", "serve", "--port", str(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    proc = await spawn(
        name,
        argv,
        cwd=config.app_root,
        env=service_env(config, **env),
        log=config.log_dir / f"{name}-{port}.log",
    )
    await wait_healthy(proc, f"http://127.0.0.1:{port}", within=90)
    return proc


async def start_baseline(
    name: str, module: str, args: Sequence[str], pin: list[str], log_dir: Path
) -> Proc:
    port = free_port()
    argv = [*pin, sys.executable, "-m", module, "--port", str(port), *args]
    proc = await spawn(
        name,
        argv,
        cwd=BENCH_ROOT,
        env=python_env(BENCH_ROOT),
        log=log_dir / f"{name}-{port}.log",
    )
    await wait_healthy(proc, f"http://127.0.0.1:{port}")
    return proc


def app_location(app_root: Path) -> str:
    """Where `import app` resolves for the service processes (a check that --app-root
    is what gets benchmarked)."""
    result = subprocess.run(
        [sys.executable, "-c", "import app; print(app.__file__)"],
        cwd=app_root,
        env=python_env(app_root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.stdout.strip() or result.stderr.strip()[-200:]


def git_revision(root: Path) -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    revision = result.stdout.strip() or "unknown"
    return revision + ("+dirty" if dirty.stdout.strip() else "")


# ---- scratch databases -----------------------------------------------------------------


def asyncpg_dsn(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"postgresql://{rest}" if sep and scheme.startswith("postgres") else url


def with_database(url: str, name: str) -> str:
    head, _, tail = url.rpartition("/")
    query = tail.partition("?")[2]
    return f"{head}/{name}" + (f"?{query}" if query else "")


@dataclass
class ScratchPostgres:
    """A database of our own on the admin URL's server, dropped at the end."""

    admin_url: str
    name: str = field(default_factory=lambda: f"evm_bench_{uuid.uuid4().hex[:12]}")

    @property
    def url(self) -> str:
        return with_database(asyncpg_dsn(self.admin_url), self.name)

    async def _admin(self, statement: str) -> None:
        conn = await asyncio.wait_for(asyncpg.connect(asyncpg_dsn(self.admin_url)), 15)
        try:
            await asyncio.wait_for(conn.execute(statement), 60)
        finally:
            await conn.close()

    async def create(self) -> str:
        await self._admin(f'CREATE DATABASE "{self.name}"')
        return self.url

    async def drop(self) -> None:
        with contextlib.suppress(Exception):
            await self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
