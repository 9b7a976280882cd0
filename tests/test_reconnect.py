"""Reconnect convergence on the Mutation stream (design 2.5, seed "Ordering, revision,
and reconnects"): a client that follows the seed's rules and is disconnected at random
points always ends with exactly what `GET .../messages` returns."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import (
    HealthCheck,
    Phase,
    given,
    settings as hsettings,
    strategies as st,
)
from sqlalchemy import select

from app.db import models
from app.db.session import Database
from app.journal import checkpoint
from app.journal.sessions import lock_session
from app.live.streams import StreamConfig, message_mutations
from app.settings import Settings
from tests.support.api import (
    ASTRAL_TEXT,
    create_session,
    list_messages,
    post_message,
    utf16_units,
    uuid_of,
)
from tests.support.in_process import Running
from tests.support.servers import Server, api_fixture, live_server_fixture
from tests.support.sse import Frame, SSEStream, expect_connected, is_delta, open_stream
from tests.support.waits import wait_idle, wait_until

# The astral text is echoed one delta a word: offsets in UTF-16 code units, as a
# browser counts them.
SCENARIOS = ["/scenario long 40", "/scenario tool", ASTRAL_TEXT]


# One server per lane for the module, streaming a chunk every 10 ms so random
# disconnects land before, during and after the stream.
live_server = live_server_fixture("reconnect", SCRIPTED_DELAY_MS="10")
api = api_fixture()


# ---- a client following the seed's rules ------------------------------------------


@dataclass
class LiveMessage:
    """The live projection of one streaming message, extending committed `revision`."""

    revision: int
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)


class SeedClient:
    """Subscribe and buffer, then load snapshots; merge snapshots by message_id +
    revision; apply part/delta only while the stream is continuous; after a disconnect
    reload snapshots and resubscribe from the cursor."""

    def __init__(self, api: httpx.AsyncClient, session_id: str) -> None:
        self.api = api
        self.session_id = session_id
        self.committed: dict[str, dict[str, Any]] = {}
        self.live: dict[str, LiveMessage] = {}
        self.cursor: int | None = None
        # (message_id, part_id, text) of every live text the client rendered and then
        # dropped (superseded by a snapshot or abandoned at a disconnect). Each must be a
        # prefix of the committed text: text applied twice or out of place would not be.
        self.rendered: list[tuple[str, str, str]] = []
        self.overlaps: list[dict[str, Any]] = []
        self.gaps = 0
        self.applied = 0
        self.log: list[str] = []
        self.final_view: list[dict[str, Any]] | None = None
        # `turn` and `session` Mutations: the mutation_ids applied, each turn's status
        # and the session's.
        self.changes: set[str] = set()
        self.turns: dict[str, str] = {}
        self.session_status: str | None = None

    # snapshots
    def merge(self, snapshot: dict[str, Any]) -> None:
        message_id = snapshot["id"]
        known = self.committed.get(message_id)
        if known is None or snapshot["revision"] > known["revision"]:
            self.committed[message_id] = snapshot
        elif snapshot["revision"] == known["revision"]:
            assert snapshot == known, (
                f"two different snapshots of {message_id} at revision "
                f"{snapshot['revision']}: {known} != {snapshot}"
            )
        live = self.live.get(message_id)
        if live is not None and live.revision < self.committed[message_id]["revision"]:
            self._drop(message_id)

    def _drop(self, message_id: str) -> None:
        live = self.live.pop(message_id, None)
        if live is None:
            return
        for part_id, part in live.parts.items():
            if isinstance(part.get("text"), str):
                self.rendered.append((message_id, part_id, part["text"]))

    async def load_snapshots(self) -> None:
        page = await list_messages(self.api, self.session_id)
        for message in page["data"]:
            self.merge(message)
        cursor = int(page["cursor"])
        self.cursor = cursor if self.cursor is None else max(self.cursor, cursor)

    # live frames
    def apply(self, frame: Frame) -> None:
        if frame.is_comment:
            return
        body = frame.json()
        self.log.append(f"{frame.event} {frame.id or ''} {frame.data}"[:160])
        if frame.event == "message":
            self.merge(body["message"])
            if frame.id is not None:
                position = int(frame.id)
                self.cursor = (
                    position if self.cursor is None else max(self.cursor, position)
                )
        elif frame.event == "part":
            self._part(body)
        elif frame.event == "delta":
            self._delta(body)
        elif frame.event in ("turn", "session"):
            self._change(frame.event, body)
        elif frame.event == "reset":
            raise ResetRequested(body.get("reason", ""))
        elif frame.event == "disconnecting":
            pass  # the server closes the stream next; the client reconnects
        else:
            raise AssertionError(f"unexpected frame on the Mutation stream: {frame}")

    def _change(self, event: str, body: dict[str, Any]) -> None:
        """A turn or session change: a replay may send one again (same mutation_id),
        and a turn never runs again once it ended."""
        assert body["session_id"] == self.session_id
        if body["mutation_id"] in self.changes:
            return
        self.changes.add(body["mutation_id"])
        if event == "session":
            self.session_status = body.get("status", self.session_status)
            return
        ended = self.turns.get(body["turn_id"]) not in (None, "running")
        assert not ended, f"turn {body['turn_id']} changed after it ended: {body}"
        self.turns[body["turn_id"]] = body["status"]

    def _part(self, body: dict[str, Any]) -> None:
        message_id, revision = body["message_id"], body["revision"]
        known = self.committed.get(message_id)
        if known is not None and known["revision"] > revision:
            return  # the live projection of an older revision: already committed
        live = self.live.get(message_id)
        if live is None or live.revision < revision:
            self._drop(message_id)
            live = LiveMessage(revision)
            self.live[message_id] = live
        elif live.revision > revision:
            return
        part = dict(body["part"])
        previous = live.parts.get(part["part_id"])
        if previous is not None and isinstance(previous.get("text"), str):
            self.rendered.append((message_id, part["part_id"], previous["text"]))
        live.parts[part["part_id"]] = part

    def _delta(self, body: dict[str, Any]) -> None:
        live = self.live.get(body["message_id"])
        if live is None or live.revision != body["revision"]:
            return
        part = live.parts.get(body["part_id"])
        if part is None:
            return
        text = part.get("text", "")
        # Offsets count UTF-16 code units (what a browser's String.length counts).
        length = utf16_units(text)
        if body["offset"] == length:
            part["text"] = text + body["text"]
            self.applied += 1
        elif body["offset"] < length:
            # A continuous stream never repeats text it already sent for a part.
            self.overlaps.append(body)
        else:
            # A gap: this part cannot continue; wait for its snapshot.
            self.gaps += 1
            self.rendered.append((body["message_id"], body["part_id"], text))
            del live.parts[body["part_id"]]

    def disconnected(self) -> None:
        """Deltas cannot be replayed: live projections are abandoned, snapshots stay."""
        for message_id in list(self.live):
            self._drop(message_id)

    # what the client shows
    def messages(self) -> list[dict[str, Any]]:
        return sorted(self.committed.values(), key=lambda m: m["sequence"])

    def render(self) -> list[dict[str, Any]]:
        """The messages as the client shows them: each committed snapshot, plus the
        live parts that extend exactly that revision."""
        out = []
        for message in self.messages():
            live = self.live.get(message["id"])
            if live is not None and live.revision == message["revision"]:
                committed = {p["part_id"] for p in message["content"]}
                extra = [p for i, p in live.parts.items() if i not in committed]
                message = {**message, "content": [*message["content"], *extra]}
            out.append(message)
        return out

    def turn_done(self) -> bool:
        messages = self.messages()
        return (
            any(m["role"] == "agent" for m in messages)
            and all(m["state"] == "done" for m in messages)
            and messages[-1]["role"] == "agent"
        )

    # one connection
    async def connect(
        self,
        *,
        stop: "Stop",
        post: str | None = None,
        post_when: str = "before",
    ) -> None:
        url = f"/v1/sessions/{self.session_id}/messages/stream"
        params = {"after": str(self.cursor)} if self.cursor is not None else None
        if post is not None and post_when == "before":
            await post_message(self.api, self.session_id, post)
        try:
            async with open_stream(self.api, url, params=params) as stream:
                assert stream.status_code == 200, stream.response.text
                if post is not None and post_when == "subscribed":
                    await post_message(self.api, self.session_id, post)
                if stop.kind == "before_snapshot":
                    if post is not None and post_when == "loaded":
                        await post_message(self.api, self.session_id, post)
                    return
                await self.load_snapshots()
                if post is not None and post_when == "loaded":
                    await post_message(self.api, self.session_id, post)
                await self._follow(stream, stop)
        except ResetRequested:
            self.disconnected()
            await self.load_snapshots()
        finally:
            self.disconnected()

    async def _follow(self, stream: SSEStream, stop: "Stop") -> None:
        deadline = time.monotonic() + (20.0 if stop.kind == "final" else 1.5)
        if stop.kind == "sleep":
            deadline = time.monotonic() + stop.count / 100
        seen = deltas = 0
        while True:
            if stop.kind == "final" and self.turn_done():
                self.final_view = self.render()
                return
            if stop.kind == "frames" and seen >= stop.count:
                return
            if stop.kind == "deltas" and deltas >= stop.count:
                return
            try:
                frame = await stream.next(deadline - time.monotonic())
            except TimeoutError:
                if stop.kind == "final":
                    raise AssertionError(
                        f"the client did not see the turn end: {self.log[-20:]}"
                    ) from None
                return
            if frame is None:
                return  # the server cycled the connection
            if frame.is_comment:
                continue
            seen += 1
            deltas += frame.event == "delta"
            self.apply(frame)


class ResetRequested(Exception):
    pass


@dataclass
class Stop:
    """When a connection is dropped: after `count` frames or deltas, after `count`
    hundredths of a second, right after subscribing (before the snapshot loads), or
    at the end of the turn; then the client stays offline for `offline_ms`."""

    kind: str
    count: int = 0
    offline_ms: int = 0


def check_converged(client: SeedClient, listed: dict[str, Any], plan: Any) -> None:
    context = f"plan={plan} log={client.log[-30:]}"
    # What the client shows when it sees the turn end is exactly the listed state.
    assert client.final_view == listed["data"], context
    assert client.messages() == listed["data"], context
    ids = [m["id"] for m in listed["data"]]
    assert len(ids) == len(set(ids)), context
    assert not client.overlaps, f"text repeated on a continuous stream: {context}"
    final = {
        (m["id"], p["part_id"]): p.get("text")
        for m in listed["data"]
        for p in m["content"]
    }
    for message_id, part_id, text in client.rendered:
        committed = final.get((message_id, part_id))
        assert isinstance(committed, str), (message_id, part_id, context)
        assert committed.startswith(text), (
            f"rendered live text {text!r} is not a prefix of the committed "
            f"{committed!r}: {context}"
        )


async def run_plan(
    api: httpx.AsyncClient,
    scenario: str,
    post_when: str,
    stops: list[Stop],
) -> SeedClient:
    session_id = await create_session(api)
    client = SeedClient(api, session_id)
    for index, stop in enumerate([*stops, Stop("final")]):
        await client.connect(
            stop=stop,
            post=scenario if index == 0 else None,
            post_when=post_when,
        )
        if stop.offline_ms:
            await asyncio.sleep(stop.offline_ms / 1000)
    await wait_idle(api, session_id)
    listed = await list_messages(api, session_id)
    check_converged(client, listed, (scenario, post_when, stops))
    assert client.turn_done()
    return client


stops_strategy = st.lists(
    st.builds(
        Stop,
        kind=st.sampled_from(["frames", "deltas", "sleep", "before_snapshot"]),
        count=st.integers(0, 45),
        offline_ms=st.sampled_from([0, 0, 5, 30, 120]),
    ),
    min_size=1,
    max_size=4,
)


@hsettings(
    max_examples=15,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    scenario=st.sampled_from(SCENARIOS),
    post_when=st.sampled_from(["before", "subscribed", "loaded"]),
    stops=stops_strategy,
)
def test_seed_client_converges_despite_random_disconnects(
    live_server: Server, scenario: str, post_when: str, stops: list[Stop]
) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=10) as api:
            await asyncio.wait_for(run_plan(api, scenario, post_when, stops), 60)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("scenario", "stops"),
    [
        # Dropped between subscribe and snapshot, then mid-delta twice.
        (
            "/scenario long 40",
            [Stop("before_snapshot"), Stop("deltas", 5), Stop("deltas", 9, 30)],
        ),
        # Dropped around the tool transitions.
        (
            "/scenario tool",
            [Stop("deltas", 2), Stop("frames", 3, 5), Stop("sleep", 60)],
        ),
        # Dropped mid-text after astral characters: the live text it rendered is a
        # prefix of the committed one, and every delta of a connection applies.
        (ASTRAL_TEXT, [Stop("deltas", 3), Stop("deltas", 4, 5)]),
    ],
)
async def test_seed_client_converges_on_fixed_plans(
    api: httpx.AsyncClient, scenario: str, stops: list[Stop]
) -> None:
    client = await run_plan(api, scenario, "loaded", stops)
    assert client.applied > 0
    # A continuous stream never leaves a gap: each delta starts where the client's
    # text ends, counted as a browser counts it.
    assert client.gaps == 0, client.log[-30:]


async def test_late_joiner_gets_the_text_so_far_then_the_rest(
    api: httpx.AsyncClient,
) -> None:
    session_id = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{session_id}/sse") as observer:
        await expect_connected(observer)
        await post_message(api, session_id, "/scenario long 40")
        seen = ""
        for _ in range(10):
            frames = await observer.until(is_delta, 10)
            seen = frames[-1].json()["data"]["accumulated"]
        url = f"/v1/sessions/{session_id}/messages/stream"
        async with open_stream(api, url) as joiner:

            def closed(frame: Frame) -> bool:
                return frame.event == "message" and (
                    frame.json()["message"]["state"] == "done"
                )

            frames = [f for f in await joiner.until(closed, 20) if not f.is_comment]
    first = frames[0]
    assert first.event == "part", [f.event for f in frames]
    part = first.json()
    assert part["revision"] == 1
    assert part["part"]["type"] == "text"
    so_far: str = part["part"]["text"]
    assert so_far.startswith(seen), (so_far, seen)
    assert len(so_far) >= len(seen) > 0
    text = so_far
    for frame in frames[1:-1]:
        assert frame.event == "delta", frame
        delta = frame.json()
        assert delta["message_id"] == part["message_id"]
        assert delta["part_id"] == part["part"]["part_id"]
        assert delta["offset"] == utf16_units(text)
        text += delta["text"]
    final = frames[-1].json()["message"]
    assert final["id"] == part["message_id"]
    assert final["content"][0]["text"] == text
    assert text == "".join(f"chunk{i} " for i in range(40))
    await wait_idle(api, session_id)
    listed = await list_messages(api, session_id)
    assert listed["data"][-1] == final


async def test_resume_replays_the_latest_snapshot_of_each_changed_message(
    api: httpx.AsyncClient,
) -> None:
    session_id = await create_session(api)
    await post_message(api, session_id, "/scenario tool resume")
    await wait_idle(api, session_id)
    listed = await list_messages(api, session_id)
    user, agent = listed["data"]
    url = f"/v1/sessions/{session_id}/messages/stream"

    async def replay(
        params: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> list[Frame]:
        async with open_stream(api, url, params=params, headers=headers) as stream:
            assert stream.status_code == 200
            # The replay comes at once; then only keep-alive comments.
            return [f for f in await stream.collect(0.5) if not f.is_comment]

    replayed = await replay({"after": "0"})
    # The turn's and the session's changes come too, each after the snapshots of its
    # checkpoint (they carry no cursor).
    assert [(f.event, f.json().get("status")) for f in replayed] == [
        ("message", None),
        ("session", "active"),
        ("turn", "running"),
        ("message", None),
        ("turn", "completed"),
        ("session", "idle"),
    ]
    everything = [f for f in replayed if f.event == "message"]
    # Each changed message once, at its latest revision (not its history), with its
    # cursor as `id:`.
    assert [f.json()["message"] for f in everything] == [user, agent]
    cursors = [int(f.id or "") for f in everything]
    assert cursors == sorted(cursors)
    assert cursors[-1] <= int(listed["cursor"])
    after_user = await replay({"after": str(cursors[0])})
    assert [f.event for f in after_user] == ["message", "turn", "session"]
    assert after_user[0].json()["message"] == agent
    by_header = await replay(headers={"Last-Event-ID": str(cursors[0])})
    assert [(f.event, f.data) for f in by_header] == [
        (f.event, f.data) for f in after_user
    ]
    assert await replay({"after": listed["cursor"]}) == []
    # A cursor from the future cannot be honoured: reset, reload snapshots.
    ahead = await replay({"after": str(int(listed["cursor"]) + 100)})
    assert [f.event for f in ahead] == ["reset"]
    assert ahead[0].json() == {"reason": "cursor_ahead"}
    # Not a cursor at all.
    async with open_stream(api, url, params={"after": "abc"}) as refused:
        assert refused.status_code == 400
        assert refused.response.json()["status"] == 400


@pytest.mark.parametrize("start_turn", [False, True], ids=["message", "turn"])
async def test_checkpoint_committed_after_subscribing_is_delivered(
    running: Running, settings: Settings, start_turn: bool
) -> None:
    """Generator level. The seed's client subscribes, then loads its snapshot. A message
    that commits after that load must reach it on the stream, even when the stream's
    own first read (its starting position) happens after the commit; and when the
    message starts a turn, so must the session's `active` Mutation, whose event comes
    before the checkpoint's last sequence. The app's pool is held busy so that the
    interleaving is deterministic; the client's snapshot read and the commit go through
    a second Database on the same file or server, with the app's bus as commit hook,
    exactly as the app's own writes do."""
    state = running.app.state.app
    session_id = await create_session(running.client)
    session_uuid = uuid_of(session_id)
    other = Database.from_settings(settings)
    other.hooks = state.bus
    pool = state.database.reader.pool
    held = []
    stream = message_mutations(
        database=state.database,
        fanout=state.fanout,
        session_id=session_uuid,
        after=None,
        include_internal=False,
        config=StreamConfig(retry_ms=100, cycle_seconds=30),
        release=lambda: None,
    )
    first: asyncio.Task[bytes] | None = None
    try:
        # Every connection the pool will hand out (QueuePool keeps max_overflow private).
        limit = pool.size() + pool._max_overflow
        while pool.checkedout() < limit:
            held.append(await state.database.reader.connect())
        # Subscribe: the stream registers and says so (its `retry:` comes before any
        # read), then waits for a connection.
        assert await asyncio.wait_for(anext(stream), 3) == b"retry: 100\n\n"
        first = asyncio.ensure_future(anext(stream))
        await wait_until(
            lambda: state.fanout.count(session_uuid) > 0,
            "the stream to subscribe",
            within=5,
            interval=0.01,
        )
        # Load the snapshot (the rows GET .../messages serves): empty.
        async with other.read() as db:
            snapshot = (
                await db.scalars(
                    select(models.Message.snapshot).where(
                        models.Message.session_id == session_uuid
                    )
                )
            ).all()
        assert list(snapshot) == []
        # A message commits after the client's snapshot.
        async with other.write() as db:
            session = await lock_session(db, session_uuid)
            assert session is not None
            committed, _ = await checkpoint.append_user_message(
                db,
                session,
                content=[{"type": "text", "text": "after your snapshot"}],
                visibility="visible",
                extra={},
                client_message_id=None,
                start_turn=start_turn,
            )
            assert committed.message is not None
            message_id = f"message_{committed.message.id.hex}"
    finally:
        for connection in held:
            await connection.close()
    try:
        try:
            chunk = await asyncio.wait_for(first, 3)
        except TimeoutError:
            pytest.fail(
                "a message committed after the client subscribed and loaded its "
                "snapshot never reached the Mutation stream: the client cannot converge"
            )
        frame = chunk.decode()
        assert frame.startswith("event: message\n"), frame
        assert message_id in frame
        if start_turn:
            sent = frame
            async with asyncio.timeout(3):
                while "event: session\n" not in sent:
                    sent += (await anext(stream)).decode()
            session_frame = sent[sent.index("event: session\n") :].split("\n\n")[0]
            assert '"status":"active"' in session_frame, sent
    finally:
        if first is not None and not first.done():
            first.cancel()
        await stream.aclose()
        await other.dispose()


