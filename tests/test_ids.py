"""Wire ids: UUIDv7 minted in one process sort in the order they were minted; event ids
and event times minted per live delta take the fast path to the same forms."""

import itertools
import os
import time
from datetime import UTC, datetime

import pytest

from app import ids, wire


def test_ids_minted_in_one_millisecond_sort_in_minting_order() -> None:
    minted = [ids.uuid7() for _ in range(10_000)]
    assert minted == sorted(minted)
    assert len(set(minted)) == len(minted)
    # Most of them share a millisecond with the one before: the counter was exercised.
    same_ms = sum(a.int >> 80 == b.int >> 80 for a, b in itertools.pairwise(minted))
    assert same_ms > 1000
    for value in minted[:100]:
        assert value.version == 7
        assert value.variant == "specified in RFC 4122"


def test_ids_stay_ordered_when_the_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = ids.uuid7()
    now = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: now - 5_000_000_000)
    later = [ids.uuid7() for _ in range(100)]
    assert [first, *later] == sorted([first, *later])


def test_a_full_counter_moves_the_timestamp_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: now)
    first = ids.uuid7()
    monkeypatch.setattr(ids, "_last_random", (1 << ids._RANDOM_BITS) - 2)
    second = ids.uuid7()
    assert second > first
    assert second.int >> 80 == (first.int >> 80) + 1


def test_event_ids_are_uuid7_in_the_wire_form_and_share_their_order() -> None:
    minted = [ids.event_id() for _ in range(1_000)]
    assert minted == sorted(minted)
    for text in minted[:50]:
        value = ids.parse_id("event", text)
        assert value.version == 7
        assert ids.format_id("event", value) == text
    # Ordered with the UUIDs minted around them.
    before, event, after = ids.uuid7(), ids.event_id(), ids.uuid7()
    assert before < ids.parse_id("event", event) < after


def test_the_event_time_of_now_is_the_millisecond_of_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for ms in (1_733_312_128_005, 1_733_312_128_999, 1_733_312_129_000, 0):
        monkeypatch.setattr(time, "time_ns", lambda ms=ms: ms * 1_000_000 + 999_999)
        moment = datetime.fromtimestamp(ms // 1000, UTC).replace(
            microsecond=ms % 1000 * 1000 + 999
        )
        assert wire.event_now() == wire.event_ts(moment)


def test_random_ids_are_version_4_and_distinct_across_blocks() -> None:
    # Several blocks of the OS's random bytes: no id repeats where one block ends.
    minted = [ids.uuid4() for _ in range(3 * ids._BLOCK // 16 + 7)]
    assert len(set(minted)) == len(minted)
    for value in minted:
        assert value.version == 4
        assert value.variant == "specified in RFC 4122"
    # Every one of the 122 random bits takes both values.
    ones = 0
    zeros = 0
    for value in minted:
        ones |= value.int
        zeros |= ~value.int
    fixed = (0xF << 76) | (0b11 << 62)
    assert ones | fixed == (1 << 128) - 1
    assert zeros & ((1 << 128) - 1) | fixed == (1 << 128) - 1


def test_a_forked_child_does_not_mint_its_parents_next_ids() -> None:
    ids.uuid4()  # the parent holds a block
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        os.write(write, ids.uuid4().bytes + ids.uuid7().bytes)
        os._exit(0)
    os.close(write)
    try:
        received = b""
        while len(received) < 32:
            chunk = os.read(read, 32 - len(received))
            assert chunk, "the child wrote nothing"
            received += chunk
    finally:
        os.close(read)
        os.waitpid(child, 0)
    assert ids.uuid4().bytes != received[:16]
    assert (ids.uuid7().int & ((1 << 62) - 1)) != (
        int.from_bytes(received[16:], "big") & ((1 << 62) - 1)
    )
