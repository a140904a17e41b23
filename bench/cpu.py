"""CPU time from /proc (Linux): per process and for the whole machine, to tell what bound a run.

A run whose processes used about all the machine's CPU was CPU-bound; one that left it idle was
waiting (on a server's latency, on a round trip). Elsewhere than Linux every figure is absent.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclasses.dataclass(frozen=True)
class CpuSample:
    processes: Mapping[str, float]  # name -> CPU seconds (user + system) used so far
    busy_s: float                   # the machine: non-idle CPU seconds so far, over all CPUs
    total_s: float


@dataclasses.dataclass(frozen=True)
class CpuUsage:
    """CPU used between two samples."""

    processes: Mapping[str, float]
    busy_fraction: float  # of all CPUs' time
    cpus: int
    busy_s: float  # the machine's non-idle CPU seconds between the samples, every process

    def of(self, prefix: str) -> float:
        """CPU seconds of the processes whose names start with ``prefix``."""
        return sum(seconds for name, seconds in self.processes.items() if name.startswith(prefix))

    def describe(self) -> str:
        used = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.processes.items())
        return (f"CPU: {used}; machine {self.busy_fraction:.0%} busy "
                f"({self.cpus} CPUs, every process counted)")


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` (all its threads), None if it is gone."""
    return _stat_cpu_s(_PROC / str(pid) / "stat")


def _stat_cpu_s(path: Path) -> float | None:
    """User plus system CPU seconds in a stat file of /proc (a process's or a thread's), None if
    it cannot be read (the process or thread is gone)."""
    try:
        stat = path.read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime (fields 14, 15)


def rss_mib(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (VmRSS), None if unknown."""
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of process ``pid`` by '<thread id> <thread name>' (the main
    thread's name is "main"); empty if unknown."""
    found = {}
    tasks = _PROC / str(pid) / "task"
    try:
        tids = [entry.name for entry in tasks.iterdir()]
    except OSError:
        return {}
    for tid in tids:
        # task/<tid>/stat is the thread's own; /proc/<tid>/stat would be the whole process's.
        try:
            name = "main" if tid == str(pid) else (tasks / tid / "comm").read_text().strip()
        except OSError:
            continue  # exited meanwhile
        seconds = _stat_cpu_s(tasks / tid / "stat")
        if seconds is not None:
            found[f"{tid} {name}"] = seconds
    return found


def pids_named(*commands: str) -> dict[str, int]:
    """Every running process whose command name is one of ``commands``, as ``command:pid`` ->
    pid (e.g. the local stack's PostgreSQL backends); empty where /proc is missing."""
    found = {}
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "comm").read_text().strip()
        except OSError:
            continue  # exited meanwhile
        if command in commands:
            found[f"{command}:{entry.name}"] = int(entry.name)
    return found


def sample(pids: Mapping[str, int]) -> CpuSample | None:
    """CPU seconds of each named process and of the machine; None where /proc is missing. A
    process that is gone is left out (so :func:`usage` never counts one below zero)."""
    try:
        first = (_PROC / "stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    seconds = {name: process_cpu_s(pid) for name, pid in pids.items()}
    return CpuSample({name: s for name, s in seconds.items() if s is not None},
                     busy_s=(sum(ticks) - idle) / _TICKS_PER_S, total_s=sum(ticks) / _TICKS_PER_S)


def usage(before: CpuSample | None, after: CpuSample | None) -> CpuUsage | None:
    if before is None or after is None or after.total_s <= before.total_s:
        return None
    return CpuUsage(
        processes={name: after.processes[name] - before.processes.get(name, 0.0)
                   for name in after.processes},
        busy_fraction=(after.busy_s - before.busy_s) / (after.total_s - before.total_s),
        cpus=os.cpu_count() or 1, busy_s=after.busy_s - before.busy_s)
