"""MODEL_DRIVER=openai end to end: a real server process talks, through the real `openai`
client over real HTTP, to a local server speaking the Chat Completions streaming
protocol (tests/support/fake_openai.py). Nothing inside the service is mocked: the
tests drive it over HTTP and read what it stored, streamed and sent to the model."""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.runner.drivers.openai import token_count
from tests.support.api import list_events, list_messages, post_message
from tests.support.fake_openai import FakeOpenAI, fake_openai_fixture
from tests.support.lanes import ROOT
from tests.support.servers import (
    Server,
    api_fixture,
    bound_socket,
    free_port,
    live_server_fixture,
    start_server,
)
from tests.support.sse import SSEReader
from tests.support.waits import wait_idle, wait_until

FAKE_SOCKET = bound_socket()
FAKE_PORT = FAKE_SOCKET.getsockname()[1]
SYSTEM_PROMPT = "You are terse. <b>Answer</b> in one line."
# Recorded where a transcript of the tool turn is wanted (the closing note's).
TRANSCRIPT = os.environ.get("OPENAI_TRANSCRIPT")

PROVIDER = {
    "MODEL_DRIVER": "openai",
    "OPENAI_BASE_URL": f"http://127.0.0.1:{FAKE_PORT}/v1",
    "OPENAI_API_KEY": "sk-test-key",
    "OPENAI_MODEL": "fake-model",
}
# A session's own tool of the demo tool's name.
OWN_LOOKUP = {
    "name": "lookup",
    "description": "The caller's own.",
    "parameters": {"type": "object"},
}
# The fake's tool scenarios call the demo tool `lookup`: offered here on purpose.
live_server = live_server_fixture(
    "openai-driver",
    **PROVIDER,
    DEMO_TOOLS="true",
    MODEL_CONTEXT_TOKENS="8192",
    MODEL_TIMEOUT_SECONDS="5",
    MODEL_MAX_RETRIES="2",
    MODEL_MAX_REPLY_CHARS="5000",
    LOG_LEVEL="info",
)


fake = fake_openai_fixture(FAKE_SOCKET)
api = api_fixture()


async def new_session(api: httpx.AsyncClient, **fields: Any) -> str:
    response = await api.post("/v1/sessions", json={"title": "openai", **fields})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def nonce(scenario: str) -> str:
    return f"{scenario} {uuid.uuid4().hex[:8]}"


async def run(
    api: httpx.AsyncClient, text: str, **session: Any
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    sid = await new_session(api, **session)
    await post_message(api, sid, text)
    await wait_idle(api, sid)
    return sid, (await list_messages(api, sid))["data"], await list_events(api, sid)


async def test_a_reply_streams_and_reports_usage(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("hello")
    sid, messages, events = await run(api, text, system_prompt=SYSTEM_PROMPT)
    _, agent = messages
    assert agent["content"][0]["type"] == "text"
    assert agent["content"][0]["text"] == "Hello from the fake model."
    assert agent["phase"] == "final_answer"
    assert [e["type"] for e in events][-2:] == ["turn.completed", "session.idled"]
    usage = {"input_tokens": 80, "output_tokens": 10, "cache_read_tokens": 20}
    completed = next(e for e in events if e["type"] == "turn.completed")["data"]
    assert completed["usage"] == usage
    output = [e for e in events if e["type"] == "output.message.completed"]
    assert output[-1]["data"]["usage"] == usage
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"] == usage

    # What the model was sent: the Composer's messages, the service's own retries.
    (request,) = fake.for_text(text)
    assert request.headers["authorization"] == "Bearer sk-test-key"
    assert request.headers.get("x-stainless-retry-count") in (None, "0")
    body = request.body
    assert body["model"] == "fake-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": text},
    ]
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]
    # The catalog's one model is the one the driver calls.
    (model,) = (await api.get("/v1/models")).json()["data"]
    assert (model["name"], model["driver"]) == ("fake-model", "openai")


