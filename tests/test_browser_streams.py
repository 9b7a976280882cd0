"""What a browser needs from the two streams, as regression tests: text offsets in UTF-16
code units (what JavaScript's `String.length` counts), so live text with emoji, flags,
ZWJ sequences, combining marks and CJK is applied delta by delta; and `Last-Event-ID`
winning over the query cursor, which an `EventSource` re-sends unchanged on every
reconnect. (The cycle, `disconnecting` with `retry:` before the close, is in
test_stream_limits.py; a real browser's EventSource in test_chromium.py.)"""

import asyncio
import uuid
from typing import Any

import httpx
import orjson
from hypothesis import given, strategies as st

from app import wire
from app.live.bus import MAX_NOTIFY_BYTES, decode, split_payload
from app.live.items import PartStarted, TextDelta
from app.live.outputs import DeltaOut, PartOut
from app.live.streams import StreamConfig, message_mutations
from tests.support.api import (
    ASTRAL_TEXT,
    create_session,
    list_messages,
    post_message,
    text_of,
    utf16_units,
    uuid_of,
)
from tests.support.in_process import Running
from tests.support.live import text_delta
from tests.support.servers import api_fixture, live_server_fixture
from tests.support.sse import (
    Frame,
    agent_done,
    events,
    expect_connected,
    is_delta,
    open_stream,
    session_streams,
)
from tests.support.waits import wait_idle

# A word every 20 ms, so a client can join while the text streams.
live_server = live_server_fixture("browser-streams", SCRIPTED_DELAY_MS="20")
api = api_fixture()


class BrowserText:
    """A live part's text as a browser holds it: a sequence of UTF-16 code units. A
    delta applies only where the text ends (`offset == text.length`), as docs/streams.md's
    client does; anything else is counted as dropped."""

    def __init__(self, text: str = "") -> None:
        self.units = text.encode("utf-16-le")
        self.applied = 0
        self.dropped: list[dict[str, Any]] = []

    @property
    def length(self) -> int:
        return len(self.units) // 2

    def apply(self, delta: dict[str, Any]) -> None:
        if delta["offset"] == self.length:
            self.units += delta["text"].encode("utf-16-le")
            self.applied += 1
        else:
            self.dropped.append(delta)

    @property
    def text(self) -> str:
        return self.units.decode("utf-16-le")


# ---- UTF-16 offsets, end to end ---------------------------------------------------------


async def test_astral_text_streams_delta_by_delta_in_utf16_offsets(
    api: httpx.AsyncClient,
) -> None:
    """Both streams of one turn echoing ASTRAL_TEXT: on the Mutation stream every delta
    starts where a browser's text ends and the text it builds is the committed one; on
    `/sse` each `accumulated` is the deltas so far. Counted in code points, as the server
    once did, the offsets after the first emoji would not match."""
    sid = await create_session(api)
    async with session_streams(api, sid) as (sse, mutations):
        await post_message(api, sid, ASTRAL_TEXT)
        live = await mutations.until(agent_done, 20)
        upstream = await sse.until(lambda f: f.event == "output.message.completed", 20)
    words = ASTRAL_TEXT.split(" ")

    parts = [f.json() for f in live if f.event == "part"]
    assert [p["part"]["type"] for p in parts] == ["text"], parts
    browser = BrowserText(parts[0]["part"]["text"])
    deltas = [f.json() for f in live if f.event == "delta"]
    for delta in deltas:
        assert delta["part_id"] == parts[0]["part"]["part_id"]
        browser.apply(delta)
    assert browser.dropped == [], browser.dropped
    assert browser.applied == len(deltas) == len(words)
    final = live[-1].json()["message"]
    assert browser.text == text_of(final) == ASTRAL_TEXT
    # The offsets are UTF-16 positions, not code point positions.
    code_points = [len(" ".join(words[:i]) + " ") for i in range(1, len(words))]
    assert [d["offset"] for d in deltas[1:]] != code_points
    assert deltas[-1]["offset"] == utf16_units(ASTRAL_TEXT) - utf16_units(words[-1])

    sse_deltas = [f.json()["data"] for f in upstream if is_delta(f)]
    so_far = ""
    for data in sse_deltas:
        so_far += data["delta"]
        assert data["accumulated"] == so_far
    assert so_far == ASTRAL_TEXT
    completed = upstream[-1].json()["data"]["message"]
    assert text_of(completed) == ASTRAL_TEXT


