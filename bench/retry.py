"""Retry benchmark: how late retries fire after their ``not_before`` under a load of retries.

Every recipient is deferred (451) once by an in-process dev SMTP server; each retry waits on tier 1
(2 s) and is then accepted. The sender's own measurement is read back: for every retried event it
records how long after ``not_before`` it was taken up (``retry_lateness_seconds``).
"""

from __future__ import annotations

import dataclasses

from bench.inprocess import deliver_all
from bench.report import BenchError, Options, Section, progress, table
from bench.scratch import scratch
from bench.workload import enqueue_rows, recipients
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.settings import Settings, TlsMode

TIER_S = 2.0
FULL_EMAILS, QUICK_EMAILS = 500, 100
TIMEOUT_S = 120.0


def run(base: Settings, options: Options) -> Section:
    emails = QUICK_EMAILS if options.quick else FULL_EMAILS
    section = Section("Retries: how late a retry fires after it is due")
    with scratch(base, "retry") as settings:
        addresses = recipients(emails, tag="late")
        server = DevSmtpServer(port=0, defer={a: 1 for a in addresses})
        server.start()
        try:
            smtp = dataclasses.replace(
                settings, smtp_host="127.0.0.1", smtp_port=server.port, smtp_tls=TlsMode.NONE,
                retry_delays_s=(TIER_S, TIER_S * 2))
            summary, elapsed = _measure(smtp, addresses, server)
        finally:
            server.stop()
    count, total, peak = summary
    section.lines += [
        f"{emails:,} emails, each deferred once (451) and retried from tier 1 ({TIER_S:.0f} s); "
        "sender concurrency 20, all components in this process",
        "",
        *table(["retries", "mean late ms", "max late ms", "all delivered after s"],
               [[f"{count:,}", f"{total / count * 1000:,.0f}", f"{peak * 1000:,.0f}",
                 f"{elapsed:,.1f}"]]),
        "",
        "late = when the sender took the retry up - its not_before (the sender's "
        "retry_lateness_seconds); a tier partition is paused until its head record is due and "
        "checked every poll (about 20 ms)",
    ]
    return section


def _measure(settings: Settings, addresses: list[str],
             server: DevSmtpServer) -> tuple[tuple[int, float, float], float]:
    progress(f"retry: enqueueing {len(addresses):,} emails, each to be deferred once")
    sender, elapsed = deliver_all(settings, len(addresses), server,
                                  lambda conn: enqueue_rows(conn, "late", addresses), TIMEOUT_S)
    summary = sender.metrics.summary("retry_lateness_seconds")
    if summary is None or summary[0] < len(addresses):
        raise BenchError(f"expected {len(addresses)} retries, the sender measured "
                         f"{0 if summary is None else summary[0]}")
    return summary, elapsed
