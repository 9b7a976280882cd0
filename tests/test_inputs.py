"""Every bad input is a clear 4xx problem+json that changes nothing: one regression test
per input finding of the adversarial review (issue 8) — lone surrogates, integers past
64 bits, NaN and Infinity, out-of-range dates, non-ASCII cursors, the scripted model's
`/scenario long ²` — and the one validation layer (app/schemas.py) behind them."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import orjson
import pytest

from app.db.session import Database
from app.runner.drivers.base import TextDelta, Turn
from app.runner.drivers.scripted import (
    LONG_DEFAULT,
    LONG_MAX,
    ScriptedDriver,
    long_count,
)
from app.schemas import MAX_INT64, MIN_INT64, check_value
from app.settings import Settings
from tests.support.api import create_session, list_events, post_message
from tests.support.database import table_rows
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.waits import wait_idle

JSON = {"Content-Type": "application/json"}
HEX32 = "0123456789abcdef0123456789abcdef"


@dataclass
class Api:
    """The app in process with one idle session that has had a turn."""

    client: httpx.AsyncClient
    database: Database
    sid: str

    async def unchanged(
        self,
        method: str,
        url: str,
        *,
        content: bytes | str | None = None,
        json: Any = None,
        params: Any = None,
        headers: dict[str, str | bytes] | None = None,
    ) -> httpx.Response:
        """Send one request; assert that it changed no row of any table."""
        before = await table_rows(self.database)
        if content is not None:
            headers = {**JSON, **(headers or {})}
        response = await asyncio.wait_for(
            self.client.request(
                method,
                url,
                content=content,
                json=json,
                params=params,
                # A bytes value is sent as it is (httpx's types say str).
                headers=cast(Any, headers),
            ),
            20,
        )
        assert await table_rows(self.database) == before, (
            f"{method} {url} -> {response.status_code} changed the database"
        )
        return response


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    # Streams that cycle quickly, so that a stream a test opens by mistake ends.
    quick = make_settings(
        settings.database_url, sse_cycle_seconds=0.2, sse_heartbeat_seconds=0.05
    )
    async with running_app(quick) as running:
        client = running.client
        sid = await create_session(client, "inputs")
        await post_message(client, sid, "hello")
        await wait_idle(client, sid)
        yield Api(client, running.app.state.app.database, sid)


def field_errors(problem: dict[str, Any]) -> set[str]:
    """The dotted locations (after `body`/`query`) of a problem's field errors."""
    return {".".join(e["loc"][1:]) for e in problem.get("errors", ())}


# ---- strings: lone surrogates and NUL, in every string a body can carry ---------------


