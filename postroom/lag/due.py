"""When a retry record is due, as the lag's count of overdue records reads it: its not_before,
decoded with its writer schema from a registry lookup that does not ask again, for a while, for
an id the registry could not give."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from postroom.schemas.codec import EmailRequested, Schema
from postroom.schemas.decoding import decode
from postroom.schemas.errors import SchemaError, SchemaUnavailableError
from postroom.schemas.framing import SchemaById

# A writer schema the registry could not give is not asked for again for this long.
REGISTRY_QUIET_S = 60.0


class QuietLookup:
    """A registry lookup that does not ask again, for REGISTRY_QUIET_S, for an id it could not
    give: a registry that does not answer takes its timeout and retries for each ask, and a
    sample may read many framed records (the head of each retry partition, and the search for
    the first one not due)."""

    def __init__(self, lookup: SchemaById, clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self._clock = clock
        self._failed: dict[int, float] = {}  # schema id -> when the registry could not give it

    def __call__(self, schema_id: int) -> Schema:
        failed_at = self._failed.get(schema_id)
        if failed_at is not None and self._clock() - failed_at < REGISTRY_QUIET_S:
            raise SchemaUnavailableError(f"the registry could not give schema id {schema_id} "
                                         "a moment ago")
        try:
            schema = self._lookup(schema_id)
        except SchemaUnavailableError:
            self._failed[schema_id] = self._clock()
            raise
        self._failed.pop(schema_id, None)
        return schema


def not_before_s(value: bytes | None, headers: list[Any],
                  schema_by_id: SchemaById | None) -> float | None:
    """A retry record's not_before (epoch s), its writer schema from ``schema_by_id`` when it is
    in the Confluent wire format; None when it has none or cannot be read (an unreadable record
    is dead-lettered at once: it is due; so is, for this count, one the registry cannot give
    the schema of now)."""
    try:
        event = decode(EmailRequested, value, headers, schema_by_id=schema_by_id)
    except SchemaError:
        return None
    return event.not_before.timestamp() if event.not_before else None
