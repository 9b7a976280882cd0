"""Structured logs for the service's loggers and uvicorn's: `LOG_FORMAT=json` writes one
JSON object a line, `text` a line for people; unset, text on a terminal and JSON
otherwise (a container, a pipe, a log collector).

Every line names the request, session and turn it belongs to where they are known.
They travel in context variables: the request middleware sets the request id and the
session of the path, the turn runner the session and turn it runs. A record can also
carry them itself (`extra={"request_id": ...}`), which wins. uvicorn's access log is
written inside the request's task, so it carries the request id too.

One uvicorn record is dropped: "ASGI callable returned without completing response"
for a stream the service ended on purpose (a client that stopped reading, see
app/live/response.py), which marks that case in `ABANDONED` before it returns.
"""

import logging
import logging.config
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import unquote

import orjson

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
SESSION_ID: ContextVar[str | None] = ContextVar("session_id", default=None)
TURN_ID: ContextVar[str | None] = ContextVar("turn_id", default=None)
CONTEXT = (("request_id", REQUEST_ID), ("session_id", SESSION_ID), ("turn_id", TURN_ID))

# Set in a request's task when the service gives up on a response it started (a stuck
# stream): uvicorn then closes the connection, which is what should happen, and would
# also log an error about it, which it is not.
ABANDONED: ContextVar[bool] = ContextVar("abandoned_response", default=False)
INCOMPLETE_RESPONSE = "ASGI callable returned without completing response."

ACCESS_LOGGER = "uvicorn.access"

LogFormat = Literal["json", "text"]


def context_of(record: logging.LogRecord) -> dict[str, str]:
    """The request, session and turn of a record: its own, else the context's."""
    found: dict[str, str] = {}
    for name, variable in CONTEXT:
        value = getattr(record, name, None) or variable.get()
        if value:
            found[name] = str(value)
    return found


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: timestamp (UTC, ms), level, logger, message, the
    request/session/turn ids where known, an access line's client, method, path and
    status, and an exception's traceback as text."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "timestamp": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(context_of(record))
        if (
            record.name == ACCESS_LOGGER
            and isinstance(record.args, tuple)
            and len(record.args) == 5
        ):
            # uvicorn's access record: (client, method, path, http version, status).
            client, method, path, _version, status = record.args
            line.update(client=client, method=method, path=path, status=status)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger> <message>`, then `request_id=… session_id=… turn_id=…`
    where known."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        context = context_of(record)
        if not context:
            return text
        tags = " ".join(f"{name}={value}" for name, value in context.items())
        head, newline, rest = text.partition("\n")
        return f"{head} {tags}{newline}{rest}"


class AbandonedResponseFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (ABANDONED.get() and record.msg == INCOMPLETE_RESPONSE)


# Query parameters whose values an access line does not repeat: a credential put in
# the URL by mistake (`?api_key=`, `?token=`) must not end up in the logs.
SECRET_PARAMETER = re.compile(r"(?i)key|token|secret|password|auth|signature")


def redacted(path: str) -> str:
    """`path` with the values of its secret-looking query parameters replaced."""
    base, mark, query = path.partition("?")
    if not mark:
        return path
    fields = []
    for field in query.split("&"):
        name, equals, _value = field.partition("=")
        secret = equals and SECRET_PARAMETER.search(unquote(name))
        fields.append(f"{name}=[redacted]" if secret else field)
    return base + "?" + "&".join(fields)


class RedactedQueryFilter(logging.Filter):
    """Access lines with secret-looking query values redacted (see `redacted`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], redacted(args[2]), args[3], args[4])
        return True


def resolve_format(log_format: LogFormat | None) -> LogFormat:
    if log_format is not None:
        return log_format
    return "text" if sys.stderr.isatty() else "json"


def logging_config(level: str, log_format: LogFormat | None) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the whole process, uvicorn's loggers included
    (`serve` hands it to uvicorn as `log_config`, so `--workers` processes configure
    themselves alike). Everything goes to stderr at `level`."""
    formatter = (
        "JsonFormatter" if resolve_format(log_format) == "json" else "TextFormatter"
    )
    level = level.upper()
    quiet = {"level": "WARNING"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "abandoned": {"()": f"{__name__}.AbandonedResponseFilter"},
            "redacted": {"()": f"{__name__}.RedactedQueryFilter"},
        },
        "formatters": {"service": {"()": f"{__name__}.{formatter}"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "service",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            # uvicorn's own handlers would write its lines in its own format.
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {
                "level": level,
                "handlers": [],
                "propagate": True,
                "filters": ["abandoned"],
            },
            ACCESS_LOGGER: {
                "level": level,
                "handlers": [],
                "propagate": True,
                "filters": ["redacted"],
            },
            # Chatter: alembic lists its plugins at every run; httpx logs every
            # request of the CLI's client (`tail`).
            "alembic.runtime.plugins": quiet,
            "httpx": quiet,
            "httpcore": quiet,
        },
    }


def configure(level: str, log_format: LogFormat | None) -> dict[str, Any]:
    """Configure this process's logging; returns the configuration (for uvicorn)."""
    config = logging_config(level, log_format)
    logging.config.dictConfig(config)
    return config


def access_logged() -> bool:
    """Whether uvicorn writes access lines, so requests should tag their context."""
    return logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.INFO)
