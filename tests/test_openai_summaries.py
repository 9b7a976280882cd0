"""MODEL_DRIVER=openai with a small context window: the history that no longer fits is
summarized by the model (a plain Chat Completions request to the local fake server)
and the next request carries the summary instead of the old messages."""

import uuid

import httpx

from tests.support.api import list_messages, post_message
from tests.support.fake_openai import FakeOpenAI, fake_openai_fixture
from tests.support.servers import api_fixture, bound_socket, live_server_fixture
from tests.support.waits import wait_idle

FAKE_SOCKET = bound_socket()
FAKE_PORT = FAKE_SOCKET.getsockname()[1]

live_server = live_server_fixture(
    "openai-summaries",
    MODEL_DRIVER="openai",
    OPENAI_BASE_URL=f"http://127.0.0.1:{FAKE_PORT}/v1",
    OPENAI_MODEL="fake-model",
    MODEL_CONTEXT_TOKENS="1000",
    MODEL_MAX_RETRIES="0",
)


fake = fake_openai_fixture(FAKE_SOCKET)
api = api_fixture()


async def test_old_history_is_replaced_by_the_models_summary(
    api: httpx.AsyncClient, fake: FakeOpenAI
) -> None:
    sid = (await api.post("/v1/sessions", json={"system_prompt": "Be kind."})).json()[
        "id"
    ]
    long = " ".join(f"word{i}" for i in range(600))
    first = f"hello {uuid.uuid4().hex} {long}"
    await post_message(api, sid, first)
    await wait_idle(api, sid)
    second = f"hello again {uuid.uuid4().hex}"
    await post_message(api, sid, second)
    await wait_idle(api, sid)

    plain = [
        r
        for r in fake.requests
        if not r.body.get("stream")
        and any(m.get("content") == first for m in r.body["messages"])
    ]
    assert len(plain) == 1, "one summary request"
    asked = plain[0].body["messages"]
    assert asked[-1]["role"] == "user"
    assert asked[-1]["content"].startswith("Summarize")
    assert any(m.get("content") == first for m in asked)

    (request,) = fake.for_text(second)
    sent = request.body["messages"]
    assert sent[0] == {"role": "system", "content": "Be kind."}
    assert sent[1]["role"] == "system"
    assert sent[1]["content"].startswith(
        "Summary of the earlier conversation:\nSUMMARY of"
    )
    assert all(m.get("content") != first for m in sent)
    assert sent[-1] == {"role": "user", "content": second}
    # The conversation itself is untouched.
    page = await list_messages(api, sid)
    assert [m["role"] for m in page["data"]] == ["user", "agent", "user", "agent"]
    assert page["total"] == 4