async def test_seed_client_converges_through_a_client_side_tool_wait(
    api: httpx.AsyncClient,
) -> None:
    """A turn that waits for a client-side tool result and then goes on: the client
    converges to the list while the session waits (the tool awaiting the client in an
    open message) and again after the result, across reconnects on either side."""
    weather = {
        "type": "client_side",
        "name": "get_weather",
        "description": "The weather",
        "parameters": {"type": "object"},
    }
    created = await api.post("/v1/sessions", json={"tools": [weather]})
    session_id = created.json()["id"]
    client = SeedClient(api, session_id)
    await client.connect(
        stop=Stop("sleep", 80),
        post='/scenario call get_weather {"city": "Kyiv"}',
        post_when="loaded",
    )

    async def waiting() -> bool:
        session = await api.get(f"/v1/sessions/{session_id}")
        return bool(session.json()["status"] == "waitingfortoolresults")

    await wait_until(waiting, "the session to wait for the tool result")
    await client.connect(stop=Stop("sleep", 30))
    listed = await list_messages(api, session_id)
    assert client.messages() == listed["data"]
    agent = listed["data"][-1]
    call = next(p for p in agent["content"] if p["type"] == "tool_call")
    assert (agent["state"], call["status"]) == ("streaming", "awaiting_client")

    answered = await api.post(
        f"/v1/sessions/{session_id}/tool-results",
        json={"tool_results": [{"tool_call_id": call["id"], "result": "sunny"}]},
    )
    assert answered.status_code == 200, answered.text
    await client.connect(stop=Stop("final"))
    await wait_idle(api, session_id)
    listed = await list_messages(api, session_id)
    check_converged(client, listed, "client-side tool")
    statuses = [
        p["status"] for p in listed["data"][-1]["content"] if p["type"] == "tool_call"
    ]
    assert statuses == ["completed"]


