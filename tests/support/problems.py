"""problem+json: what every error answer of the service is, checked in one place."""

import re
from http import HTTPStatus
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"
ERROR_TYPE_BASE = "https://docs.everruns.com/errors/"


def find_nulls(value: Any, path: str = "$") -> list[str]:
    """The JSON paths of every null in `value`."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in find_nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [n for i, v in enumerate(value) for n in find_nulls(v, f"{path}[{i}]")]
    return []


def assert_problem(
    response: httpx.Response,
    status: int,
    *,
    detail: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The response is problem+json with `title`, `status`, `code`, `type` and the
    `error` extension member, no null fields, and the optional members consistent
    with each other."""
    context = f"{response.request.method} {response.request.url} -> {response.status_code} {response.text}"
    assert response.status_code == status, context
    media_type = response.headers["content-type"].split(";")[0].strip()
    assert media_type == PROBLEM_JSON, context
    body = response.json()
    assert isinstance(body, dict), context
    assert body["title"] == HTTPStatus(status).phrase, context
    assert body["status"] == status, context
    assert find_nulls(body) == [], context
    assert "Traceback" not in response.text, context
    if "detail" in body:
        assert isinstance(body["detail"], str), context
        assert body["detail"], context
    # Every problem has a code and its type, and the `error` member the SDKs read.
    assert re.fullmatch(r"[a-z][a-z0-9_]*", body["code"]), context
    assert body["type"] == ERROR_TYPE_BASE + body["code"], context
    assert body["error"] == {
        "code": body["code"],
        "message": body.get("detail", body["title"]),
    }, context
    if "instance" in body:
        assert body["instance"] == response.request.url.path, context
    if detail is not None:
        assert body.get("detail") == detail, context
    if code is not None:
        assert body.get("code") == code, context
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"]), context
    return body


def assert_too_many(
    response: httpx.Response, *, detail: str | None = None, code: str | None = None
) -> int:
    """A 429 problem with a positive whole number of seconds in Retry-After; returns
    them."""
    assert_problem(response, 429, detail=detail, code=code)
    retry_after = response.headers.get("retry-after")
    assert retry_after is not None, response.headers
    assert retry_after.isdigit(), response.headers
    assert int(retry_after) >= 1, response.headers
    return int(retry_after)
