"""How the benchmarks speak: progress lines on stderr while they run, figures and verdicts on stdout."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence

_STARTED = time.monotonic()


class BenchError(Exception):
    """A benchmark could not run or produced an impossible result."""


@dataclasses.dataclass(frozen=True)
class Options:
    """How a benchmark part runs: ``quick`` shrinks every run, ``profile`` adds a profiled one,
    ``emails`` sets the backlog part's size (None: its default for a full or a quick run)."""

    quick: bool = False
    profile: bool = False
    emails: int | None = None


def progress(message: str) -> None:
    """One line on stderr saying what the benchmark is doing now."""
    print(f"[bench {time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from the issue and the figure measured against it."""

    name: str
    measured: float
    goal: float
    unit: str
    higher_is_better: bool = True

    @property
    def met(self) -> bool:
        return self.measured >= self.goal if self.higher_is_better else self.measured < self.goal

    def line(self) -> str:
        sign = ">=" if self.higher_is_better else "<"
        verdict = "met" if self.met else "NOT met"
        return (f"{self.name}: {_figure(self.measured)} {self.unit} "
                f"(target {sign} {_figure(self.goal)} {self.unit}) -> {verdict}")


@dataclasses.dataclass
class Section:
    """One benchmark's printed result: its lines and the targets it checked."""

    title: str
    lines: list[str] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)

    def render(self) -> str:
        out = [self.title, "=" * len(self.title), *self.lines]
        if self.targets:
            out += ["", "Targets:", *(f"  {t.line()}" for t in self.targets)]
        return "\n".join(out)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the first column left-aligned, the others right."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def fmt(row: Sequence[str]) -> str:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return [fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    if not values:
        raise BenchError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def per_s(count: int, seconds: float) -> float:
    if seconds <= 0:
        raise BenchError(f"non-positive duration {seconds!r} for {count} items")
    return count / seconds


def _figure(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_rate(value: float) -> str:
    """A rate or a duration for a table cell: thousands separated, sensible precision."""
    return _figure(value)