async def test_seed_client_converges_through_an_approval(
    api: httpx.AsyncClient,
) -> None:
    """A tool that waits for approval, approved while the client is away: the client
    converges while the interaction is pending and after the turn ends."""
    guarded = {
        "type": "builtin",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object"},
        "policy": "requires_approval",
    }
    created = await api.post("/v1/sessions", json={"tools": [guarded]})
    session_id = created.json()["id"]
    client = SeedClient(api, session_id)
    await client.connect(
        stop=Stop("sleep", 80),
        post='/scenario call lookup {"query": "tea"}',
        post_when="loaded",
    )
    found: list[dict[str, Any]] = []

    async def pending() -> bool:
        response = await api.get(
            f"/v1/sessions/{session_id}/interactions", params={"status": "pending"}
        )
        found[:] = response.json()["data"]
        return bool(found)

    await wait_until(pending, "a pending interaction")
    await client.connect(stop=Stop("sleep", 30))
    assert client.messages() == (await list_messages(api, session_id))["data"]
    decided = await api.post(
        f"/v1/sessions/{session_id}/interactions/{found[0]['interaction_id']}",
        json={"decision": "approve"},
    )
    assert decided.status_code == 200, decided.text
    await client.connect(stop=Stop("final"))
    await wait_idle(api, session_id)
    check_converged(client, await list_messages(api, session_id), "approval")


