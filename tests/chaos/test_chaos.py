"""The fault-injection suite: the real pipeline as processes, faults injected while it runs, the
output compared with the input from three sources (see tests/chaos/checks.py).

`make chaos-short` runs the short version (SHORT and the short poison storm, about two minutes);
`make chaos` runs every scenario and a random mix whose seed is printed (CHAOS_SEED replays one),
and prints the table docs/reliability.md shows; CHAOS_ONLY=text runs only the scenarios whose
name holds that text. `make test` runs none of them: the tests of the harness's own parts
(tests/chaos/test_storm_inputs.py, ...) run there.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.checks import Outcome, table
from chaos.scenarios import FULL, POISON_STORM_SHORT, SHORT, Scenario, random_mix, run_scenario
from postroom.settings import Settings
from support.stack import dev_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.chaos]


def log_dir() -> Path:
    return dev_dir() / "chaos" / time.strftime("%Y%m%dT%H%M%S")


def run_all(settings: Settings, scenarios: list[Scenario], seed: int,
            report_of: Callable[[list[Outcome]], str] = table,
            report_file: str = "table.md") -> list[Outcome]:
    where = log_dir()
    rng = random.Random(seed)
    print(f"\nchaos: seed {seed}, logs in {where}", flush=True)
    outcomes = []
    for scenario in scenarios:
        started = time.monotonic()
        outcome = run_scenario(settings, scenario, where, rng)
        window = outcome.mark_window
        p50, p99 = window.quantile_bound(0.5), window.quantile_bound(0.99)
        marks = "-" if p50 is None or p99 is None else (
            f"p50 <= {p50 * 1000:g} ms, p99 <= {p99 * 1000:g} ms over {window.count:.0f}")
        before = sorted(round(s, 3) for s in outcome.accepted_before_kill_s)
        kills = "; ".join(k.line() for k in outcome.per_kill)
        print(f"chaos: {scenario.name}: {time.monotonic() - started:.0f}s; {scenario.proves}; "
              f"250 read to sent mark in the last senders: {marks}; duplicates' first 250 "
              f"before their SIGKILL (negative: after), s: {before}; per kill: {kills or '-'}; "
              f"server transactions beyond the outbox's attempts: {outcome.extra_transactions}"
              + ("" if outcome.pause_s is None else
                 f"; longest pause in deliveries: {outcome.pause_s:.1f} s")
              + "".join(f"; {note}" for note in outcome.notes), flush=True)
        outcomes.append(outcome)
    report = report_of(outcomes)
    print(report, flush=True)
    (where / report_file).write_text(report + "\n")
    return outcomes


def assert_clean(outcomes: list[Outcome]) -> None:
    problems = [p for o in outcomes for p in o.problems()]
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(240)
def test_short_chaos(stack_settings: Settings) -> None:
    assert_clean(run_all(stack_settings, SHORT, seed=9))


@pytest.mark.timeout(180)
def test_short_poison_storm(stack_settings: Settings) -> None:
    assert_clean(run_all(stack_settings, [POISON_STORM_SHORT], seed=23))


@pytest.mark.timeout(1500)
def test_full_chaos(stack_settings: Settings) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    mix = Scenario(f"random mix (seed {seed})", 1500, random_mix,
                   "faults of every cheap kind at random moments, replayable by seed")
    only = os.environ.get("CHAOS_ONLY", "")
    chosen = [s for s in [*FULL, mix] if only in s.name]
    assert chosen, f"CHAOS_ONLY={only!r} names no scenario"
    outcomes = run_all(stack_settings, chosen, seed)
    assert_clean(outcomes)
    kills = sum(o.kills for o in outcomes)
    in_window = sum(o.in_window for o in outcomes)
    after = sum(o.answered_after_kill for o in outcomes)
    print(f"chaos: {kills} sender kills, {in_window} duplicates in the window "
          f"({in_window / max(kills, 1):.2f} per kill; {in_window - after} with the 250 written "
          f"before the SIGKILL, {(in_window - after) / max(kills, 1):.2f} per kill)")
