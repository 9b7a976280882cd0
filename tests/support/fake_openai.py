"""A local server speaking OpenAI's Chat Completions streaming protocol, as documented:
`POST /v1/chat/completions` with `stream: true` answers `text/event-stream`, one
`data: <chunk JSON>` block per chunk, a usage chunk (empty `choices`) when
`stream_options.include_usage` is set, and `data: [DONE]`. Tool call arguments arrive
in fragments split across chunks, keyed by the call's `index`.

What it answers is picked by the conversation's newest user message: `<scenario>
<nonce>` (the nonce keeps each test's attempts counted apart). Every request is
recorded with its body and headers, and the time the client closed a stream early.

It runs in a thread of the test process with its own event loop (uvicorn), so the
service under test, a separate process, reaches it over real HTTP.
"""

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fake-model"


@dataclass
class Recorded:
    body: dict[str, Any]
    headers: dict[str, str]
    scenario: str
    attempt: int
    # When the client closed the response before its end (time.monotonic()).
    closed_early_at: float | None = None
    finished: bool = False


@dataclass
class FakeOpenAI:
    port: int
    # A socket bound to `port` to serve on (one held since the module was imported).
    sock: socket.socket | None = None
    requests: list[Recorded] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def for_text(self, text: str) -> list[Recorded]:
        return [r for r in self.requests if _last_user(r.body["messages"]) == text]

    # ---- running -----------------------------------------------------------------

    def start(self) -> "FakeOpenAI":
        app = Starlette(
            routes=[Route("/v1/chat/completions", self._completions, methods=["POST"])]
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        sockets = None if self.sock is None else [self.sock]
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "fake OpenAI server did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)

    # ---- the endpoint ------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        text = _last_user(body["messages"])
        scenario = text.split(" ")[0]
        self.attempts[text] += 1
        attempt = self.attempts[text]
        has_results = _answered_tools(body["messages"])
        record = Recorded(body, dict(request.headers), scenario, attempt)
        self.requests.append(record)
        if not body.get("stream"):
            # A plain completion (the Composer's summary requests).
            return JSONResponse(
                {
                    "id": f"chatcmpl-plain-{attempt}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": f"SUMMARY of {len(body['messages']) - 1} messages",
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 50,
                        "completion_tokens": 5,
                        "total_tokens": 55,
                    },
                }
            )
        if scenario == "unauthorized":
            return _error(401, "Incorrect API key provided", "invalid_api_key")
        if scenario == "error500":
            return _error(500, "The server had an error", "server_error")
        if scenario == "tools" and attempt == 1:
            return _error(
                429, "Rate limit reached", "rate_limit_exceeded", {"Retry-After": "0"}
            )
        if scenario == "flaky" and attempt == 1:
            return _error(503, "Overloaded", "server_error")
        if scenario == "html" and attempt == 1:
            # A proxy's page where the stream should be, with a 200.
            return Response("<html><body>Welcome</body></html>", media_type="text/html")
        if scenario == "redirect":
            return Response(
                status_code=307, headers={"location": "http://127.0.0.1:9/v1/chat"}
            )
        if scenario == "bigerror":
            return _error(500, "E" * 200_000, "server_error")
        chunks = self._script(scenario, attempt, has_results)
        return StreamingResponse(
            self._stream(record, chunks, body, scenario, attempt),
            media_type="text/event-stream",
        )

    def _script(
        self, scenario: str, attempt: int, has_results: int
    ) -> list[dict[str, Any]]:
        if scenario == "tools":
            if has_results:
                return _text_chunks(["Both ", "lookups ", "returned ", "42."], "stop")
            return [
                _delta(
                    {"role": "assistant", "content": None, "reasoning_content": "Two "}
                ),
                _delta({"reasoning_content": "lookups needed."}),
                _delta({"content": "Checking both."}),
                _delta(
                    {"tool_calls": [_call_start(0, "call_alpha", "lookup", '{"qu')]}
                ),
                _delta({"tool_calls": [_call_more(0, 'ery": "Lis')]}),
                _delta({"tool_calls": [_call_more(0, 'bon"}')]}),
                _delta({"tool_calls": [_call_start(1, "call_beta", "lookup", "")]}),
                _delta({"tool_calls": [_call_more(1, '{"query"')]}),
                _delta({"tool_calls": [_call_more(1, ': "Porto"}')]}),
                _finish("tool_calls"),
            ]
        if scenario == "badjson":
            if has_results:
                return _text_chunks(["Sorry, ", "my mistake."], "stop")
            return [
                _delta({"role": "assistant", "content": None}),
                _delta(
                    {"tool_calls": [_call_start(0, "call_bad", "lookup", '{"query": ')]}
                ),
                _delta({"tool_calls": [_call_more(0, "Lisbon}")]}),
                _finish("tool_calls"),
            ]
        if scenario == "hostile":
            # What cannot be stored or published as it is: arguments with a lone
            # surrogate, an integer past 64 bits, one id twice, an integer id.
            if has_results:
                return _text_chunks(["Handled."], "stop")
            numbered = {**_call_start(2, "", "lookup", '{"query": "seven"}'), "id": 7}
            return [
                _delta({"role": "assistant", "content": None}),
                _delta({"tool_calls": [_call_start(0, "dup", "lookup", LONE)]}),
                _delta({"tool_calls": [_call_start(1, "dup", "lookup", HUGE)]}),
                _delta({"tool_calls": [numbered]}),
                _finish("tool_calls"),
            ]
        if scenario == "badtypes" and attempt == 1:
            # A chunk whose text is a number: a provider failure, tried again.
            return [
                _delta({"role": "assistant", "content": ""}),
                _delta({"content": 5}),
            ]
        if scenario == "length":
            return _text_chunks(["This ", "reply ", "is ", "cut"], "length")
        if scenario == "reasoning":
            return [
                _delta({"role": "assistant", "reasoning": "Thinking "}),
                _delta({"reasoning": "hard."}),
                *_text_chunks(["An ", "answer."], "stop"),
            ]
        if scenario == "drop" and attempt == 1:
            # Cut mid-stream: no finish, no [DONE]; the connection drops.
            return [*_text_chunks(["Lost ", "words "], None), {"drop": True}]
        if scenario == "toolslow":
            if not has_results:
                return [
                    _delta({"role": "assistant", "content": None}),
                    _delta(
                        {
                            "tool_calls": [
                                _call_start(0, "call_one", "lookup", '{"query": "x"}')
                            ]
                        }
                    ),
                    _finish("tool_calls"),
                ]
            scenario = "slow"
        if scenario == "cut" and attempt == 1:
            # The body ends cleanly after some text: no finish_reason, no [DONE].
            return [*_text_chunks(["Half ", "an "], None), {"end": True}]
        if scenario == "manycalls":
            return [
                _delta({"role": "assistant", "content": None}),
                *(
                    _delta({"tool_calls": [_call_start(i, f"c{i}", "lookup", "{}")]})
                    for i in range(MANY_CALLS)
                ),
                _finish("tool_calls"),
            ]
        if scenario == "bigreply":
            return _text_chunks(["x" * 100] * 100, "stop")
        if scenario == "slow":
            return [{"sleep": 0.2, **_delta({"content": f"w{i} "})} for i in range(200)]
        return _text_chunks(["Hello ", "from ", "the ", "fake ", "model."], "stop")

    async def _stream(
        self,
        record: Recorded,
        chunks: list[dict[str, Any]],
        body: dict[str, Any],
        scenario: str,
        attempt: int,
    ) -> AsyncIterator[bytes]:
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        ident = f"chatcmpl-{scenario}-{attempt}"
        try:
            for chunk in chunks:
                if chunk.pop("drop", False):
                    raise ConnectionResetError("the fake drops the connection")
                if chunk.pop("end", False):
                    record.finished = True
                    return
                pause = chunk.pop("sleep", 0)
                if pause:
                    await asyncio.sleep(pause)
                else:
                    await asyncio.sleep(0.005)
                yield _sse(
                    {
                        "id": ident,
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": MODEL,
                        **chunk,
                    }
                )
            if include_usage:
                yield _sse(
                    {
                        "id": ident,
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": MODEL,
                        "choices": [],
                        "usage": {
                            "prompt_tokens": 100,
                            "completion_tokens": 10,
                            "total_tokens": 110,
                            "prompt_tokens_details": {"cached_tokens": 20},
                        },
                    }
                )
            yield b"data: [DONE]\n\n"
            record.finished = True
        finally:
            if not record.finished:
                record.closed_early_at = time.monotonic()


