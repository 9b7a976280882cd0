"""A turn whose ending fails (its error cannot be written) is abandoned, not left
running with no runner: it ends `failed` in one checkpoint that uses nothing the
runner held, and the session takes new messages at once, on both databases."""

from typing import Any

import httpx
import pytest

from app.runner import outcomes
from tests.support.api import create_session, list_events, list_messages, post_message
from tests.support.waits import wait_idle


async def test_a_turn_whose_ending_fails_is_abandoned_and_the_session_goes_on(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def cannot_end(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("the error could not be written")

    monkeypatch.setattr(outcomes, "end_with_error", cannot_end)
    session_id = await create_session(client)
    await post_message(client, session_id, "/scenario fail")
    await wait_idle(client, session_id)

    user, agent = (await list_messages(client, session_id))["data"]
    assert agent["state"] == "done"
    assert agent["content"][-1]["type"] == "error"
    assert agent["content"][-1]["code"] == "internal_error"
    events = await list_events(client, session_id)
    assert [e["type"] for e in events][-2:] == ["turn.failed", "session.idled"]
    failed = events[-2]["data"]
    assert failed["error_code"] == "internal_error"
    assert failed["error"] == "RuntimeError"

    monkeypatch.undo()
    reply = await post_message(client, session_id, "hello again")
    assert reply["delivery"] == "started"
    await wait_idle(client, session_id)
    events = await list_events(client, session_id)
    assert [e["type"] for e in events][-2:] == ["turn.completed", "session.idled"]
    assert user["id"] != reply["id"]
