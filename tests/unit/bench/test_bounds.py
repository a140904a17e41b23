"""What bounds a figure, as the benchmarks print it: a personalised call's parts (the enqueue
part) and what the machine's CPUs allow postroom on smtp-sink (the delivery part)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from bench.cpu import CpuUsage, sample, usage
from bench.delivery import (
    FULL,
    POSTOFFICE,
    POSTROOM,
    POSTROOM_TWO,
    POSTROOM_WIDE,
    SEED,
    WIRE,
    Run,
    Timed,
    _cpu_bound_lines,
    _span_lines,
    client_cpu_s,
)
from bench.enqueue import _call_lines

SINK, SLOW = FULL


def test_a_call_is_split_into_its_statement_its_round_trip_and_postrooms_share() -> None:
    lines = _call_lines({"personalised": 4_000, "statement alone": 5_000, "round trip": 10_000})
    assert lines[0] == ("a personalised call took 250 µs: its statement alone 200 µs (of which "
                        "a bare round trip 100 µs), postroom's checks and keys 50 µs.")
    assert "alone: 5,000 calls/s in this run" in lines[1]


def _run(design: str, emails: int, seconds: float, cpu: CpuUsage | None = None,
         job_seconds: float | None = None) -> Run:
    return Run(SINK, design, emails, (Timed(seconds, cpu, job_seconds=job_seconds),))


def test_the_machines_cpu_per_email_gives_the_rate_its_cpus_allow() -> None:
    cpu = CpuUsage(processes={"relay": 0.1, "sender": 0.3, "recorder": 0.05, "postgres:7": 0.02,
                              "java:9": 0.2, "server": 0.03},
                   busy_fraction=0.8, cpus=2, busy_s=0.8)
    runs = {("smtp-sink", POSTROOM): _run(POSTROOM, 1_000, 0.45, cpu),
            ("smtp-sink", POSTOFFICE): _run(POSTOFFICE, 1_000, 1.0),
            ("smtp-sink", SEED): _run(SEED, 1_000, 1.5, job_seconds=2.0)}
    lines = _cpu_bound_lines(runs, 20)
    # 0.8 CPU-seconds for 1,000 emails; 2 CPUs at 0.8 ms an email: 2,500 emails/s.
    assert ("0.80 ms of CPU per email over the machine (postroom's roles 0.45, PostgreSQL 0.02, "
            "the JVMs (Kafka, registry) 0.20, smtp-sink 0.03, the rest 0.10), so its 2 CPUs give "
            "at most 2,500 emails/s") in lines[1]
    assert lines[1].endswith("the sender's CPU over the run's seconds: 67% of one CPU")  # 0.3/0.45
    assert lines[-2:] == ["  (3x django-post-office's send phase is 3,000/s; 3x the seed's job "
                         "rate 1,500/s)", ""]


def test_two_senders_are_each_given_their_own_and_a_run_without_cpu_figures_no_line() -> None:
    cpu = CpuUsage(processes={"sender-2": 0.1, "sender": 0.5}, busy_fraction=0.6, cpus=2,
                   busy_s=0.6)
    lines = _cpu_bound_lines({("smtp-sink", POSTROOM_TWO): _run(POSTROOM_TWO, 1_000, 1.0, cpu)},
                             20)
    assert lines[1].endswith("the sender's CPU over the run's seconds: 50% and 10% of one CPU")
    assert _cpu_bound_lines({("smtp-sink", POSTROOM): _run(POSTROOM, 1_000, 1.0)}, 20) == []
    idle = CpuUsage(processes={}, busy_fraction=0.0, cpus=2, busy_s=0.0)
    assert _cpu_bound_lines({("smtp-sink", POSTROOM): _run(POSTROOM, 1_000, 1.0, idle)}, 20) == []


def test_a_designs_own_cpu_leaves_out_the_server_the_database_and_the_jvms() -> None:
    cpu = CpuUsage(processes={"relay": 0.1, "sender": 0.3, "sender-2": 0.2, "recorder": 0.05,
                              "postgres:7": 0.02, "java:9": 0.2, "server": 0.03},
                   busy_fraction=0.8, cpus=2, busy_s=0.9)
    assert client_cpu_s(cpu) == pytest.approx(0.65)


def test_a_process_gone_by_the_second_sample_is_left_out_not_counted_below_zero() -> None:
    alive, gone = os.getpid(), _gone_pid()
    before = sample({"me": alive, "gone": alive})
    time.sleep(0.05)  # a few of /proc/stat's ticks, or the two samples are one
    after = sample({"me": alive, "gone": gone})
    assert before is not None and after is not None
    used = usage(before, after)
    assert used is not None and set(used.processes) == {"me"} and used.processes["me"] >= 0


def _gone_pid() -> int:
    """The id of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_slowsink_runs_gap_to_the_ceiling_is_split_into_filling_turnaround_and_recording(
) -> None:
    # 2,000 emails over 20 connections at 100 ms: 100 a connection, 10.00 s at the ceiling.
    timed = Timed(10.47, None, sent_span=(0.18, 10.45))
    wide = Timed(3.625, None, sent_span=(0.2, 3.535))  # x64: 31.25 a connection
    lines = _span_lines([Run(SLOW, POSTROOM, 2_000, (timed,)),
                         Run(SLOW, POSTROOM_WIDE, 2_000, (wide,)),
                         Run(SLOW, WIRE, 2_000, (Timed(10.3, None),))], 20)
    rows = [line for line in lines if "slowsink" in line]
    assert len(rows) == 2  # the pipelined client has no commit, so no row
    x20, x64 = rows
    # 10.27 s for the 99 messages after each connection's first: 103.74 ms each; above the
    # ceiling 0.47 = (0.18 - 0.1) + (10.27 - 99 x 0.1) + (10.47 - 10.45).
    assert x20.split()[-11:] == ["0.180", "10.270", "0.020", "103.74", "0.47", "=", "0.08", "+",
                                 "0.37", "+", "0.02"]
    assert "(x64)" in x64 and "110.25" in x64  # 3.335 s over 30.25 messages
    assert x64.endswith("0.50 = 0.10 + 0.31 + 0.09")  # 3.625 - 3.125; 3.335 - 30.25 x 0.1


def test_a_run_on_a_server_without_delay_has_no_ceiling_and_runs_without_a_span_no_line() -> None:
    lines = _span_lines([Run(SINK, POSTROOM, 5_000, (Timed(2.3, None, sent_span=(0.05, 2.2)),)),
                         Run(SINK, POSTROOM_TWO, 5_000, (Timed(2.0, None),))], 20)
    rows = [line for line in lines if "smtp-sink" in line]
    assert len(rows) == 1 and "(x20)" in rows[0]
    assert rows[0].split()[-5:] == ["0.050", "2.150", "0.100", "8.63", "-"]  # 2.15 s / 249
    assert _span_lines([Run(SINK, POSTROOM, 5_000, (Timed(2.3, None),))], 20) == []


def test_two_senders_messages_are_spread_over_both_senders_connections() -> None:
    lines = _span_lines([Run(SINK, POSTROOM_TWO, 5_000,
                             (Timed(2.3, None, sent_span=(0.05, 2.2)),))], 20)
    row = next(line for line in lines if "two sender" in line)
    assert row.split()[-2] == "17.34"  # 2.15 s over 125 - 1 messages on each of 40 connections
