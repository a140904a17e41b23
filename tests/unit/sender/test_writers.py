"""postroom.sender.writers: the registry is asked for a batch's new writer schemas off the event
loop, once."""

from __future__ import annotations

import asyncio
import struct
import threading
import time

import pytest

from postroom.kafka import Record
from postroom.schemas.codec import Schema, load_schema
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SCHEMA_HEADER
from postroom.sender.writers import WriterSchemas

SCHEMA = load_schema("email_requested")


def framed(schema_id: int, offset: int = 0) -> Record:
    return Record("t", 0, offset, b"k", b"\0" + struct.pack(">I", schema_id) + b"body", [])


class Registry:
    """A registry lookup that takes ``delay_s`` and knows the ids in ``known``."""

    def __init__(self, known: set[int], delay_s: float = 0.0) -> None:
        self.known = known
        self.delay_s = delay_s
        self.asked: list[int] = []
        self.threads: set[str] = set()

    def __call__(self, schema_id: int) -> Schema:
        self.asked.append(schema_id)
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        if schema_id not in self.known:
            raise SchemaError(f"the schema registry has no schema id {schema_id}")
        return SCHEMA


def test_a_slow_lookup_does_not_hold_up_the_event_loop() -> None:
    registry = Registry({7}, delay_s=0.5)
    writers = WriterSchemas(registry)

    async def run() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1
        ticker = asyncio.ensure_future(tick())
        lookup = await writers.for_batch([framed(7), framed(7, 1)])
        ticker.cancel()
        assert lookup(7) is SCHEMA
        return ticks

    assert asyncio.run(run()) >= 10  # the loop went on while the registry took 0.5 s
    assert registry.asked == [7]
    assert threading.main_thread().name not in registry.threads


def test_an_id_is_asked_for_once_then_answered_from_what_was_found() -> None:
    registry = Registry({7, 8})
    writers = WriterSchemas(registry)

    async def run() -> None:
        first = await writers.for_batch([framed(7)])
        second = await writers.for_batch([framed(7), framed(8)])
        assert first(7) is SCHEMA and second(7) is SCHEMA and second(8) is SCHEMA

    asyncio.run(run())
    assert registry.asked == [7, 8]


def test_an_id_the_registry_could_not_give_fails_its_records_without_asking_again() -> None:
    registry = Registry({7})
    writers = WriterSchemas(registry)

    async def run() -> None:
        lookup = await writers.for_batch([framed(7), framed(9)])
        with pytest.raises(SchemaError, match="no schema id 9"):
            lookup(9)
        assert lookup(7) is SCHEMA

    asyncio.run(run())
    assert registry.asked == [7, 9]  # 9 once, in the thread: not again when its record decodes


def test_records_not_in_the_confluent_wire_format_ask_nothing() -> None:
    registry = Registry(set())
    writers = WriterSchemas(registry)
    schemaless = Record("t", 0, 0, b"k", b"\0\0\0\0\1body", [(SCHEMA_HEADER, b"fingerprint")])
    unframed = Record("t", 0, 1, b"k", b"{not avro}", [])
    empty = Record("t", 0, 2, b"k", None, [])
    asyncio.run(writers.for_batch([schemaless, unframed, empty]))
    assert registry.asked == []