async def test_usage_accumulates_on_the_session(api: httpx.AsyncClient) -> None:
    tools = [
        {
            "type": "client_side",
            "name": "lookup",
            "description": "Look it up",
            "parameters": {"type": "object", "properties": {}},
        },
    ]
    sid = await new_session(api, system_prompt=SYSTEM_PROMPT, tools=tools)
    for _ in range(2):
        await post_message(api, sid, nonce("hello"))
        await wait_idle(api, sid)
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"] == {
        "input_tokens": 160,
        "output_tokens": 20,
        "cache_read_tokens": 40,
    }
    # Usage is written as one key: the rest of the session stays as it was.
    assert session["system_prompt"] == SYSTEM_PROMPT
    assert [t["name"] for t in session["tools"]] == ["lookup"]
    # The second request carried the first exchange, in order.
    messages = (await list_messages(api, sid))["data"]
    assert [m["role"] for m in messages] == ["user", "agent", "user", "agent"]


async def test_two_tool_calls_a_retry_and_usage(
    api: httpx.AsyncClient, fake: FakeOpenAI, live_server: Server
) -> None:
    text = nonce("tools")
    sid = await new_session(api)
    sse = await SSEReader(api, f"/v1/sessions/{sid}/sse").start()
    mutations = await SSEReader(api, f"/v1/sessions/{sid}/messages/stream").start()
    try:
        await post_message(api, sid, text)
        await wait_idle(api, sid)
        await sse.wait_for(
            lambda frames: any(f.event == "session.idled" for f in frames), "idled"
        )
        await mutations.wait_for(
            lambda frames: any(
                f.event == "message"
                and f.json()["message"]["state"] == "done"
                and f.json()["message"]["role"] == "agent"
                for f in frames
            ),
            "the closed agent message",
        )
    finally:
        await sse.close()
        await mutations.close()
    messages = (await list_messages(api, sid))["data"]
    events = await list_events(api, sid)
    if TRANSCRIPT:
        with Path(TRANSCRIPT).open("w") as out:  # noqa: ASYNC230 (a test's record)
            json.dump(
                {
                    "events": events,
                    "live": [
                        {"event": f.event, "data": f.json()}
                        for f in sse.frames
                        if f.event in ("llm.retry", "tool.call.input.delta")
                    ],
                },
                out,
                indent=1,
            )

    # The first request was answered 429 (Retry-After: 0), the second streamed.
    requests = fake.for_text(text)
    assert [r.attempt for r in requests] == [1, 2, 3]
    (retry,) = sse.events("llm.retry")
    assert retry["data"] == {
        "turn_id": messages[0]["turn_id"],
        "message_id": messages[1]["id"],
        "attempt": 1,
        "max_attempts": 3,
        "code": "429",
        "message": "The model provider answered 429: Rate limit reached",
        "will_retry": True,
        "retry_in_ms": 0,
    }
    (warning,) = mutations.events("warning")
    assert warning["kind"] == "model_retry"
    assert (warning["attempt"], warning["code"], warning["will_retry"]) == (
        1,
        "429",
        True,
    )
    assert (
        "Retry" in live_server.log.read_text() or "429" in live_server.log.read_text()
    )

    # Tool input streamed live, keyed by the call, as it arrived in fragments.
    inputs = [
        f.json()
        for f in mutations.frames
        if f.event == "delta" and f.json()["kind"] == "tool_input"
    ]
    by_call: dict[str, str] = {}
    for delta in inputs:
        by_call[delta["tool_call_id"]] = (
            by_call.get(delta["tool_call_id"], "") + delta["text"]
        )
    assert by_call == {
        "call_alpha": '{"query": "Lisbon"}',
        "call_beta": '{"query": "Porto"}',
    }
    sse_inputs = sse.events("tool.call.input.delta")
    assert sse_inputs[-1]["data"]["tool_call_id"] == "call_beta"
    assert sse_inputs[-1]["data"]["accumulated"] == '{"query": "Porto"}'
    assert any(
        f.event == "part"
        and f.json()["part"]["type"] == "tool_call"
        and f.json()["part"]["status"] == "input_streaming"
        for f in mutations.frames
    )

    agent = messages[1]
    kinds = [(p["type"], p.get("step_id")) for p in agent["content"]]
    assert kinds == [
        ("reasoning", "step_1"),
        ("text", "step_1"),
        ("tool_call", "step_1"),
        ("tool_call", "step_1"),
        ("tool_result", "step_1"),
        ("tool_result", "step_1"),
        ("text", "step_2"),
    ]
    reasoning, said, alpha, beta, r_alpha, r_beta, answer = agent["content"]
    assert reasoning["text"] == {"kind": "plain", "text": "Two lookups needed."}
    assert reasoning["provider"] == "openai"
    assert said["text"] == "Checking both."
    assert (alpha["id"], alpha["arguments"], alpha["status"]) == (
        "call_alpha",
        {"query": "Lisbon"},
        "completed",
    )
    assert (beta["id"], beta["arguments"], beta["status"]) == (
        "call_beta",
        {"query": "Porto"},
        "completed",
    )
    assert "input_text" not in alpha
    assert r_alpha == {
        **r_alpha,
        "tool_call_id": "call_alpha",
        "result": {"query": "Lisbon", "answer": 42},
    }
    assert r_beta["tool_call_id"] == "call_beta"
    assert answer["text"] == "Both lookups returned 42."

    # The results went back as `tool` messages, paired with the calls.
    second = requests[-1].body["messages"]
    assert second[-3]["role"] == "assistant"
    assert second[-3]["content"] == "Checking both."
    assert [c["id"] for c in second[-3]["tool_calls"]] == ["call_alpha", "call_beta"]
    assert json.loads(second[-3]["tool_calls"][0]["function"]["arguments"]) == {
        "query": "Lisbon"
    }
    assert [(m["role"], m["tool_call_id"]) for m in second[-2:]] == [
        ("tool", "call_alpha"),
        ("tool", "call_beta"),
    ]
    assert json.loads(second[-2]["content"]) == {"query": "Lisbon", "answer": 42}

    types = [e["type"] for e in events]
    assert types.count("tool.started") == 2
    assert types.count("tool.completed") == 2
    completed = next(e for e in events if e["type"] == "turn.completed")["data"]
    assert completed["iterations"] == 2
    assert completed["tool_call_count"] == 2
    assert completed["usage"] == {
        "input_tokens": 160,
        "output_tokens": 20,
        "cache_read_tokens": 40,
    }


