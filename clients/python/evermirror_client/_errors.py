"""The typed error of the client: a problem+json answer (RFC 9457) of the service."""

import json
from typing import Any

import httpx

# Statuses after which a stream is worth opening again: the service is busy, restarting
# or briefly unreachable. Any other refusal (401, 404, 400) will not change by waiting.
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


class EvermirrorError(Exception):
    """A failure status of the service, with the fields of its problem document."""

    def __init__(
        self,
        status: int,
        problem: dict[str, Any] | None = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        problem = problem or {}
        self.status = status
        self.title: str | None = problem.get("title")
        self.detail: str | None = problem.get("detail")
        self.code: str | None = problem.get("code")
        self.type: str | None = problem.get("type")
        self.instance: str | None = problem.get("instance")
        # A 422 names each offending field here ({loc, msg, type}).
        self.errors: list[dict[str, Any]] | None = problem.get("errors")
        self.problem = problem
        self.request_id = headers.get("x-request-id") if headers else None
        retry_after = headers.get("retry-after") if headers else None
        self.retry_after: int | None = (
            int(retry_after) if retry_after and retry_after.isdigit() else None
        )
        super().__init__(self.detail or self.title or f"HTTP {status}")

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE

    def __repr__(self) -> str:
        return f"EvermirrorError({self.status}, code={self.code!r}, detail={self.detail!r})"


def error_of(response: httpx.Response) -> EvermirrorError:
    """The error of a read failure response."""
    problem: dict[str, Any] = {}
    try:
        parsed = json.loads(response.content)
    except ValueError:
        if response.content:
            problem = {"title": response.text[:200]}
    else:
        if isinstance(parsed, dict):
            problem = parsed
    return EvermirrorError(response.status_code, problem, response.headers)