def body_with(kind: str, value: str) -> tuple[str, str, str]:
    """(method, path template, JSON text) of a body that carries `value` (raw JSON
    string content, e.g. `\\ud800`) in the field `kind` names."""
    message = "/v1/sessions/{sid}/messages"

    def msg(*, part: str = '{"type":"text","text":"ok"}', extra: str = "") -> str:
        return '{"message":{"content":[' + part + "]}" + extra + "}"

    bodies: dict[str, tuple[str, str, str]] = {
        "message.content.0.text.text": (
            "POST",
            message,
            msg(part='{"type":"text","text":"a' + value + 'b"}'),
        ),
        "message.content.0.context.context": (
            "POST",
            message,
            msg(part='{"type":"context","tag":"doc","context":"' + value + '"}'),
        ),
        "message.content.0.image.url": (
            "POST",
            message,
            msg(part='{"type":"image","url":"https://x.example/' + value + '"}'),
        ),
        "message.content.0.image.media_type": (
            "POST",
            message,
            msg(part='{"type":"image","base64":"AA==","media_type":"' + value + '"}'),
        ),
        "message.content.0.image.base64": (
            "POST",
            message,
            msg(part='{"type":"image","base64":"' + value + '"}'),
        ),
        "message.content.0.file.filename": (
            "POST",
            message,
            msg(
                part='{"type":"file","file_id":"file_'
                + HEX32
                + '","filename":"'
                + value
                + '"}'
            ),
        ),
        "message.role": (
            "POST",
            message,
            '{"message":{"role":"'
            + value
            + '","content":[{"type":"text","text":"x"}]}}',
        ),
        "metadata.k": ("POST", message, msg(extra=',"metadata":{"k":"' + value + '"}')),
        "metadata.k" + value: (
            "POST",
            message,
            msg(extra=',"metadata":{"k' + value + '":1}'),
        ),
        "tags.1": ("POST", message, msg(extra=',"tags":["ok","' + value + '"]')),
        "controls.locale": (
            "POST",
            message,
            msg(extra=',"controls":{"locale":"' + value + '"}'),
        ),
        "controls.speed": (
            "POST",
            message,
            msg(extra=',"controls":{"speed":"' + value + '"}'),
        ),
        "controls.hints.a.0": (
            "POST",
            message,
            msg(extra=',"controls":{"hints":{"a":["' + value + '"]}}'),
        ),
        "external_actor.actor_id": (
            "POST",
            message,
            msg(extra=',"external_actor":{"actor_id":"' + value + '","source":"s"}'),
        ),
        "external_actor.source": (
            "POST",
            message,
            msg(extra=',"external_actor":{"actor_id":"a","source":"' + value + '"}'),
        ),
        "external_actor.actor_name": (
            "POST",
            message,
            msg(
                extra=',"external_actor":{"actor_id":"a","source":"s","actor_name":"'
                + value
                + '"}'
            ),
        ),
        "external_actor.metadata.team": (
            "POST",
            message,
            msg(
                extra=',"external_actor":{"actor_id":"a","source":"s",'
                '"metadata":{"team":"' + value + '"}}'
            ),
        ),
        "client_message_id": (
            "POST",
            message,
            msg(extra=',"client_message_id":"c' + value + '"'),
        ),
    }
    for field in (
        "title",
        "locale",
        "goal",
        "system_prompt",
        "agent_name",
        "harness_name",
    ):
        bodies[field] = ("POST", "/v1/sessions", '{"' + field + '":"' + value + '"}')
    bodies["session.tags.0"] = ("POST", "/v1/sessions", '{"tags":["' + value + '"]}')
    bodies["session.metadata.k." + value] = (
        "POST",
        "/v1/sessions",
        '{"metadata":{"k":{"' + value + '":true}}}',
    )
    bodies["session.hints.h"] = (
        "POST",
        "/v1/sessions",
        '{"hints":{"h":"' + value + '"}}',
    )
    for field in ("title", "goal", "locale"):
        bodies["patch." + field] = (
            "PATCH",
            "/v1/sessions/{sid}",
            '{"' + field + '":"' + value + '"}',
        )
    bodies["patch.tags.0"] = (
        "PATCH",
        "/v1/sessions/{sid}",
        '{"tags":["' + value + '"]}',
    )
    return bodies[kind]


STRING_FIELDS = [
    "message.content.0.text.text",
    "message.content.0.context.context",
    "message.content.0.image.url",
    "message.content.0.image.media_type",
    "message.content.0.image.base64",
    "message.content.0.file.filename",
    "message.role",
    "metadata.k",
    "tags.1",
    "controls.locale",
    "controls.speed",
    "controls.hints.a.0",
    "external_actor.actor_id",
    "external_actor.source",
    "external_actor.actor_name",
    "external_actor.metadata.team",
    "client_message_id",
    "title",
    "locale",
    "goal",
    "system_prompt",
    "agent_name",
    "harness_name",
    "session.tags.0",
    "session.hints.h",
    "patch.title",
    "patch.goal",
    "patch.locale",
    "patch.tags.0",
]
BAD_STRINGS = [
    ("\\ud800", "must not contain a lone surrogate (U+D800 to U+DFFF)"),
    ("\\udfff", "must not contain a lone surrogate (U+D800 to U+DFFF)"),
    ("\\u0000", "must not contain NUL (U+0000)"),
]


