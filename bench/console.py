"""Console benchmark (issue 48, item 1): pages of `postroom web`'s search over an outbox of a
million rows, through the console's own store (postroom/web/store.py) and migration 0016's indexes.

The rows are written by one INSERT ... SELECT (published, so the relay's queue stays empty): 1,000
report runs of 1,000 recipients each over 30 days, 100,000 addresses, 97 % sent and the rest
dead, failed, bounced or suppressed; none retrying. Each search is timed for its first page and
for the pages after it (keyset; a search by state that stopped at its bound, SEARCH_SCAN_ROWS
rows walked, goes on from where it stopped, as the page's link does), several times; the figure
is the slowest page of all. A quick run scales the bound down with the rows, so that its
searches by state stop at it too.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import time

import sqlalchemy as sa

from bench.report import Options, Section, Target, progress, table
from bench.scratch import scratch
from postroom.relay.db import make_engine
from postroom.settings import Settings
from postroom.web.forms import PAGE_ROWS, SearchFilter
from postroom.web.store import SEARCH_SCAN_ROWS, DatabaseStore

ROWS, QUICK_ROWS = 1_000_000, 50_000
RUN_ROWS = 1000  # recipients per report run (message key)
ADDRESSES = 100_000
DAYS = 30
PAGES = 5  # the first page and the four after it
REPEATS, QUICK_REPEATS = 5, 2
TARGET_PAGE_MS = 300.0

FILL = sa.text("""
    INSERT INTO outbox (idempotency_key, message_key, recipient, subject, body, priority, status,
                        attempts, last_error, created_at, available_at, published_at, sent_at,
                        updated_at)
    SELECT 'report-' || (n / :run_rows) || '|user' || (n % :addresses) || '@example.com',
           'report-' || (n / :run_rows),
           'User' || (n % :addresses) || '@Example.com',
           'Report ' || (n / :run_rows), 'b', 'normal',
           CASE WHEN n % 100 < 97 THEN 'sent' WHEN n % 100 = 97 THEN 'dead'
                WHEN n % 100 = 98 THEN 'failed'
                WHEN n % 200 = 199 THEN 'suppressed' ELSE 'bounced' END,
           1, NULL, t, t, t, t, t
    FROM generate_series(0, :rows - 1) AS n,
         LATERAL (SELECT now() - make_interval(
             secs => (:rows - n) * CAST(:spread_s AS float8) / :rows)) AS at(t)
""")


def _searches(newest: dt.datetime, rows: int) -> dict[str, SearchFilter]:
    day = newest - dt.timedelta(days=20)
    return {
        "newest, no filter": SearchFilter(),
        "one message key": SearchFilter(message_key=f"report-{rows // RUN_ROWS // 2}"),
        "one recipient, other spelling": SearchFilter(recipient="user4242@example.com"),
        "state dead": SearchFilter(status="dead"),
        "state suppressed (0.5 %)": SearchFilter(status="suppressed"),
        "state retrying (no row: bounded)": SearchFilter(status="retrying"),
        "one day": SearchFilter(created_from=day, created_until=day + dt.timedelta(days=1)),
        "state bounced in one day": SearchFilter(status="bounced", created_from=day,
                                                 created_until=day + dt.timedelta(days=1)),
        "from 30 days ago on": SearchFilter(created_from=newest - dt.timedelta(days=DAYS)),
    }


def _pages(store: DatabaseStore, wanted: SearchFilter) -> list[float]:
    """Milliseconds of each of up to PAGES pages, following the keyset (or the bound's)."""
    times = []
    for _ in range(PAGES):
        started = time.perf_counter()
        found = store.search(wanted, PAGE_ROWS + 1)
        times.append((time.perf_counter() - started) * 1000)
        if len(found.rows) > PAGE_ROWS:
            last = found.rows[PAGE_ROWS - 1]
            wanted = dataclasses.replace(wanted, after=(last["keyset_at"], last["id"]))
        elif found.scanned_to is not None:
            wanted = dataclasses.replace(wanted, after=found.scanned_to)
        else:
            break
    return times


def run(base: Settings, options: Options) -> Section:
    rows = QUICK_ROWS if options.quick else ROWS
    repeats = QUICK_REPEATS if options.quick else REPEATS
    section = Section(f"Console search: pages of {PAGE_ROWS} over an outbox of {rows:,} rows "
                      "(postroom web)")
    with scratch(base, "console") as settings:
        engine = make_engine(settings)
        try:
            progress(f"writing {rows:,} outbox rows")
            started = time.monotonic()
            with engine.begin() as conn:
                conn.execute(FILL, {"rows": rows, "run_rows": RUN_ROWS, "addresses": ADDRESSES,
                                    "spread_s": DAYS * 86400})
                conn.execute(sa.text("ANALYZE outbox"))
            section.lines.append(f"outbox filled in {time.monotonic() - started:.0f} s")
            with engine.connect() as conn:
                newest = conn.execute(sa.text("SELECT max(created_at) FROM outbox")).scalar_one()
            scan_rows = SEARCH_SCAN_ROWS * rows // ROWS
            section.lines.append(f"a search by state walks at most {scan_rows:,} rows a page")
            store = DatabaseStore(settings, engine, scan_rows=scan_rows)
            measured: list[list[str]] = []
            slowest_all = 0.0
            for name, wanted in _searches(newest, rows).items():
                progress(f"searching: {name}")
                runs = [_pages(store, wanted) for _ in range(repeats)]
                times = [ms for run in runs for ms in run]
                slowest = max(times)
                slowest_all = max(slowest_all, slowest)
                measured.append([name, str(len(runs[0])),
                                 f"{statistics.median(run[0] for run in runs):.1f}",
                                 f"{statistics.median(times):.1f}", f"{slowest:.1f}"])
            section.lines += table(["search", "pages", "first page, median ms",
                                    "any page, median ms", "slowest page ms"], measured)
            section.targets.append(Target("slowest search page", slowest_all, TARGET_PAGE_MS,
                                          "ms", higher_is_better=False))
        finally:
            engine.dispose()
    return section
