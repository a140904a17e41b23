"""Tables for the commit point: never past a record still in flight, whatever order sends finish in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from postroom.sender.offsets import OffsetBook, PartitionProgress

TP = ("postroom.email.normal", 0)
OTHER = ("postroom.email.normal", 1)


@pytest.mark.parametrize(("taken", "finished", "point"), [
    ([], [], None),                       # nothing read yet: nothing to commit
    ([5], [], 5),                         # one in flight: redeliver it after a crash
    ([5], [5], 6),                        # done: the next one to read
    ([5, 6, 7], [6, 7], 5),               # the oldest still sends: hold the point at it
    ([5, 6, 7], [5], 6),
    ([5, 6, 7], [5, 7], 6),
    ([5, 6, 7], [7, 6, 5], 8),            # finished out of order, all done
    ([3, 9], [3], 9),                     # a gap (compaction, a held retry record) is fine
    ([9, 3], [9], 3),                     # taken out of order after a rewind
    ([0], [0], 1),                        # offset 0 is a real offset, not "none"
])
def test_commit_point(taken: list[int], finished: list[int], point: int | None) -> None:
    progress = PartitionProgress()
    for offset in taken:
        progress.take(offset)
    for offset in finished:
        progress.finish(offset)
    assert progress.commit_point() == point


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=200))
def test_the_commit_point_is_the_lowest_offset_in_flight(steps: list[tuple[bool, int]]) -> None:
    """Takes and finishes in any order, rewinds and doubled finishes included: the point is the
    lowest offset in flight, or one past the highest taken."""
    progress = PartitionProgress()
    in_flight: set[int] = set()
    highest: int | None = None
    for take, offset in steps:
        if take:
            progress.take(offset)
            in_flight.add(offset)
            highest = max(highest if highest is not None else offset, offset)
        else:
            progress.finish(offset)
            in_flight.discard(offset)
        expected = min(in_flight) if in_flight else (None if highest is None else highest + 1)
        assert progress.commit_point() == expected


@pytest.mark.parametrize(("taken", "finishes"), [
    ([10, 11, 12], [(11, 10), (10, 12), (12, 13)]),
    ([4], [(4, 5)]),
    ([1, 2], [(1, 2), (1, 2), (2, 3)]),   # a doubled finish changes nothing
])
def test_the_book_gives_the_point_to_store_after_each_finish(
        taken: list[int], finishes: list[tuple[int, int]]) -> None:
    book = OffsetBook()
    for offset in taken:
        book.take(TP, offset)
    assert [book.finish(TP, offset) for offset, _ in finishes] == [point for _, point in finishes]


def test_partitions_are_kept_apart() -> None:
    book = OffsetBook()
    book.take(TP, 1)
    book.take(OTHER, 100)
    assert book.finish(OTHER, 100) == 101
    assert book.revoke(TP) == 1


def test_a_revoked_partition_is_forgotten() -> None:
    book = OffsetBook()
    book.take(TP, 7)
    book.take(TP, 8)
    assert book.finish(TP, 8) == 7
    assert book.revoke(TP) == 7
    # A task of the lost assignment finishing later must not store anything.
    assert book.finish(TP, 7) is None
    assert book.revoke(TP) is None


def test_reassigned_partition_starts_afresh() -> None:
    book = OffsetBook()
    book.take(TP, 7)
    book.revoke(TP)
    book.take(TP, 20)
    assert book.finish(TP, 7) == 20   # the old task's offset is not in flight any more
    assert book.finish(TP, 20) == 21
