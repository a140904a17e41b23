"""What bounds a figure, as the benchmarks print it: a personalised call's parts (the enqueue
part) and what the machine's CPUs allow postroom on smtp-sink (the delivery part)."""

from __future__ import annotations

from bench.cpu import CpuUsage
from bench.delivery import FULL, POSTOFFICE, POSTROOM, POSTROOM_TWO, SEED, Run, Timed, _cpu_bound_lines
from bench.enqueue import _call_lines

SINK = FULL[0]


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
                   busy_fraction=0.8, cpus=2, busy_s=0.8, wall_s=0.5)
    runs = {("smtp-sink", POSTROOM): _run(POSTROOM, 1_000, 0.45, cpu),
            ("smtp-sink", POSTOFFICE): _run(POSTOFFICE, 1_000, 1.0),
            ("smtp-sink", SEED): _run(SEED, 1_000, 1.5, job_seconds=2.0)}
    lines = _cpu_bound_lines(runs, 20)
    # 0.8 CPU-seconds for 1,000 emails; 2 CPUs at 0.8 ms an email: 2,500 emails/s.
    assert ("0.80 ms of CPU per email over the machine (postroom's roles 0.45, PostgreSQL 0.02, "
            "the JVMs (Kafka, registry) 0.20, smtp-sink 0.03, the rest 0.10), so its 2 CPUs give "
            "at most 2,500 emails/s") in lines[1]
    assert "each sender's process was busy 60% of one CPU" in lines[1]  # 0.3 s of 0.5 s
    assert lines[-1] == ("  (3x django-post-office's send phase is 3,000/s; 3x the seed's job "
                         "rate 1,500/s)")


def test_two_senders_are_each_given_their_share_and_a_run_without_cpu_figures_none() -> None:
    cpu = CpuUsage(processes={"sender": 0.3, "sender-2": 0.3}, busy_fraction=0.6, cpus=2,
                   busy_s=0.6, wall_s=1.0)
    lines = _cpu_bound_lines({("smtp-sink", POSTROOM_TWO): _run(POSTROOM_TWO, 1_000, 1.0, cpu)},
                             20)
    assert "each sender's process was busy 30% of one CPU" in lines[1]
    assert _cpu_bound_lines({("smtp-sink", POSTROOM): _run(POSTROOM, 1_000, 1.0)}, 20) == []
