"""Requests racing a DELETE of the same session, over real HTTP against a real server
process on both lanes: every answer is one the contract documents (the racing write
either happened before the deletion or answers 404), exactly one of two DELETEs wins,
and nothing of the session is left."""

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx

from tests.support.api import create_session, text_body
from tests.support.problems import assert_problem
from tests.support.servers import Server

PAIRS = 40
TIMEOUT = httpx.Timeout(60.0)

Request = Callable[[httpx.AsyncClient, str], Awaitable[httpx.Response]]


async def race(
    http: httpx.AsyncClient, other: Request, pairs: int = PAIRS
) -> list[tuple[httpx.Response, httpx.Response]]:
    """`pairs` sessions, each sent `other` and a DELETE at the same time (all pairs in
    flight together); the answers, `other`'s first."""
    sessions = await asyncio.gather(
        *(create_session(http, f"race {i}") for i in range(pairs))
    )

    async def pair(session_id: str) -> tuple[httpx.Response, httpx.Response]:
        first, second = await asyncio.gather(
            other(http, session_id), http.delete(f"/v1/sessions/{session_id}")
        )
        return first, second

    results = await asyncio.gather(*(pair(s) for s in sessions))
    for session_id in sessions:
        gone = await http.get(f"/v1/sessions/{session_id}")
        assert_problem(gone, 404, code="session_not_found")
    return list(results)


def statuses(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(r.status_code for r in responses)


def assert_deleted(response: httpx.Response) -> None:
    assert response.status_code == 204, response.text
    assert response.content == b""


async def test_patch_racing_delete_answers_200_or_404(server: Server) -> None:
    async def patch(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
        return await http.patch(f"/v1/sessions/{session_id}", json={"title": "new"})

    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        results = await race(http, patch)
    for patched, deleted in results:
        assert_deleted(deleted)
        if patched.status_code == 200:
            assert patched.json()["title"] == "new"
        else:
            assert_problem(patched, 404, code="session_not_found")
    assert set(statuses([p for p, _ in results])) <= {200, 404}


async def test_two_deletes_of_one_session_one_wins(server: Server) -> None:
    async def delete(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
        return await http.delete(f"/v1/sessions/{session_id}")

    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        results = await race(http, delete)
    for first, second in results:
        answers = sorted([first, second], key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [204, 404], [r.text for r in answers]
        assert_deleted(answers[0])
        assert_problem(answers[1], 404, code="session_not_found")


async def test_post_message_racing_delete_answers_201_or_404(server: Server) -> None:
    async def post(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
        return await http.post(
            f"/v1/sessions/{session_id}/messages", json=text_body("racing")
        )

    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        results = await race(http, post, pairs=20)
        # The turns a racing message started stop at their next checkpoint: the
        # server keeps answering.
        assert (await http.get("/health")).status_code == 200
    for posted, deleted in results:
        assert_deleted(deleted)
        if posted.status_code == 201:
            assert posted.json()["delivery"] == "started"
        else:
            assert_problem(posted, 404, code="session_not_found")


async def test_cancel_racing_delete_answers_200_or_404(server: Server) -> None:
    async def cancel(http: httpx.AsyncClient, session_id: str) -> httpx.Response:
        return await http.post(f"/v1/sessions/{session_id}/cancel", json={})

    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        results = await race(http, cancel, pairs=20)
    for cancelled, deleted in results:
        assert_deleted(deleted)
        if cancelled.status_code == 200:
            assert cancelled.json()["status"] == "no_op"
        else:
            assert_problem(cancelled, 404, code="session_not_found")