async def test_a_late_joiner_continues_astral_text_at_its_utf16_length(
    api: httpx.AsyncClient,
) -> None:
    """A client joining mid-stream gets the part with its text so far, then deltas
    starting at that text's UTF-16 length: the offsets of a joiner are computed from
    the live projection, not from the deltas it saw."""
    long_text = " ".join([ASTRAL_TEXT] * 4)
    sid = await create_session(api)
    async with open_stream(api, f"/v1/sessions/{sid}/sse") as observer:
        await expect_connected(observer)
        await post_message(api, sid, long_text)
        for _ in range(8):
            await observer.until(is_delta, 10)
        url = f"/v1/sessions/{sid}/messages/stream"
        async with open_stream(api, url) as joiner:
            frames = events(await joiner.until(agent_done, 30))
    first = frames[0]
    assert first.event == "part", [f.event for f in frames]
    so_far = first.json()["part"]["text"]
    assert so_far
    assert long_text.startswith(so_far)
    browser = BrowserText(so_far)
    deltas = [f.json() for f in frames if f.event == "delta"]
    assert deltas, "joined after the text ended: nothing to continue"
    assert deltas[0]["offset"] == utf16_units(so_far)
    for delta in deltas:
        browser.apply(delta)
    assert browser.dropped == []
    assert browser.text == text_of(frames[-1].json()["message"]) == long_text


# ---- UTF-16 offsets where the server trims and splits -----------------------------------


def _started(session_id: uuid.UUID, message_id: uuid.UUID, text: str) -> PartStarted:
    part = {"part_id": "agent-text:1", "sequence": 1, "type": "text", "text": text}
    return PartStarted(session_id, message_id, 1, None, part)


async def _next(sub: Any) -> Any:
    return await asyncio.wait_for(sub.next(), 5)


async def test_the_fanout_trims_overlapping_deltas_by_utf16_units(
    running: Running,
) -> None:
    """A republished part, then a delta that overlaps it (the runner's republish raced
    its next delta): the fan-out passes on only what is new, cut after the units it
    already holds, and a delta past its text is held back (it missed the start)."""
    fanout = running.app.state.app.fanout
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    sub = fanout.subscribe(session_id)
    try:
        fanout.deliver(_started(session_id, message_id, "a\U0001f600"))
        part = await _next(sub)
        assert isinstance(part, PartOut)
        assert part.text_length == 3
        # Overlaps "a😀" (3 units) and adds "b🇺🇦" after it.
        fanout.deliver(
            text_delta(session_id, message_id, 0, "a\U0001f600b\U0001f1fa\U0001f1e6")
        )
        trimmed = await _next(sub)
        assert isinstance(trimmed, DeltaOut)
        assert (trimmed.delta.offset, trimmed.delta.text) == (
            3,
            "b\U0001f1fa\U0001f1e6",
        )
        assert trimmed.end == 8
        assert (
            orjson.loads(trimmed.mutation_frame.split(b"data: ", 1)[1])["offset"] == 3
        )
        sse = orjson.loads(trimmed.sse_frame.split(b"data: ", 1)[1])["data"]
        assert sse["accumulated"] == "a\U0001f600b\U0001f1fa\U0001f1e6"
        # Wholly known: dropped. Continuing at 8: passed on. Beyond: held back.
        fanout.deliver(text_delta(session_id, message_id, 3, "b"))
        fanout.deliver(text_delta(session_id, message_id, 8, "\u6f22"))
        fanout.deliver(text_delta(session_id, message_id, 10, "x"))
        follows = await _next(sub)
        assert isinstance(follows, DeltaOut)
        assert (follows.delta.offset, follows.end) == (8, 9)
        await asyncio.sleep(0.05)
        assert sub.pending == []
    finally:
        fanout.unsubscribe(sub)
        fanout.projections.pop(message_id, None)


