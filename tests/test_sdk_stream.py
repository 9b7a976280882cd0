"""The official Everruns Python SDK against a real server: `client.events.stream()`
follows a turn, and resumes after the server cycles the connection without losing a
durable event (DESIGN.md 2.4, UPSTREAM-NOTES 3.4: the client reconnects with `since_id`
set to the id of the last event it received)."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from everruns_sdk import Everruns
from everruns_sdk.models import Event
from everruns_sdk.sse import EventStream

from app.settings import Settings
from tests.support.api import TURN_EVENTS
from tests.support.servers import Server, server_process
from tests.support.waits import wait_sdk_idle

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TEST_DEADLINE = 60.0
WAIT = 15.0


@contextlib.asynccontextmanager
async def sdk_server(
    tmp_path: Path, settings: Settings, **env: str
) -> AsyncIterator[tuple[Server, Everruns]]:
    async with server_process(
        settings.database_url, tmp_path, kill=True, **env
    ) as server:
        client = Everruns(api_key="any-key", base_url=f"{server.url}/api")
        try:
            yield server, client
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def consuming(stream: EventStream) -> AsyncIterator[list[Event]]:
    """Iterate the SDK stream in a background task, collecting its events."""
    received: list[Event] = []

    async def consume() -> None:
        async for event in stream:
            received.append(event)

    task = asyncio.create_task(consume())
    try:
        yield received
    finally:
        stream.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await stream.aclose()


async def wait_for_event(
    received: list[Event], what: str, predicate: Callable[[Event], bool]
) -> Event:
    deadline = time.monotonic() + WAIT
    while True:
        for event in received:
            if predicate(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}; got {[e.type for e in received][-20:]}"
            )
        await asyncio.sleep(0.02)


def of_type(type_: str, turn_id: str | None = None) -> Callable[[Event], bool]:
    def match(event: Event) -> bool:
        return event.type == type_ and (
            turn_id is None or event.context.turn_id == turn_id
        )

    return match


async def probe_resume(server: Server, session_id: str, since_id: str | None) -> str:
    """What the server answers to the SDK's resume request (status and detail)."""
    url = f"{server.url}/api/v1/sessions/{session_id}/sse"
    async with (
        httpx.AsyncClient(timeout=5) as http,
        http.stream("GET", url, params={"since_id": since_id or ""}) as response,
    ):
        if response.status_code == 200:
            return "200 (the resume works)"
        await response.aread()
        return f"{response.status_code} {response.text}"


async def test_sdk_stream_follows_a_whole_turn(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_server(tmp_path, settings) as (_server, client),
    ):
        session = await client.sessions.create(title="sdk stream")
        stream = client.events.stream(session.id)
        async with consuming(stream) as received:
            # Without a cursor the stream starts live. Warm-up turns until the stream
            # has delivered a durable event prove it is subscribed before the turn we
            # follow. (A delta is no proof: the stream subscribes, then reads where it
            # starts, so a warm-up that ends in between can send a delta of a message
            # whose durable events all fall before the start.)
            deadline = time.monotonic() + WAIT
            while not any(e.sequence is not None for e in received):
                assert time.monotonic() < deadline, "the SDK stream never delivered"
                warm = await client.messages.create(session.id, "warm up")
                await wait_sdk_idle(client, session.id, WAIT)
            assert warm.id
            last = (await client.events.list(session.id))[-1]
            assert last.type == "session.idled"
            await wait_for_event(
                received, "the warm-up's end", lambda e: e.id == last.id
            )

            mark = len(received)
            text = "the official client follows this whole turn"
            message = await client.messages.create(session.id, text)
            inputs = of_type("input.message")
            first = await wait_for_event(
                received,
                "input.message",
                lambda e: inputs(e) and e.data["message"]["id"] == message.id,
            )
            turn_id = first.context.turn_id
            assert turn_id is not None
            await wait_for_event(
                received, "session.idled", of_type("session.idled", turn_id)
            )

        turn = received[received.index(first) :]
        assert received[mark] is first
        durable = [e for e in turn if e.type != "output.message.delta"]
        assert [e.type for e in durable] == TURN_EVENTS
        sequences = [e.sequence for e in durable]
        assert all(s is not None for s in sequences)
        assert sequences == list(range(sequences[0], sequences[0] + len(durable)))
        assert all(e.context.turn_id == turn_id for e in durable)

        deltas = [e for e in turn if e.type == "output.message.delta"]
        assert len(deltas) == len(text.split(" "))
        types = [e.type for e in turn]
        assert types.index("output.message.started") < types.index(
            "output.message.delta"
        )
        assert types[::-1].index("output.message.delta") > types[::-1].index(
            "output.message.completed"
        )
        accumulated = ""
        for delta in deltas:
            assert delta.sequence is None
            accumulated += delta.data["delta"]
            assert delta.data["accumulated"] == accumulated
        assert accumulated == text
        completed = next(e for e in durable if e.type == "output.message.completed")
        assert completed.data["message"]["content"][0]["text"] == text
        assert (
            next(e for e in durable if e.type == "turn.completed").data[
                "final_message_id"
            ]
            == completed.data["message"]["id"]
        )

        # The stream saw exactly what the durable log holds for this turn.
        listed = await client.events.list(session.id, after_sequence=sequences[0] - 1)
        assert [(e.id, e.type, e.sequence) for e in listed] == [
            (e.id, e.type, e.sequence) for e in durable
        ]