async def test_seed_client_converges_through_an_action_mid_step(
    api: httpx.AsyncClient,
) -> None:
    """A PATCH while the step streams commits an Action to the streaming message: the
    client drops its live projection for the new snapshot, gets the step's parts again
    at the new revision, follows the rest of the step there, and converges."""
    session_id = (await api.post("/v1/sessions", json={})).json()["id"]
    client = SeedClient(api, session_id)

    async def change_mid_step() -> None:
        await wait_until(lambda: client.applied >= 10, "deltas to flow")
        response = await api.patch(
            f"/v1/sessions/{session_id}", json={"approval_mode": "always-allow"}
        )
        assert response.status_code == 200, response.text

    change = asyncio.create_task(change_mid_step())
    try:
        await client.connect(
            stop=Stop("final"), post="/scenario long 150", post_when="loaded"
        )
        await change
    finally:
        change.cancel()
    await wait_idle(api, session_id)
    listed = await list_messages(api, session_id)
    check_converged(client, listed, "action mid-step")
    agent = listed["data"][-1]
    assert [p["type"] for p in agent["content"]] == ["action", "text"]
    # Opened at revision 1, the Action is 2, the step commits as 3: the live text
    # went on at revision 2 (deltas' mutation ids are message/revision/part/offset).
    revisions = {
        line.split('"mutation_id":"', 1)[1].split("/")[1]
        for line in client.log
        if line.startswith("delta ")
    }
    assert revisions == {"1", "2"}, revisions
    assert agent["revision"] == 3
