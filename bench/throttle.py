"""Throttling benchmark (issue 26, target 6): the time to deliver 1,000 emails to a destination
that throttles one send in ten (an in-process dev SMTP server answering every tenth RCPT TO with
the rate limit), at a short and at the default first pause; how many pauses it took and how
many sends were throttled, from the sender's own counters."""

from __future__ import annotations

import dataclasses

from bench.inprocess import deliver_all
from bench.report import Options, Section, progress, table
from bench.scratch import scratch
from bench.workload import enqueue_rows, recipients
from postroom.devkit.devsmtp import DevSmtpServer
from postroom.settings import Settings, TlsMode

THROTTLE_EVERY = 10
FULL_EMAILS, QUICK_EMAILS = 1_000, 200
PAUSES_S, QUICK_PAUSES_S = (1.0,), (1.0,)
TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Throttled:
    pause_s: float
    seconds: float
    throttled: int    # the server's rate limit replies
    counted: float    # the sender's throttled_total


def run(base: Settings, options: Options) -> Section:
    emails = QUICK_EMAILS if options.quick else FULL_EMAILS
    runs = [_measure(base, emails, pause) for pause in (QUICK_PAUSES_S if options.quick
                                                         else PAUSES_S)]
    section = Section(f"Throttling: {emails:,} emails to a destination that throttles one send "
                      f"in {THROTTLE_EVERY}")
    section.lines += [
        f"one domain; every {THROTTLE_EVERY}th RCPT TO of the server answered 450 4.2.1 (the rate "
        "limit); sender concurrency 20, all components in this process; POSTROOM_THROTTLE_PAUSE "
        "as given (the default is 60 s), POSTROOM_THROTTLE_MAX_WAIT at its default",
        "",
        *table(["first pause s", "all delivered after s", "throttled replies",
                "sender's throttled_total"],
               [[f"{r.pause_s:g}", f"{r.seconds:,.1f}", f"{r.throttled:,}", f"{r.counted:,.0f}"]
                for r in runs]),
        "",
        "A burst of throttling replies (the sends in flight when a pause begins) pauses the "
        "destination once and halves its concurrency; a clean send gives one connection back and "
        "resets the pause, so a server that throttles one send in ten is paced at about the first "
        "pause per round, never held at the longest one.",
    ]
    return section


def _measure(base: Settings, emails: int, pause_s: float) -> Throttled:
    with scratch(base, "throttle") as settings:
        addresses = recipients(emails, tag="busy")
        server = DevSmtpServer(port=0, throttle_every=THROTTLE_EVERY)
        server.start()
        try:
            smtp = dataclasses.replace(settings, smtp_host="127.0.0.1", smtp_port=server.port,
                                       smtp_tls=TlsMode.NONE, throttle_pause_s=pause_s)
            return _deliver(smtp, addresses, server, pause_s)
        finally:
            server.stop()


def _deliver(settings: Settings, addresses: list[str], server: DevSmtpServer,
             pause_s: float) -> Throttled:
    progress(f"throttle: {len(addresses):,} emails, first pause {pause_s:g} s")
    sender, elapsed = deliver_all(settings, len(addresses), server,
                                  lambda conn: enqueue_rows(conn, "busy", addresses), TIMEOUT_S)
    counted = sum(sender.metrics.counters("throttled_total").values())
    return Throttled(pause_s, elapsed, server.throttled_replies, counted)
