"""Wire ids: UUIDv7 minted in one process sort in the order they were minted."""

import itertools
import time

import pytest

from app import ids


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
