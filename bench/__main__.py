"""`python -m bench [PART ...] [--quick] [--emails N]`: run the benchmarks (relay, delivery, latency,
throttle, retry, codec, imports, enqueue, tracing, backlog, bounces,
console; all by default), print their figures.

Figures and verdicts go to stdout; progress lines and any warnings from postroom go to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Sequence

from bench.report import BenchError, Options, Section, progress
from bench.scratch import check_stack
from postroom.errors import ConfigError
from postroom.settings import Settings

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


PARTS = ("relay", "delivery", "latency", "throttle", "retry", "codec", "imports", "enqueue",
         "tracing", "backlog", "bounces", "console")
STACK_FREE = {"codec", "imports"}  # parts that need neither PostgreSQL nor Kafka


def _runner(name: str) -> Callable[[Settings, Options], Section]:
    if name == "relay":
        from bench import relay

        return relay.run
    if name == "retry":
        from bench import retry

        return retry.run
    if name == "codec":
        from bench import codec

        return codec.run
    if name == "imports":
        from bench import imports

        return imports.run
    if name == "enqueue":
        from bench import enqueue

        return enqueue.run
    if name == "latency":
        from bench import latency

        return latency.run
    if name == "throttle":
        from bench import throttle

        return throttle.run
    if name == "tracing":
        from bench import tracing

        return tracing.run
    if name == "backlog":
        from bench import backlog

        return backlog.run
    if name == "bounces":
        from bench import bounces

        return bounces.run
    if name == "console":
        from bench import console

        return console.run
    from bench import delivery

    return delivery.run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="postroom benchmarks against the local stack (scripts/services.sh up; "
                    ". .dev/env). Figures on stdout, progress on stderr.")
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"{', '.join(PARTS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller runs (about a minute in all) to check that everything works")
    parser.add_argument("--profile", action="store_true",
                        help="relay: also drain once under cProfile and print where the time goes")
    parser.add_argument("--emails", type=_positive, metavar="N",
                        help="backlog: emails in the backlog (default 1,000,000; 20,000 with "
                             "--quick)")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


def stop_on_sigterm() -> None:
    """SIGTERM (`kill`, a CI job's timeout) ends the run by an exception, as Ctrl-C does, so each
    part removes its scratch schema, topics and groups and stops its processes on the way out;
    the signal's default killed the benchmark where it stood and left them behind."""
    def stop(signum: int, _frame: object) -> None:
        progress(f"stopped by signal {signum}: removing what this run made")
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r} (choose from {', '.join(PARTS)})")
    wanted = list(dict.fromkeys(args.parts)) or list(PARTS)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="[postroom] %(levelname)s %(name)s: %(message)s")
    try:
        base = Settings.from_env()
        if set(wanted) - STACK_FREE:
            check_stack(base)
    except (ConfigError, BenchError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    print(f"postroom benchmarks, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, "
          f"{'quick' if args.quick else 'full'} run: {', '.join(wanted)}")
    print(f"host: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}; Kafka {base.kafka_bootstrap_servers}, "
          "PostgreSQL on 127.0.0.1")
    sections: list[Section] = []
    for name in wanted:
        progress(f"--- {name} benchmark ---")
        load_before = os.getloadavg()[0]
        try:
            section = _runner(name)(base, Options(quick=args.quick, profile=args.profile,
                                                    emails=args.emails))
        except (BenchError, ChildProcessError, TimeoutError) as exc:
            # The last two: a postroom process exited or never got going (postroom.devkit).
            print(f"bench {name}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        # The stack shares the CPUs with whatever else runs; say how busy the machine was.
        section.lines.append(f"load average (1 min) before / after: {load_before:.2f} / "
                             f"{os.getloadavg()[0]:.2f}")
        sections.append(section)
        print()
        print(section.render(), flush=True)
    targets = [t for s in sections for t in s.targets]
    print()
    verdict = (f"{sum(t.met for t in targets)} of {len(targets)} targets met" if targets
               else "these parts have no targets, only figures")
    print(f"Summary: {verdict} ({time.monotonic() - started:.0f} s in all)")
    for target in targets:
        print(f"  [{'met' if target.met else 'NOT met'}] {target.name}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
