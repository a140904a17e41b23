"""The fault-injection suite: the real pipeline as processes, faults injected while it runs, the
output compared with the input from three sources (see tests/chaos/checks.py).

`make test` runs the short version (SHORT); `make chaos` runs every scenario and a random mix whose
seed is printed (CHAOS_SEED replays one), and prints the table docs/reliability.md shows.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from chaos.checks import Outcome, table
from chaos.harness import REPO
from chaos.scenarios import FULL, SHORT, Scenario, random_mix, run_scenario
from postroom.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def log_dir() -> Path:
    return Path(os.environ.get("POSTROOM_DEV_DIR", REPO / ".dev")) / "chaos" / time.strftime(
        "%Y%m%dT%H%M%S")


def run_all(settings: Settings, scenarios: list[Scenario], seed: int) -> list[Outcome]:
    where = log_dir()
    rng = random.Random(seed)
    print(f"\nchaos: seed {seed}, logs in {where}", flush=True)
    outcomes = []
    for scenario in scenarios:
        started = time.monotonic()
        outcome = run_scenario(settings, scenario, where, rng)
        marks = ", ".join(f"{s / c * 1000:.1f} ms mean, p99 <= {m * 1000:.0f} ms over {c:.0f}"
                          for c, s, m in outcome.mark_in_process if c)
        print(f"chaos: {scenario.name}: {time.monotonic() - started:.0f}s; {scenario.proves}; "
              f"250 read to sent mark in the senders: {marks or '-'}; duplicates' first 250 "
              f"before their kill, s: {sorted(round(s, 3) for s in outcome.accepted_before_kill_s)}; "
              f"per kill (in doubt, resent within s): "
              f"{[(n, round(w, 1)) for n, w in outcome.per_kill]}", flush=True)
        outcomes.append(outcome)
    report = table(outcomes)
    print(report, flush=True)
    (where / "table.md").write_text(report + "\n")
    return outcomes


def assert_clean(outcomes: list[Outcome]) -> None:
    problems = [p for o in outcomes for p in o.problems()]
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(240)
def test_short_chaos(stack_settings: Settings) -> None:
    assert_clean(run_all(stack_settings, SHORT, seed=9))


@pytest.mark.chaos
@pytest.mark.timeout(1500)
def test_full_chaos(stack_settings: Settings) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    mix = Scenario(f"random mix (seed {seed})", 1500, random_mix,
                   "faults of every cheap kind at random moments, replayable by seed")
    outcomes = run_all(stack_settings, [*FULL, mix], seed)
    assert_clean(outcomes)
    kills = sum(o.kills for o in outcomes)
    in_window = sum(o.in_window for o in outcomes)
    print(f"chaos: {kills} sender kills, {in_window} duplicates in the window "
          f"({in_window / max(kills, 1):.2f} per kill)")