def _last_user(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, list):
                return " ".join(
                    c.get("text", "") for c in content if c.get("type") == "text"
                )
            return str(content)
    return ""


def _answered_tools(messages: list[dict[str, Any]]) -> int:
    """Tool results after the newest user message."""
    count = 0
    for message in reversed(messages):
        if message["role"] == "user":
            break
        if message["role"] == "tool":
            count += 1
    return count


# Tool calls in one step of `manycalls`: past the service's default cap (128).
MANY_CALLS = 130

# Tool-call arguments (JSON text) that decode to what JSON cannot carry on.
LONE = '{"query": "\\ud800"}'
HUGE = '{"query": 123456789012345678901234567890}'


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _finish(reason: str) -> dict[str, Any]:
    return _delta({}, reason)


def _text_chunks(words: list[str], finish: str | None) -> list[dict[str, Any]]:
    chunks = [_delta({"role": "assistant", "content": ""})]
    chunks += [_delta({"content": word}) for word in words]
    if finish is not None:
        chunks.append(_finish(finish))
    return chunks


def _call_start(index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _call_more(index: int, arguments: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": arguments}}


def _error(
    status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": "error", "param": None, "code": code}},
        status_code=status,
        headers=headers,
    )


def fake_openai_fixture(sock: socket.socket) -> Any:
    """A module's `fake` fixture: the test server on `sock` (a `bound_socket` the
    module holds from its import, when its servers are configured with the port), for
    the module's tests (autouse: the service under test talks to it from its first
    request)."""

    @pytest.fixture(scope="module", autouse=True)
    def fake() -> Iterator[FakeOpenAI]:
        server = FakeOpenAI(sock.getsockname()[1], sock).start()
        yield server
        server.stop()

    return fake
