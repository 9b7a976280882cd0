"""MODEL_DRIVER=openai with a small context window: the history that no longer fits is
summarized by the model (a plain Chat Completions request to the local fake server)
and the next request carries the summary instead of the old messages."""

import uuid

import httpx

from tests.conftest import free_port
from tests.fake_openai import FakeOpenAI, fake_openai_fixture
from tests.helpers import (
    api_fixture,
    list_messages,
    live_server_fixture,
    post_message,
    wait_idle,
)

FAKE_PORT = free_port()

live_server = live_server_fixture(
    "openai-summaries",
    MODEL_DRIVER="openai",
    OPENAI_BASE_URL=f"http://127.0.0.1:{FAKE_PORT}/v1",
    OPENAI_MODEL="fake-model",
    MODEL_CONTEXT_TOKENS="1000",
    MODEL_MAX_RETRIES="0",
)


fake = fake_openai_fixture(FAKE_PORT)
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
    assert asked[-1]["role"] == "user" and asked[-1]["content"].startswith("Summarize")
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
