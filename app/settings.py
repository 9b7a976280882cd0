"""Service configuration, read from the environment (and an optional `.env` file)."""

import ipaddress
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.backend import Backend

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./data/evermirror.db"


def normalize_database_url(url: str) -> str:
    """Map the URL spellings people paste onto the async drivers we ship."""
    for prefix, replacement in (
        ("postgres://", "postgresql+asyncpg://"),
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgresql+psycopg://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(prefix):
            return replacement + url[len(prefix) :]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    # PostgreSQL behind a transaction pooler (PgBouncer's `pool_mode = transaction`):
    # DATABASE_URL names the pooler and this the database itself. What needs a session
    # of its own (the bus's LISTEN, runner leases held as session advisory locks,
    # migrations) connects here; statements through the pooler keep no prepared
    # statements and send no statement_timeout (a pooler refuses it at start-up).
    database_direct_url: str | None = None
    # Processes on one PostgreSQL carry their live traffic over NATS instead of
    # LISTEN/NOTIFY (app/live/nats_bus.py): nats://host:4222 (or tls://).
    bus_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    # None: migrate at start-up for SQLite (embedded), not for PostgreSQL (a deploy step).
    auto_migrate: bool | None = None
    # Public base URL used for self_url/view_url/ui_link; derived from the request when unset.
    public_url: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Prometheus metrics at GET /metrics: on the main port, or on a port of their own
    # (same host) when METRICS_PORT is set; METRICS_ENABLED=false turns them off.
    metrics_enabled: bool = True
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # `json`: one JSON object a line; `text`: for people. Unset: text when stderr is a
    # terminal, JSON otherwise (app/telemetry/logs.py).
    log_format: Literal["json", "text"] | None = None

    # PostgreSQL pool; SQLite ignores these. No overflow by default: an overflow
    # connection lives for one burst, and each new connection prepares the checkpoint
    # statements and introspects their types again (under 64 writers a pool of 10+10
    # spent more on that than a fixed pool of 10 spent waiting).
    db_pool_size: int = 10
    db_max_overflow: int = 0
    db_pool_timeout_seconds: float = 30.0
    db_statement_timeout_ms: int = 30_000
    # SQLite: how long a writer waits for the file lock held by another process.
    sqlite_busy_timeout_ms: int = 30_000

    # Memory for the newest pages and single messages of sessions, per process.
    page_cache_bytes: int = 64 * 1024 * 1024

    # Pagination limits.
    messages_page_default: int = 50
    messages_page_max: int = 200

    # Request guards: every bad input gets a problem+json answer and changes nothing.
    # Fixed field caps (titles, tags, labels, URLs) are in app/schemas.py and the
    # OpenAPI document; these are the configurable ones.
    max_body_bytes: int = 1_000_000
    # `POST /v1/sessions/import`: a session's JSON Lines export, read whole.
    max_import_bytes: int = 20_000_000
    max_message_parts: int = 100
    # Message text, context and base64 parts; session goal and system_prompt.
    max_text_chars: int = 200_000
    # Free-form JSON: metadata, hints, external_actor.metadata.
    max_json_depth: int = 16
    max_json_bytes: int = 32_768
    # A list response (sessions, messages, events) stops adding items once its data
    # would pass this many bytes (it always holds at least one item) and says where
    # the rest continues, so no request builds an unbounded response.
    max_list_bytes: int = 2_000_000
    # Token bucket per API key (per client address without a key, and in open mode);
    # 0 disables rate limiting.
    rate_limit_per_second: float = 100.0
    rate_limit_burst: int = 400
    # Requests whose credential is not a known key (each may cost a database lookup)
    # share this smaller budget per client address, however many keys they rotate.
    rate_limit_unknown_key_per_second: float = 1.0
    rate_limit_unknown_key_burst: int = 20
    # Reverse proxies (addresses or networks) whose X-Forwarded-For / -Proto headers are
    # believed; none by default, so a client cannot pick its own address.
    trusted_proxies: Annotated[list[str], NoDecode] = []
    # How many processes serve the API in total (all nodes, all workers). Rate limits
    # and the per-session stream limit are budgets for the whole service: each process
    # grants its share. Unset: the `--workers` of this `serve` (1 by default).
    expected_instances: int | None = Field(default=None, ge=1)
    # Slow clients: a request's header (from its first byte, or from the connection for
    # the first request) and then its body must arrive within these, or it is answered
    # 408 and the connection closed. Responses, streams included, are not timed.
    header_read_timeout_seconds: float = 10.0
    body_read_timeout_seconds: float = 10.0
    # How long an idle keep-alive connection stays open between requests. Longer than
    # the idle timeouts of clients' pools (httpx, browsers, the SDKs: 5 s or more) and
    # of load balancers (commonly 60 s): when the server closes first, a request the
    # client sent on the dying connection at that moment fails.
    keep_alive_seconds: float = Field(default=75.0, gt=0)
    # A request header larger than this is answered 431 (uvicorn sets no limit).
    max_header_bytes: int = 65_536
    # Browser origins allowed to call the API and open the streams (CORS); none by default.
    cors_origins: Annotated[list[str], NoDecode] = []

    # Key changes (created, revoked) reach every process at once: on PostgreSQL as a
    # NOTIFY, on SQLite by polling the keys table every `keys_poll_seconds`. A resolution
    # is also re-read after `auth_cache_seconds`, for changes made behind the service's
    # back (plain SQL on PostgreSQL).
    auth_cache_seconds: float = 60.0
    keys_poll_seconds: float = 0.25

    # Live streams.
    sse_heartbeat_seconds: float = 30.0
    sse_cycle_seconds: float = 300.0
    sse_retry_ms: int = 100
    sse_max_per_session: int = 50
    sse_max_per_process: int = 5000
    sse_queue_size: int = 1024
    # A client that stops reading is dropped once one write waits this long; it resumes
    # from its cursor when it reads again.
    sse_send_timeout_seconds: float = 30.0

    # Turn runner.
    model_driver: Literal["scripted", "openai"] = "scripted"
    scripted_delay_ms: int = 20
    # The demo tool `lookup` (app/runner/builtin_tools.py), which the scripted
    # scenarios call: offered to models of the scripted driver only, unless set.
    demo_tools: bool | None = None
    # MODEL_DRIVER=openai: any server speaking OpenAI's Chat Completions (OpenAI, vLLM,
    # Ollama, llama.cpp server, LM Studio, OpenRouter). Required then: OPENAI_BASE_URL
    # and OPENAI_MODEL; the key may be empty for local servers that want none.
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_model: str | None = None
    # One model request (connect, and each wait for the next chunk) may take this long.
    model_timeout_seconds: float = Field(default=60.0, gt=0)
    # Retries of a request that failed with 429, a 5xx, a timeout or a dropped
    # connection (the service's own, announced live; the client library's are off).
    model_max_retries: int = Field(default=3, ge=0, le=20)
    # One model step may stream at most this many characters (text, reasoning and tool
    # arguments together); past it the step stops and the turn fails (`model_error`),
    # keeping what was streamed.
    model_max_reply_chars: int = Field(default=1_000_000, ge=1_000, le=100_000_000)
    # One model step may ask for at most this many tool calls; one more fails the turn
    # (`model_error`) before any of them runs.
    model_max_tool_calls: int = Field(default=128, ge=1, le=10_000)
    # The model catalog (app/catalog): a JSON file of the models sessions and messages
    # may select; unset, the catalog is the configured driver's one model.
    models_file: str | None = None
    # The context size, in tokens, of the default model (and of a MODELS_FILE entry
    # that does not say): the budget the Composer fits history into
    # (app/runner/composer.py), the reply's share included.
    model_context_tokens: int = Field(default=128_000, ge=1_000, le=10_000_000)
    # Retention (app/sessions/retention.py): sessions without activity for this many
    # days are purged with their messages and events (unset: kept, unless a session's
    # own `expires_at` has passed). The purge runs every PURGE_INTERVAL_SECONDS on each
    # process, deleting PURGE_BATCH sessions per transaction.
    session_retention_days: int | None = Field(default=None, ge=1, le=36_500)
    purge_interval_seconds: float = Field(default=3600.0, gt=0)
    purge_batch: int = Field(default=200, ge=1, le=10_000)
    # PostgreSQL: how often a node sweeps for turns whose runner died, and how long a
    # runner must have gone without renewing its lease before another node takes the
    # turn over. The lease is renewed every fifth of it (at least once a second).
    runner_sweep_seconds: float = 5.0
    # The turns' units of work (reads, checkpoints) running at once in a process; the
    # rest of the pool stays for requests (app/db/admission.py).
    runner_db_slots: int = Field(default=2, ge=1, le=64)
    # How long a runner keeps trying to regain a lost lease, or to write a checkpoint
    # while the database is unavailable, before it gives the turn up.
    runner_outage_seconds: float = 60.0
    # Turns running at once: per organization (across every process) and per process.
    # A message that would start one more is answered 429; 0 disables a cap.
    max_running_turns_per_org: int = Field(default=100, ge=0)
    max_running_turns_per_process: int = Field(default=500, ge=0)
    # Graceful drain on SIGTERM: how long running turns may go on finishing (new turns
    # and streams are refused, open streams told to reconnect elsewhere at once) before
    # the rest are interrupted and handed to another process. An orchestrator's grace
    # period must be longer (compose's stop_grace_period, Kubernetes'
    # terminationGracePeriodSeconds): DRAIN_SECONDS + 10 leaves room for the rest of the
    # shutdown.
    drain_seconds: float = Field(default=20.0, ge=0)

    @field_validator("database_url")
    @classmethod
    def _normalize_url(cls, value: str) -> str:
        return normalize_database_url(value)

    @field_validator("database_direct_url")
    @classmethod
    def _normalize_direct_url(cls, value: str | None) -> str | None:
        return normalize_database_url(value) if value else None

    @field_validator("cors_origins", "trusted_proxies", mode="before")
    @classmethod
    def _split_list(cls, value: Any) -> Any:
        # CORS_ORIGINS=https://a.example,https://b.example
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for item in value:
            # An address or a network (10.0.0.0/8); raises ValueError otherwise.
            ipaddress.ip_network(item, strict=False)
        return value

    @field_validator("openai_base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value or None

    @field_validator("bus_url")
    @classmethod
    def _check_bus_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("nats://", "tls://")):
            raise ValueError("must be a nats:// or tls:// URL")
        return value or None

    @model_validator(mode="after")
    def _check_bus(self) -> "Settings":
        if self.bus_url and not self.backend.shared:
            raise ValueError(
                "BUS_URL needs DATABASE_URL on PostgreSQL: one process on SQLite has no"
                " other process to reach"
            )
        return self

    @model_validator(mode="after")
    def _check_direct_url(self) -> "Settings":
        if self.database_direct_url and not (
            self.backend.shared and Backend.of(self.database_direct_url).shared
        ):
            raise ValueError(
                "DATABASE_DIRECT_URL is the PostgreSQL database behind a pooler named"
                " by DATABASE_URL: both must be PostgreSQL URLs"
            )
        return self

    @model_validator(mode="after")
    def _check_driver(self) -> "Settings":
        if self.model_driver == "openai":
            for name in ("openai_base_url", "openai_model"):
                if not getattr(self, name):
                    raise ValueError(
                        f"{name.upper()} is required with MODEL_DRIVER=openai"
                    )
        return self

    @property
    def instances(self) -> int:
        """The processes sharing the service's budgets."""
        return self.expected_instances or 1

    @property
    def backend(self) -> Backend:
        """The deployment mode (app/backend.py), decided from `database_url`."""
        return Backend.of(self.database_url)

    @property
    def pooled(self) -> bool:
        """Whether DATABASE_URL is a transaction pooler (DATABASE_DIRECT_URL is set)."""
        return self.database_direct_url is not None

    @property
    def direct_url(self) -> str:
        """The database itself, for what holds a session: LISTEN, session advisory
        locks, migrations. DATABASE_URL when no pooler sits in front."""
        return self.database_direct_url or self.database_url

    @property
    def should_auto_migrate(self) -> bool:
        if self.auto_migrate is None:
            return self.backend is Backend.SQLITE
        return self.auto_migrate

    @property
    def runner_renew_seconds(self) -> float:
        """How often the node holding a runner lease renews it: start-up takes over the
        turns left unrenewed for two of these."""
        return min(max(self.runner_sweep_seconds / 5, 0.1), 1.0)


def describe_error(exc: ValidationError) -> str:
    """One line naming every setting that is wrong, as the environment spells it
    (`MODEL_DRIVER: Input should be 'scripted' or 'openai', got 'x'`): what start-up
    prints instead of pydantic's multi-line report."""
    problems = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]).upper()
        text = str(error["msg"]).removeprefix("Value error, ")
        if name:
            got = error.get("input")
            shown = f", got {got!r}" if isinstance(got, str | int | float) else ""
            problems.append(f"{name}: {text}{shown}")
        else:
            problems.append(text)
    return "; ".join(problems)


@lru_cache
def get_settings() -> Settings:
    return Settings()