def field_name(kind: str) -> str:
    """The name a problem gives the field `kind` stands for."""
    for prefix in ("session.", "patch."):
        kind = kind.removeprefix(prefix)
    return kind


@pytest.mark.parametrize(("value", "message"), BAD_STRINGS, ids=["d800", "dfff", "nul"])
@pytest.mark.parametrize("kind", STRING_FIELDS)
async def test_unstorable_string_is_422_naming_the_field(
    api: Api, kind: str, value: str, message: str
) -> None:
    method, path, content = body_with(kind, value)
    url = path.format(sid=api.sid)
    response = await api.unchanged(method, url, content=content)
    problem = assert_problem(response, 422, code="validation_error")
    name = field_name(kind)
    assert problem["detail"] == f"{name}: {message}", problem
    assert name in field_errors(problem), problem


@pytest.mark.parametrize(
    "kind",
    ["metadata.k" + "\\ud800", "session.metadata.k.\\ud800"],
    ids=["message", "session"],
)
async def test_surrogate_in_an_object_key_is_named_escaped(api: Api, kind: str) -> None:
    """The key itself is the offending value: echoed as an escape, never as a lone
    surrogate (the error body could not be encoded)."""
    method, path, content = body_with(kind, "\\ud800")
    response = await api.unchanged(method, path.format(sid=api.sid), content=content)
    problem = assert_problem(response, 422, code="validation_error")
    assert "\\ud800: must not contain a lone surrogate" in problem["detail"], problem


async def test_surrogate_encoded_as_raw_bytes_is_422(api: Api) -> None:
    """UTF-8 bytes of a surrogate (ED A0 80) decode to one as well."""
    content = b'{"message":{"content":[{"type":"text","text":"a\xed\xa0\x80b"}]}}'
    response = await api.unchanged(
        "POST", f"/v1/sessions/{api.sid}/messages", content=content
    )
    problem = assert_problem(response, 422, code="validation_error")
    assert problem["detail"].startswith("message.content.0.text.text: "), problem


async def test_valid_non_ascii_text_is_stored_unchanged(api: Api) -> None:
    text = "Привіт \N{GRINNING FACE} 中文 \u200d"
    created = await post_message(api.client, api.sid, text)
    assert created["content"][0]["text"] == text
    await wait_idle(api.client, api.sid)


# ---- integers beyond 64 bits and non-finite numbers -------------------------------------


def json_number_bodies(number: str) -> list[tuple[str, str, str, str]]:
    """(method, path, JSON text, field) bodies carrying `number` (as JSON text) in each
    free-form JSON field."""
    message = "/v1/sessions/{sid}/messages"
    text = '{"message":{"content":[{"type":"text","text":"x"}]}'
    return [
        ("POST", "/v1/sessions", '{"metadata":{"n":' + number + "}}", "metadata.n"),
        ("POST", "/v1/sessions", '{"hints":{"n":[1,' + number + "]}}", "hints.n.1"),
        ("POST", message, text + ',"metadata":{"n":' + number + "}}", "metadata.n"),
        (
            "POST",
            message,
            text + ',"controls":{"hints":{"n":{"m":' + number + "}}}}",
            "controls.hints.n.m",
        ),
        (
            "POST",
            message,
            text
            + ',"external_actor":{"actor_id":"a","source":"s","metadata":{"n":'
            + number
            + "}}}",
            "external_actor.metadata.n",
        ),
    ]


# Past signed 64 bits: integers, and floats too (PostgreSQL's jsonb prints 1e19 as
# the integer 10000000000000000000, which no longer renders).
BIG_NUMBERS = [
    str(2**63),
    str(-(2**63) - 1),
    str(2**64),
    "1" + "0" * 40,
    "1e19",
    "-1.5e300",
    "9.3e18",
]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]


