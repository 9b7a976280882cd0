"""A turn whose ending fails (its error cannot be written) is abandoned, not left
running with no runner: it ends `failed` in one checkpoint that uses nothing the
runner held, and the session takes new messages at once, on both databases. A lease
the database did not answer is asked for again rather than losing the turn."""

from typing import Any

import httpx
import pytest

from app.runner import outcomes, runner as runner_module
from tests.support.api import create_session, list_events, list_messages, post_message
from tests.support.in_process import Running
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


async def test_a_lease_the_database_did_not_answer_is_asked_again(
    client: httpx.AsyncClient, running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease connection timing out (a database slow to accept under load) does not
    cost the turn: the runner asks again, as a checkpoint waits for the database, and
    the turn runs to its end."""
    runner = running.app.state.app.runner
    monkeypatch.setattr(runner_module, "LEASE_RETRY_SECONDS", 0.01)
    try_acquire = runner.leases.try_acquire
    refused: list[str] = []

    async def slow_database(session_id: Any) -> bool:
        if len(refused) < 2:
            refused.append(str(session_id))
            raise TimeoutError
        return bool(await try_acquire(session_id))

    monkeypatch.setattr(runner.leases, "try_acquire", slow_database)
    session_id = await create_session(client)
    await post_message(client, session_id, "hello")
    await wait_idle(client, session_id)
    assert len(refused) == 2
    _, agent = (await list_messages(client, session_id))["data"]
    assert (agent["role"], agent["state"]) == ("agent", "done")
    assert agent["content"][-1]["type"] == "text"
    events = await list_events(client, session_id)
    assert "turn.completed" in [e["type"] for e in events]
