"""Decides which priority topics the sender may fetch from in its next poll round. Pure.

The rule is strict priority with a starvation guard. One sender consumer reads the high,
normal and low topics; before each poll round the consumer reports each priority's backlog
(records known to be waiting on its assigned partitions: high watermark minus position,
plus records fetched but not yet handed out) and pauses every priority not returned by
:func:`choose_active`:

* while HIGH has a backlog, NORMAL and LOW are paused; while NORMAL has one, LOW is paused;
* a priority with a backlog that has been paused for ``starvation_limit`` consecutive rounds
  is let in for one round, so LOW advances under a permanent HIGH backlog: it is served at
  least once every ``starvation_limit + 1`` rounds;
* priorities at or above the highest one with a backlog stay active, so new urgent records
  are fetched as soon as they arrive; with no backlog anywhere, everything is active.

Retry topics are outside this rule. A retry record is governed by its ``not_before``: its tier
is paused until the head record is due and then served whatever the priority backlog, because
a retry already waited its delay and holding it longer would only make it later than promised.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from postroom.topics import Priority

# Most urgent first; choose_active relies on this order.
PRIORITY_ORDER: tuple[Priority, ...] = (Priority.HIGH, Priority.NORMAL, Priority.LOW)


def choose_active(
    backlog: Mapping[Priority, int],
    rounds_waiting: Mapping[Priority, int],
    starvation_limit: int,
) -> frozenset[Priority]:
    """The priorities the consumer may fetch from in the next round; see the module docstring.

    ``backlog`` and ``rounds_waiting`` may leave a priority out, which counts as zero.
    """
    if starvation_limit < 1:
        raise ValueError(f"starvation_limit must be at least 1 round, got {starvation_limit}")
    waiting = _counts(backlog, "backlog")
    paused_for = _counts(rounds_waiting, "rounds_waiting")
    top = next((i for i, p in enumerate(PRIORITY_ORDER) if waiting[p] > 0), None)
    if top is None:
        return frozenset(PRIORITY_ORDER)
    starved = (p for p in PRIORITY_ORDER[top + 1:]
               if waiting[p] > 0 and paused_for[p] >= starvation_limit)
    return frozenset((*PRIORITY_ORDER[: top + 1], *starved))


@dataclasses.dataclass(frozen=True)
class PriorityState:
    """For each priority, the consecutive rounds it had a backlog and was paused."""

    rounds_waiting: Mapping[Priority, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = _counts(self.rounds_waiting, "rounds_waiting")
        object.__setattr__(self, "rounds_waiting", types.MappingProxyType(counts))

    def __hash__(self) -> int:
        return hash(tuple(self.rounds_waiting[p] for p in PRIORITY_ORDER))

    def advance(
        self, backlog: Mapping[Priority, int], active: frozenset[Priority]
    ) -> PriorityState:
        """The state after a round in which ``active`` was fetched while ``backlog`` waited."""
        waiting = _counts(backlog, "backlog")
        return PriorityState({
            p: 0 if p in active or waiting[p] == 0 else self.rounds_waiting[p] + 1
            for p in PRIORITY_ORDER
        })


def plan_round(
    state: PriorityState, backlog: Mapping[Priority, int], starvation_limit: int
) -> tuple[frozenset[Priority], PriorityState]:
    """:func:`choose_active` for this round, and the state to pass to the next one."""
    active = choose_active(backlog, state.rounds_waiting, starvation_limit)
    return active, state.advance(backlog, active)


def _counts(values: Mapping[Priority, int], name: str) -> dict[Priority, int]:
    counts = {p: values.get(p, 0) for p in PRIORITY_ORDER}
    negative = {str(p): n for p, n in counts.items() if n < 0}
    if negative:
        raise ValueError(f"{name} cannot be negative: {negative}")
    return counts


def partition_backlog(position: int, low: int, high: int, start: int | None) -> int:
    """Records known to wait on one partition: its cached high watermark less our position.

    ``high`` is negative before anything was fetched from the partition (nothing known: 0).
    Before the partition has yielded a record our ``position`` is negative (unknown); then the
    group's committed offset ``start`` stands in for it, or the low watermark without one.
    """
    if high < 0:
        return 0
    if position < 0:
        position = start if start is not None and start >= 0 else max(low, 0)
    return max(0, high - position)
