"""What one relay round claimed and what became of it, and the relay's running counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa


@dataclasses.dataclass
class RelayStats:
    published: int = 0
    failed: int = 0
    rounds: int = 0
    errors: int = 0
    poison: int = 0
    suppressed: int = 0


@dataclasses.dataclass(frozen=True)
class Sent:
    """What became of a round's claimed rows, by id: acknowledged, to release (not
    acknowledged), too large ever to publish, and refused as poison (with the reason)."""

    acked: list[int]
    released: list[int]
    too_large: list[int] = dataclasses.field(default_factory=list)
    poison: list[tuple[int, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A round's claimed rows to publish (those to suppressed addresses finished already),
    whether the claim took a whole batch (then more rows are likely due at once), and the owner
    key the claim wrote: the marks of these rows act only on queue entries it still names."""

    rows: Sequence[sa.Row[Any]]
    full: bool
    owner: int