@pytest.mark.parametrize("number", BIG_NUMBERS)
async def test_number_beyond_64_bits_in_json_is_422(api: Api, number: str) -> None:
    for method, path, content, field in json_number_bodies(number):
        response = await api.unchanged(
            method, path.format(sid=api.sid), content=content
        )
        problem = assert_problem(response, 422, code="validation_error")
        assert problem["detail"] == (
            f"{field}: must be a number from {MIN_INT64} to {MAX_INT64}"
        ), problem


@pytest.mark.parametrize("number", NON_FINITE)
async def test_nan_and_infinity_in_json_are_422_not_stored_as_null(
    api: Api, number: str
) -> None:
    for method, path, content, field in json_number_bodies(number):
        response = await api.unchanged(
            method, path.format(sid=api.sid), content=content
        )
        problem = assert_problem(response, 422, code="validation_error")
        assert problem["detail"] == (
            f"{field}: must be a finite number, not NaN or Infinity"
        ), problem


async def test_numbers_at_the_64_bit_bounds_round_trip(api: Api) -> None:
    """Read back from the database on both lanes (the session's attributes are jsonb
    on PostgreSQL), not only echoed."""
    metadata = {
        "max": MAX_INT64,
        "min": MIN_INT64,
        "big": 1.5e18,
        "tiny": -5e-324,
        "tenth": 0.1,
    }
    response = await api.client.post(
        "/v1/sessions", json={"metadata": metadata, "hints": {"n": MAX_INT64}}
    )
    assert response.status_code == 201, response.text
    fetched = (await api.client.get(f"/v1/sessions/{response.json()['id']}")).json()
    assert fetched["metadata"] == metadata
    assert fetched["hints"] == {"n": MAX_INT64}


@pytest.mark.parametrize("value", [0, 1001, 2**63, 2**64, 10**30, -1])
async def test_max_iterations_out_of_range_is_422(api: Api, value: int) -> None:
    content = '{"max_iterations": ' + str(value) + "}"
    response = await api.unchanged("POST", "/v1/sessions", content=content)
    problem = assert_problem(response, 422, code="validation_error")
    assert field_errors(problem) == {"max_iterations"}, problem


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400", "2.5"])
async def test_max_iterations_that_is_not_a_whole_finite_number_is_422(
    api: Api, value: str
) -> None:
    response = await api.unchanged(
        "POST", "/v1/sessions", content='{"max_iterations": ' + value + "}"
    )
    problem = assert_problem(response, 422, code="validation_error")
    assert field_errors(problem) == {"max_iterations"}, problem


async def test_max_iterations_at_its_bounds_is_accepted(api: Api) -> None:
    for value in (1, 1000):
        response = await api.client.post("/v1/sessions", json={"max_iterations": value})
        assert response.status_code == 201, response.text
        assert response.json()["max_iterations"] == value


async def test_number_longer_than_the_parser_takes_is_400_malformed(api: Api) -> None:
    """Python's JSON parser refuses integers over 4,300 digits: malformed, not 500."""
    content = '{"metadata": {"n": 1' + "0" * 5000 + "}}"
    response = await api.unchanged("POST", "/v1/sessions", content=content)
    assert_problem(response, 400, detail="Malformed JSON body", code="invalid_json")


def test_check_value_walks_json_deeper_than_the_recursion_limit() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    assert check_value(deep) is deep
    deep_bad: Any = float("nan")
    for _ in range(5000):
        deep_bad = {"k": deep_bad}
    with pytest.raises(ValueError, match="finite number"):
        check_value(deep_bad)