async def test_arguments_that_are_not_json_fail_the_tool_and_the_turn_goes_on(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("badjson")
    _, messages, events = await run(api, text)
    agent = messages[1]
    call, result, answer = agent["content"]
    assert call["type"] == "tool_call"
    assert call["status"] == "failed"
    assert call["arguments"] == {}
    assert "not valid JSON" in call["error"]
    assert result["type"] == "tool_result"
    assert result["tool_call_id"] == "call_bad"
    assert "not valid JSON" in result["error"]
    assert answer["text"] == "Sorry, my mistake."
    types = [e["type"] for e in events]
    assert "tool.started" not in types, "the tool never ran"
    failed = next(e for e in events if e["type"] == "tool.completed")["data"]
    assert (failed["status"], failed["success"]) == ("error", False)
    assert types[-2] == "turn.completed"
    # The model saw the failure as the call's result.
    tool_message = fake.for_text(text)[-1].body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"].startswith(
        "Error: The tool's arguments are not valid JSON"
    )


async def test_finish_reason_length_ends_the_reply(api: httpx.AsyncClient) -> None:
    _, messages, events = await run(api, nonce("length"))
    assert messages[1]["content"][0]["text"] == "This reply is cut"
    assert messages[1]["state"] == "done"
    assert [e["type"] for e in events][-2] == "turn.completed"