async def test_a_stream_trims_a_delta_it_partly_sent_by_utf16_units(
    running: Running,
) -> None:
    """Generator level: a stream that sent a part with "a😀" (3 units) and then gets a
    delta from offset 1 sends only the rest, at offset 3."""
    state = running.app.state.app
    sid = await create_session(running.client)
    session_id, message_id = uuid_of(sid), uuid.uuid4()
    state.fanout.deliver(_started(session_id, message_id, "a\U0001f600"))
    stream = message_mutations(
        database=state.database,
        fanout=state.fanout,
        session_id=session_id,
        after=None,
        include_internal=False,
        config=StreamConfig(retry_ms=100, cycle_seconds=30),
        release=lambda: None,
    )
    try:
        assert await asyncio.wait_for(anext(stream), 5) == b"retry: 100\n\n"
        first = await asyncio.wait_for(anext(stream), 5)
        assert first.startswith(b"event: part\n"), first
        (sub,) = state.fanout.channels[session_id].subscribers
        delta = text_delta(session_id, message_id, 1, "\U0001f600b\U0001f1fa\U0001f1e6")
        sub.offer(DeltaOut(delta, b"", b"", 8))
        frame = (await asyncio.wait_for(anext(stream), 5)).decode()
        assert frame.startswith("event: delta\n"), frame
        body = orjson.loads(frame.split("data: ", 1)[1])
        assert (body["offset"], body["text"]) == (3, "b\U0001f1fa\U0001f1e6")
    finally:
        await stream.aclose()
        state.fanout.projections.pop(message_id, None)


def test_a_delta_split_for_notify_keeps_utf16_offsets() -> None:
    """A delta too large for one PostgreSQL NOTIFY is cut between code points; each
    piece's offset is where the previous one ends, in UTF-16 units."""
    text = ASTRAL_TEXT * 200
    item = text_delta(uuid.uuid4(), uuid.uuid4(), 7, text)
    pieces = [decode(orjson.loads(chunk)) for chunk in split_payload(item)]
    assert len(pieces) > 2
    offset = 7
    for piece in pieces:
        assert isinstance(piece, TextDelta)
        assert piece.offset == offset
        offset += utf16_units(piece.text)
    assert "".join(p.text for p in pieces if isinstance(p, TextDelta)) == text
    assert all(len(chunk) <= MAX_NOTIFY_BYTES for chunk in split_payload(item))


@given(st.text(), st.text())
def test_utf16_helpers_agree_with_javascript_string_length(
    head: str, tail: str
) -> None:
    # Lone surrogates cannot reach the wire (orjson refuses to encode them).
    head = head.encode("utf-8", "ignore").decode()
    tail = tail.encode("utf-8", "ignore").decode()
    assert wire.utf16_len(head) == utf16_units(head)
    assert wire.utf16_tail(head + tail, utf16_units(head)) == tail


# ---- Last-Event-ID wins over the query cursor -------------------------------------------


async def test_last_event_id_wins_over_the_query_cursor_on_both_streams(
    api: httpx.AsyncClient,
) -> None:
    """An EventSource opened on `?after=0` (or `?after_sequence=0`) reconnects to that
    same URL with the last id it saw in `Last-Event-ID`: it must get what follows that
    id, not the whole session again."""
    sid = await create_session(api)
    await post_message(api, sid, "first")
    await wait_idle(api, sid)
    await post_message(api, sid, "second")
    await wait_idle(api, sid)
    listed = await list_messages(api, sid)
    ids = [m["id"] for m in listed["data"]]
    assert len(ids) == 4

    async def replay(url: str, params: dict[str, str], header: str) -> list[Frame]:
        async with open_stream(
            api, url, params=params, headers={"Last-Event-ID": header}
        ) as stream:
            assert stream.status_code == 200, stream.response.text
            return events(await stream.collect(0.5))

    async def snapshots(url: str, params: dict[str, str], header: str) -> list[Frame]:
        frames = await replay(url, params, header)
        return [f for f in frames if f.event == "message"]

    mutations = f"/v1/sessions/{sid}/messages/stream"
    everything = await snapshots(mutations, {"after": "0"}, "")
    assert [f.json()["message"]["id"] for f in everything] == ids
    cursor = everything[1].id
    assert cursor is not None
    resumed = await snapshots(mutations, {"after": "0"}, cursor)
    assert [f.json()["message"]["id"] for f in resumed] == ids[2:]
    # The hot path (no Origin, open mode) and the /api/v1 mount answer alike.
    resumed = await snapshots(f"/api{mutations}", {"after": "0"}, cursor)
    assert [f.json()["message"]["id"] for f in resumed] == ids[2:]

    sse = f"/v1/sessions/{sid}/sse"
    log = [f for f in await replay(sse, {"after_sequence": "0"}, "") if f.id]
    assert len(log) > 4
    for params in ({"after_sequence": "0"}, {"since_id": log[0].id or ""}):
        resumed = await replay(sse, params, log[3].id or "")
        assert resumed[0].event == "connected"
        assert [f.id for f in resumed[1:]] == [f.id for f in log[4:]]