# ---- dates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        "0001-01-01T00:30:00+23:59",
    ],
)
async def test_timestamp_outside_the_utc_range_is_400_not_500(
    api: Api, value: str
) -> None:
    for name in ("created_after", "created_before"):
        response = await api.unchanged("GET", "/v1/sessions", params={name: value})
        problem = assert_problem(response, 400, code="invalid_parameter")
        assert problem["detail"] == f"{name}: out of range: years 1 to 9999 in UTC"


@pytest.mark.parametrize(
    "value", ["٢٠٢٤-٠١-٠١T00:00:00Z", "2024-01-01T00:00:00", "2024-13-01T00:00:00Z"]
)
async def test_timestamp_in_other_digits_or_without_offset_is_400(
    api: Api, value: str
) -> None:
    response = await api.unchanged(
        "GET", "/v1/sessions", params={"created_after": value}
    )
    problem = assert_problem(response, 400, code="invalid_parameter")
    assert problem["detail"].startswith("created_after: "), problem


async def test_timestamps_at_the_edges_of_the_range_are_served(api: Api) -> None:
    response = await api.client.get(
        "/v1/sessions",
        params={
            "created_after": "0001-01-01T00:00:00Z",
            "created_before": "9999-12-31T23:59:59.999999+00:00",
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["total"] == 1


# ---- cursors -------------------------------------------------------------------------------


BAD_CURSORS = [
    ("²", "after: expected a non-negative integer cursor"),
    ("٣", "after: expected a non-negative integer cursor"),  # Arabic-Indic three
    ("１", "after: expected a non-negative integer cursor"),  # fullwidth one
    ("9" * 5000, "after: cursor beyond 2147483647"),
    (str(2**31), "after: cursor beyond 2147483647"),
    (" 1", "after: expected a non-negative integer cursor"),
    ("+1", "after: expected a non-negative integer cursor"),
]


@pytest.mark.parametrize("prefix", ["/v1", "/api/v1"])
@pytest.mark.parametrize(("cursor", "detail"), BAD_CURSORS)
async def test_mutation_stream_cursor_must_be_ascii_digits_in_range(
    api: Api, prefix: str, cursor: str, detail: str
) -> None:
    response = await api.unchanged(
        "GET", f"{prefix}/sessions/{api.sid}/messages/stream", params={"after": cursor}
    )
    assert_problem(response, 400, detail=detail, code="invalid_parameter")


@pytest.mark.parametrize(("cursor", "detail"), BAD_CURSORS)
async def test_mutation_stream_last_event_id_must_be_ascii_digits_in_range(
    api: Api, cursor: str, detail: str
) -> None:
    response = await api.unchanged(
        "GET",
        f"/v1/sessions/{api.sid}/messages/stream",
        # Header values are bytes on the wire: send the UTF-8 of the cursor.
        headers={"Last-Event-ID": cursor.encode()},
    )
    assert_problem(
        response,
        400,
        detail=detail.replace("after:", "Last-Event-ID:"),
        code="invalid_parameter",
    )


async def test_mutation_stream_cursor_at_int32_max_is_served(api: Api) -> None:
    async with api.client.stream(
        "GET",
        f"/v1/sessions/{api.sid}/messages/stream",
        params={"after": "0002147483647"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")


@pytest.mark.parametrize("cursor", ["²", "٣", "9" * 5000])
@pytest.mark.parametrize(
    ("route", "name"),
    [
        ("events", "after_sequence"),
        ("events", "before_sequence"),
        ("sse", "after_sequence"),
    ],
)
async def test_sequence_cursors_of_events_and_sse_are_400(
    api: Api, cursor: str, route: str, name: str
) -> None:
    response = await api.unchanged(
        "GET", f"/v1/sessions/{api.sid}/{route}", params={name: cursor}
    )
    problem = assert_problem(response, 400, code="invalid_parameter")
    assert problem["detail"].startswith(f"{name}: "), problem


# ---- the scripted model's `/scenario long N` -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "count"),
    [
        ("12", 12),
        ("0012", 12),
        ("0", 0),
        ("", LONG_DEFAULT),
        ("²", LONG_DEFAULT),
        ("٣", LONG_DEFAULT),
        ("1²", LONG_DEFAULT),
        ("many", LONG_DEFAULT),
        ("-5", LONG_DEFAULT),
        ("9" * 5000, LONG_MAX),
        (str(LONG_MAX + 1), LONG_MAX),
    ],
)
def test_long_scenario_counts_only_ascii_digits(args: str, count: int) -> None:
    assert long_count(args) == count


async def test_long_scenario_with_superscript_argument_streams_the_default() -> None:
    driver = ScriptedDriver(0)
    turn = Turn(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "/scenario long ²"}]}
        ],
        iteration=1,
        tool_results=[],
    )
    events = [event async for event in driver.step(turn)]
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == LONG_DEFAULT


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("/scenario nosuch", "Unknown scenario 'nosuch'. Scenarios: /scenario echo"),
        ("/scenario echo", "Nothing to echo. Scenarios:"),
        ("/scenario echo say this", "say this"),
    ],
)
async def test_an_unknown_scenario_answers_its_usage(text: str, reply: str) -> None:
    """It answered an empty message."""
    turn = Turn(
        messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
        iteration=1,
        tool_results=[],
    )
    events = [event async for event in ScriptedDriver(0).step(turn)]
    said = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert said.startswith(reply), said


