"""What a job's ``from postroom import enqueue`` costs: the import's seconds and the modules it
loads, in fresh interpreters (one import each, so nothing is cached in the process), the median
and spread of several, beside the figures issue 44 measured before the light client.

No stack needed. Each run is ``python -c`` of this interpreter: the modules counted are the
whole of ``sys.modules`` after the import, as the issue counted them. The machine's load moves
the seconds, so the same runs also time the import with what it loaded before (SQLAlchemy's ORM,
psycopg, fastavro) imported first, interleaved: the two rows measured now compare like for like.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from bench.report import BenchError, Section, Target, progress, table
from postroom.settings import Settings

RUNS, QUICK_RUNS = 15, 5
IMPORT = "from postroom import enqueue"
# Issue 44, before the light client: the import loaded SQLAlchemy (with its ORM), psycopg and
# fastavro with postroom's roles' modules.
BEFORE_S, BEFORE_MODULES = 0.64, 521
GOAL_S = 0.2  # the aim: well under it
LIBRARIES = ("sqlalchemy", "psycopg", "fastavro", "confluent_kafka", "aiosmtplib")
# What the import loaded before besides postroom's own modules (issue 44).
BEFORE_LIBRARIES = "import sqlalchemy.orm, psycopg, fastavro"
PROBE = f"""\
import json, sys, time
started = time.perf_counter()
{{before}}
{IMPORT}
took = time.perf_counter() - started
print(json.dumps([took, len(sys.modules), sorted(m for m in {LIBRARIES!r} if m in sys.modules)]))
"""


def one_import(before: str = "") -> tuple[float, int, list[str]]:
    """Seconds, modules loaded and libraries among them, of the import in a fresh interpreter
    (after the statement ``before``)."""
    probe = PROBE.replace("{before}", before)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, timeout=120)
    if proc.returncode != 0:
        raise BenchError(f"the import failed: {proc.stderr.strip()[-500:]}")
    took, modules, libraries = json.loads(proc.stdout)
    return float(took), int(modules), list(libraries)


def run(settings: Settings, options: Any) -> Section:
    del settings  # no stack needed
    runs = QUICK_RUNS if options.quick else RUNS
    progress(f"imports: {runs} fresh interpreters, `{IMPORT}` in each")
    results, before = [], []
    for _ in range(runs):  # interleaved, so a busier moment slows both alike
        results.append(one_import())
        before.append(one_import(BEFORE_LIBRARIES))
    median = statistics.median(took for took, _, _ in results)
    section = Section(f"Import: `{IMPORT}` in a job")
    section.lines += [
        f"{runs} fresh interpreters ({sys.executable}) of each, one import each, interleaved; "
        "the median (min, max)",
        "",
        *table(["", "seconds", "modules loaded", "libraries among them"],
               [["before (issue 44's figures)", f"{BEFORE_S:.2f}", str(BEFORE_MODULES),
                 "sqlalchemy, psycopg, fastavro"],
                ["with what it loaded before, measured now", *_row(before)],
                ["now", *_row(results)]]),
    ]
    section.targets.append(Target(f"`{IMPORT}`, median of {runs} fresh imports", median, GOAL_S,
                                  "s", higher_is_better=False))
    return section


def _row(results: list[tuple[float, int, list[str]]]) -> list[str]:
    seconds = sorted(took for took, _, _ in results)
    modules = sorted({count for _, count, _ in results})
    libraries = sorted({name for _, _, names in results for name in names})
    return [f"{statistics.median(seconds):.3f} ({seconds[0]:.3f}, {seconds[-1]:.3f})",
            "/".join(map(str, modules)), ", ".join(libraries) or "none"]