async def test_sdk_stream_resumes_across_connection_cycles(
    settings: Settings, tmp_path: Path
) -> None:
    async with (
        asyncio.timeout(TEST_DEADLINE),
        sdk_server(
            tmp_path, settings, SSE_CYCLE_SECONDS="1", SCRIPTED_DELAY_MS="20"
        ) as (server, client),
    ):
        session = await client.sessions.create(title="sdk resume")
        # Start the turn first and stream from `since_id` = its first event (which the
        # client therefore has): replay then live tail, so nothing is missed however
        # late the stream connects, and every later event must arrive.
        message = await client.messages.create(session.id, "/scenario long 200")
        listed = await client.events.list(session.id)
        assert listed
        assert listed[0].type == "input.message"
        assert listed[0].data["message"]["id"] == message.id
        turn_id = listed[0].context.turn_id
        assert turn_id is not None

        stream = client.events.stream(session.id, since_id=listed[0].id)
        began = time.monotonic()
        async with consuming(stream) as received:
            try:
                await wait_for_event(
                    received,
                    "session.idled across reconnects",
                    of_type("session.idled", turn_id),
                )
            except AssertionError as exc:
                # Say why: the SDK resumes with `since_id` = the last event it received.
                resume = await probe_resume(server, session.id, stream.last_event_id)
                raise AssertionError(
                    f"{exc}\nThe SDK keeps reconnecting with since_id="
                    f"{stream.last_event_id} (a {received[-1].type} event); the "
                    f"server answers: {resume}"
                ) from None
        took = time.monotonic() - began
        # 200 chunks 20 ms apart: the server cycled the connection several times.
        assert took > 3.0

        events = await client.events.list(session.id)
        sequences = [e.sequence for e in events]
        assert sequences == list(range(1, len(events) + 1))
        durable = [e for e in received if e.sequence is not None]
        seen = {e.sequence for e in durable}
        missing = sorted(set(sequences) - seen - {1})
        assert not missing, f"durable events lost across reconnects: {missing}"
        # Duplicates after a reconnect are allowed by upstream's client contract, but
        # every copy is the same event.
        by_sequence = {e.sequence: e for e in events}
        for event in durable:
            assert event.id == by_sequence[event.sequence].id
            assert event.type == by_sequence[event.sequence].type
        assert [e.type for e in events] == TURN_EVENTS
        deltas = [e for e in received if e.type == "output.message.delta"]
        assert deltas, "no live deltas reached the SDK"
        assert all(d.data["message_id"] for d in deltas)