@pytest.mark.parametrize("argument", ["²", "٣"])
async def test_long_scenario_with_a_non_ascii_digit_completes_its_turn(
    api: Api, argument: str
) -> None:
    """It failed the turn with internal_error: `str.isdigit` took `²`, `int()` did not."""
    await post_message(api.client, api.sid, f"/scenario long {argument}")
    await wait_idle(api.client, api.sid)
    types = [e["type"] for e in await list_events(api.client, api.sid)]
    assert "turn.failed" not in types
    assert types.count("turn.completed") == 2
    page = (await api.client.get(f"/v1/sessions/{api.sid}/messages")).json()
    reply = page["data"][-1]
    assert reply["role"] == "agent"
    assert reply["state"] == "done"
    assert [p["type"] for p in reply["content"]] == ["text"]
    assert reply["content"][0]["text"].count("chunk") == LONG_DEFAULT


# ---- the validation layer is the request models' own -----------------------------------------


async def test_a_valid_body_of_every_kind_still_passes(api: Api) -> None:
    """Everything a client may send, at ordinary values, is stored as sent."""
    body: dict[str, Any] = {
        "message": {
            "content": [
                {"type": "text", "text": "text"},
                {"type": "context", "tag": "doc", "context": "ctx"},
                {"type": "image", "url": "https://example.com/a.png"},
                {"type": "image", "base64": "AA==", "media_type": "image/png"},
                {"type": "file", "file_id": f"file_{HEX32}", "filename": "a.txt"},
            ]
        },
        "controls": {"locale": "uk-UA", "hints": {"n": [1, 2.5, None, True]}},
        "metadata": {"nested": {"list": [1, "two", {"three": 3.0}]}},
        "tags": ["a", "b"],
        "external_actor": {"actor_id": "U1", "source": "slack", "actor_name": "A"},
        "client_message_id": "all-kinds",
    }
    response = await api.client.post(f"/v1/sessions/{api.sid}/messages", json=body)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["metadata"]["nested"] == body["metadata"]["nested"]
    assert created["controls"]["hints"] == body["controls"]["hints"]
    await wait_idle(api.client, api.sid)


async def test_problem_of_a_refused_body_never_echoes_the_input(api: Api) -> None:
    secret = "s3cr3t-" + "x" * 2000
    content = orjson.dumps({"title": secret, "metadata": {"k": "\x00" + secret}})
    response = await api.unchanged("POST", "/v1/sessions", content=content)
    assert_problem(response, 422, code="validation_error")
    assert "s3cr3t" not in response.text
