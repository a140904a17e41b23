"""The console's pages of dead letters on a real topic: each page reads only the tail it needs
of each partition, newest first, and together the pages show every record once; one letter is
read by its place with its failure history."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer

from postroom.headers import DLQ_CLASS_HEADER, DLQ_REASON_HEADER, ERROR_HEADER
from postroom.relay import dlq_pages
from postroom.settings import Settings
from postroom.topics import dead_letter_topic

# Letters on partitions 0 and 1, and 2 empty: pages merge partitions.
pytestmark = [pytest.mark.integration, pytest.mark.partitions(3)]

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def write(settings: Settings, places: list[tuple[int, int]]) -> None:
    """One unreadable (poison) record per (partition, minute), with two attempts' errors."""
    producer = Producer(settings.kafka_client_config())
    for partition, minute in places:
        producer.produce(
            dead_letter_topic(settings.topic_prefix), key=f"k{partition}-{minute}".encode(),
            value=b"\x07not avro", partition=partition,
            timestamp=int((NOW - dt.timedelta(hours=2) + dt.timedelta(minutes=minute)
                           ).timestamp() * 1000),
            headers=[(ERROR_HEADER, b"attempt=1 451 later"),
                     (ERROR_HEADER, f"attempt=2 550 gone {minute}\nsecond line".encode()),
                     (DLQ_CLASS_HEADER, b"poison"), (DLQ_REASON_HEADER, b"why")])
    assert producer.flush(10) == 0


def test_pages_show_every_letter_once_newest_first(settings: Settings,
                                                   engine: sa.Engine) -> None:
    # Partition 0 holds the even minutes, 1 the odd ones up to 9, 2 nothing.
    places = [(0, m) for m in range(0, 20, 2)] + [(1, m) for m in range(1, 10, 2)]
    write(settings, places)
    seen: list[str] = []
    before = None
    pages = 0
    while True:
        page = dlq_pages.read_dead_letter_page(settings, engine, before, 4)
        assert len(page.letters) <= 4
        seen += [h.letter.key or "" for h in page.letters]
        pages += 1
        if page.before is None:
            break
        before = page.before
    expected = [f"k{p}-{m}" for p, m in sorted(places, key=lambda pm: pm[1], reverse=True)]
    assert seen == expected
    assert pages == 4  # 15 letters, 4 a page


def test_one_letter_by_its_place_with_its_history(settings: Settings, engine: sa.Engine) -> None:
    write(settings, [(1, 5), (1, 6)])
    found = dlq_pages.read_dead_letter_at(settings, engine, 1, 1)
    assert found is not None
    assert found.letter.key == "k1-6" and found.letter.row_status is None
    assert found.errors == ("attempt=1 451 later", "attempt=2 550 gone 6 second line")
    assert dlq_pages.read_dead_letter_at(settings, engine, 1, 2) is None
    assert dlq_pages.read_dead_letter_at(settings, engine, 9, 0) is None