async def test_reasoning_field_becomes_a_reasoning_part(api: httpx.AsyncClient) -> None:
    _, messages, _ = await run(api, nonce("reasoning"))
    reasoning, text = messages[1]["content"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["text"] == {"kind": "plain", "text": "Thinking hard."}
    assert text["text"] == "An answer."


async def test_a_5xx_is_retried(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    text = nonce("flaky")
    _, messages, events = await run(api, text)
    assert [r.attempt for r in fake.for_text(text)] == [1, 2]
    assert messages[1]["content"][0]["text"] == "Hello from the fake model."
    assert [e["type"] for e in events][-2] == "turn.completed"


async def test_a_dropped_stream_is_retried_from_the_start(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("drop")
    sid = await new_session(api)
    sse = await SSEReader(api, f"/v1/sessions/{sid}/sse").start()
    try:
        await post_message(api, sid, text)
        await wait_idle(api, sid)
        await sse.wait_for(
            lambda fs: any(f.event == "session.idled" for f in fs), "idled"
        )
    finally:
        await sse.close()
    assert len(fake.for_text(text)) == 2
    (retry,) = sse.events("llm.retry")
    assert retry["data"]["code"] == "connection_error"
    assert retry["data"]["will_retry"] is True
    messages = (await list_messages(api, sid))["data"]
    # Nothing of the dropped attempt is kept: the step started over.
    assert [p["type"] for p in messages[1]["content"]] == ["text"]
    assert messages[1]["content"][0]["text"] == "Hello from the fake model."


async def test_final_failure_closes_the_message_with_the_providers_status(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("error500")
    sid = await new_session(api)
    sse = await SSEReader(api, f"/v1/sessions/{sid}/sse").start()
    try:
        await post_message(api, sid, text)
        await wait_idle(api, sid, within=30)
        await sse.wait_for(
            lambda fs: any(f.event == "session.idled" for f in fs), "idled"
        )
    finally:
        await sse.close()
    assert len(fake.for_text(text)) == 3, "MODEL_MAX_RETRIES=2: three attempts"
    retries = [e["data"] for e in sse.events("llm.retry")]
    assert [(r["attempt"], r["will_retry"]) for r in retries] == [
        (1, True),
        (2, True),
        (3, False),
    ]
    messages = (await list_messages(api, sid))["data"]
    (error,) = messages[1]["content"]
    assert error["type"] == "error"
    assert error["code"] == "model_error"
    assert "500" in error["message"]
    events = await list_events(api, sid)
    failed = next(e for e in events if e["type"] == "turn.failed")["data"]
    assert failed["error_code"] == "model_error"
    assert "500" in failed["error"]


async def test_a_stream_cut_before_its_end_is_retried(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    """A body that ends cleanly without a finish or `[DONE]` is not a whole reply."""
    text = nonce("cut")
    _, messages, events = await run(api, text)
    assert [r.attempt for r in fake.for_text(text)] == [1, 2]
    assert [p["text"] for p in messages[1]["content"]] == ["Hello from the fake model."]
    assert [e["type"] for e in events][-2] == "turn.completed"


async def test_an_html_page_answered_200_is_retried(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("html")
    _, messages, events = await run(api, text)
    assert [r.attempt for r in fake.for_text(text)] == [1, 2]
    assert messages[1]["content"][0]["text"] == "Hello from the fake model."
    assert [e["type"] for e in events][-2] == "turn.completed"


async def test_a_redirect_is_not_followed(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    """A 307 elsewhere fails the step: the provider key is not sent to another
    address."""
    text = nonce("redirect")
    _, messages, events = await run(api, text)
    assert len(fake.for_text(text)) == 1
    assert "307" in messages[1]["content"][-1]["message"]
    assert [e["type"] for e in events][-2] == "turn.failed"


async def test_a_providers_error_body_is_kept_cut_to_its_start(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("bigerror")
    _, messages, events = await run(api, text)
    error = messages[1]["content"][-1]
    assert error["type"] == "error"
    assert "500" in error["message"]
    assert 1_000 <= len(error["message"]) < 1_100
    failed = next(e for e in events if e["type"] == "turn.failed")["data"]
    assert len(failed["error"]) < 1_100


async def test_more_tool_calls_in_a_step_than_the_cap_fail_the_turn(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    """MODEL_MAX_TOOL_CALLS (128 by default): none of the calls runs."""
    text = nonce("manycalls")
    _, messages, events = await run(api, text)
    assert len(fake.for_text(text)) == 1
    error = messages[1]["content"][-1]
    assert error["code"] == "model_error"
    assert "more than 128 tool calls" in error["message"]
    assert not any(e["type"] == "tool.started" for e in events)
    assert [e["type"] for e in events][-2] == "turn.failed"


async def test_a_reply_past_the_cap_stops_and_keeps_what_streamed(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    """MODEL_MAX_REPLY_CHARS is 5,000 on this server: the 10,000-character reply stops
    at the cap, what streamed up to it is kept ahead of the error."""
    text = nonce("bigreply")
    _, messages, events = await run(api, text)
    assert len(fake.for_text(text)) == 1
    *kept, error = messages[1]["content"]
    assert error["code"] == "model_error"
    assert "5,000 characters" in error["message"]
    assert sum(len(p.get("text", "")) for p in kept) <= 5_000
    assert [e["type"] for e in events][-2] == "turn.failed"


async def test_a_401_is_not_retried(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    text = nonce("unauthorized")
    _, messages, events = await run(api, text)
    assert len(fake.for_text(text)) == 1
    assert "401" in messages[1]["content"][-1]["message"]
    assert [e["type"] for e in events][-2] == "turn.failed"


async def test_cancel_closes_the_provider_stream_and_keeps_what_streamed(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("slow")
    sid = await new_session(api)
    sse = await SSEReader(api, f"/v1/sessions/{sid}/sse").start()
    try:
        await post_message(api, sid, text)
        await sse.wait_for(
            lambda fs: sum(f.event == "output.message.delta" for f in fs) >= 3,
            "three deltas",
        )
        cancelled_at = time.monotonic()
        response = await api.post(f"/v1/sessions/{sid}/cancel")
        assert response.json()["status"] == "cancelled"
        await wait_idle(api, sid)
    finally:
        await sse.close()
    (request,) = fake.for_text(text)
    await wait_until(
        lambda: request.closed_early_at is not None, "the provider stream closed", 5
    )
    assert request.closed_early_at is not None, "the provider stream was closed"
    assert request.closed_early_at - cancelled_at < 1.0
    messages = (await list_messages(api, sid))["data"]
    text_part, error = messages[1]["content"]
    assert text_part["text"].startswith("w0 w1 w2 ")
    assert error["code"] == "cancelled"
    events = await list_events(api, sid)
    assert [e["type"] for e in events][-2] == "turn.cancelled"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MODEL_DRIVER": "openai", "OPENAI_MODEL": "m"}, "OPENAI_BASE_URL"),
        (
            {"MODEL_DRIVER": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
            "OPENAI_MODEL",
        ),
        (
            {
                "MODEL_DRIVER": "openai",
                "OPENAI_BASE_URL": "localhost:8080",
                "OPENAI_MODEL": "m",
            },
            "OPENAI_BASE_URL",
        ),
        ({"MODEL_DRIVER": "gpt"}, "MODEL_DRIVER"),
        ({"MODEL_CONTEXT_TOKENS": "many"}, "MODEL_CONTEXT_TOKENS"),
        ({"MODEL_TIMEOUT_SECONDS": "0"}, "MODEL_TIMEOUT_SECONDS"),
        ({"MODEL_MAX_RETRIES": "-1"}, "MODEL_MAX_RETRIES"),
    ],
)
def test_a_bad_model_setting_stops_start_up_with_one_line(
    env: dict[str, str], named: str, tmp_path: Any
) -> None:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MODEL_"))
    }
    environment["DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path}/x.db"
    environment.update(env)
    result = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", str(free_port())],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("invalid configuration: ")
    assert named in lines[0]
    assert "Traceback" not in result.stderr


async def test_a_cancelled_turn_reports_the_usage_of_its_committed_steps(
    api: httpx.AsyncClient,
) -> None:
    sid = await new_session(api)
    sse = await SSEReader(api, f"/v1/sessions/{sid}/sse").start()
    try:
        await post_message(api, sid, nonce("toolslow"))
        await sse.wait_for(
            lambda fs: sum(f.event == "output.message.delta" for f in fs) >= 2,
            "the second step streaming",
        )
        await api.post(f"/v1/sessions/{sid}/cancel")
        await wait_idle(api, sid)
    finally:
        await sse.close()
    events = await list_events(api, sid)
    cancelled = next(e for e in events if e["type"] == "turn.cancelled")["data"]
    assert cancelled["usage"] == {
        "input_tokens": 80,
        "output_tokens": 10,
        "cache_read_tokens": 20,
    }
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"] == cancelled["usage"]


async def test_tool_calls_that_cannot_be_stored_as_sent_are_made_storable(
    api: httpx.AsyncClient,
) -> None:
    """A lone surrogate in the arguments fails that call (its arguments are not JSON
    that can be stored); an integer past 64 bits is read as a number; one id twice and
    an integer id become ids every call can be answered by. The turn completes (it
    used to stop publishing, and on SQLite leave the session active for good)."""
    text = nonce("hostile")
    _, messages, events = await run(api, text)
    calls = [p for p in messages[1]["content"] if p["type"] == "tool_call"]
    assert len(calls) == 3
    lone, huge, numbered = calls
    assert lone["status"] == "failed"
    assert "not valid JSON" in lone["error"]
    assert huge["status"] != "failed"
    assert huge["arguments"]["query"] == 1.2345678901234568e29
    assert numbered["id"] == "7"
    ids = [call["id"] for call in calls]
    assert len(set(ids)) == 3, ids
    assert ids[0] == "dup"
    assert messages[1]["content"][-1]["text"] == "Handled."
    assert [e["type"] for e in events][-2] == "turn.completed"


async def test_a_chunk_of_the_wrong_shape_is_a_provider_failure_tried_again(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    text = nonce("badtypes")
    _, messages, events = await run(api, text)
    assert [r.attempt for r in fake.for_text(text)] == [1, 2]
    assert messages[1]["content"][0]["text"] == "Hello from the fake model."
    assert [e["type"] for e in events][-2] == "turn.completed"


def test_token_counts_out_of_range_are_not_counted() -> None:
    assert token_count(12) == 12
    assert token_count(2.0) == 2
    for nonsense in (10**30, 1e29, -5, True, "7", None):
        assert token_count(nonsense) == 0


async def test_a_real_model_is_offered_the_sessions_tools_only(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """Without DEMO_TOOLS, a model of the openai driver is offered no demo tool, and a
    session may have a tool of the demo tool's name (it is the only one offered)."""
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'plain.db'}"
    server = await asyncio.to_thread(
        start_server, database_url, tmp_path, None, **PROVIDER
    )
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            plain = nonce("hello")
            await run(client, plain)
            assert "tools" not in fake.for_text(plain)[0].body
            declared = nonce("hello")
            await run(client, declared, tools=[OWN_LOOKUP])
            offered = fake.for_text(declared)[0].body["tools"]
            assert [t["function"]["description"] for t in offered] == [
                "The caller's own."
            ]
    finally:
        server.stop()


async def test_a_session_tool_of_the_demo_tools_name_is_offered_once(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    """With DEMO_TOOLS, a session's own `lookup` is its declaration of that name: the
    model gets one function of the name, the session's."""
    text = nonce("hello")
    await run(api, text, tools=[OWN_LOOKUP])
    offered = fake.for_text(text)[0].body["tools"]
    assert [t["function"]["description"] for t in offered] == ["The caller's own."]
