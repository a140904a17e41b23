"""The writer schemas of a batch of records, looked up before the batch is decoded.

A record in the Confluent wire format names its writer schema by registry id. An id this process
has not seen is asked of the registry, which may take its timeout and retries to answer (tens of
seconds while it is down). Asked on the event loop, that would hold up every send in flight, and
the ``sent`` mark of every reply already read, for as long. So the new ids of a batch are asked
for in a worker thread while the loop goes on, and the batch is then decoded from the answers,
without asking again: an id the registry could not give raises its error when the batch is
decoded (SchemaError: poison; SchemaUnavailableError: the record waits, sender/service.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from postroom.kafka import Record
from postroom.schemas.codec import Schema
from postroom.schemas.errors import SchemaError
from postroom.schemas.framing import SchemaById, confluent_schema_id


class WriterSchemas:
    """Registry lookups kept off the event loop; ``lookup`` is the registry's (blocking) one."""

    def __init__(self, lookup: SchemaById) -> None:
        self._lookup = lookup
        self._known: dict[int, Schema] = {}

    async def for_batch(self, records: Iterable[Record]) -> SchemaById:
        """A lookup that answers every id ``records`` name without blocking: each one not known
        yet is asked for in a worker thread first."""
        failed: dict[int, SchemaError] = {}
        new = {schema_id for record in records
               if (schema_id := confluent_schema_id(record.value, record.headers)) is not None
               and schema_id not in self._known}
        for schema_id in sorted(new):
            try:
                self._known[schema_id] = await asyncio.to_thread(self._lookup, schema_id)
            except SchemaError as exc:
                failed[schema_id] = exc
        if not failed:
            return self._writer

        def writer(schema_id: int) -> Schema:
            exc = failed.get(schema_id)
            if exc is not None:
                raise exc
            return self._writer(schema_id)
        return writer

    def _writer(self, schema_id: int) -> Schema:
        known = self._known.get(schema_id)
        return known if known is not None else self._lookup(schema_id)
