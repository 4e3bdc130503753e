"""CPU meters shared by the benchmarks, from Linux /proc (None, or nothing, elsewhere).

A process's CPU is its own user and system time plus what its children used: the live direct
children (Postgres's backends) and the ones it has reaped (a backend whose connection closed
during the window), so a server that forks per connection is counted whole.
"""

from __future__ import annotations

import os
import time
from typing import Any

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int | str) -> list[str]:
    """/proc/<pid>/stat after the command name: fields[0] is the state (field 3 of proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def tree_cpu_s(root: int) -> float | None:
    """CPU seconds (user + system) so far of process `root`, the children it reaped, and its live
    direct children; None when `root` cannot be read."""
    try:
        fields = stat_fields(root)
        entries = [p for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, ValueError):
        return None
    ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    for entry in entries:
        if int(entry) == root:
            continue
        try:
            child = stat_fields(entry)
        except OSError:
            continue  # ended meanwhile
        if int(child[1]) == root:
            ticks += int(child[11]) + int(child[12])
    return ticks / TICK


def steal_s() -> float | None:
    """CPU seconds the hypervisor gave to others while this machine's CPUs wanted them (all CPUs,
    since boot; /proc/stat), None where not known."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / TICK
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_s() -> float | None:
    """CPU seconds the machine's CPUs were busy since boot (all but idle and iowait; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        return (sum(cpu[:8]) - cpu[3] - cpu[4]) / TICK
    except (OSError, IndexError, ValueError):
        return None


class CpuMeter:
    """CPU seconds spent by this process and by each named process tree (`tree_cpu_s`) between
    `start` and `stop`, and the CPU seconds stolen from the machine meanwhile (`steal_s`: a shared
    host's other guests; the same code is slower when it is high)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.began: dict[str, float | None] = {}
        self.load_1m = 0.0
        self.steal_began: float | None = None

    def _now(self) -> dict[str, float | None]:
        return {"bench_process": time.process_time(), **{name: tree_cpu_s(pid) for name, pid in self.pids.items()}}

    def start(self) -> None:
        self.load_1m = round(os.getloadavg()[0], 2)
        self.steal_began = steal_s()
        self.began = self._now()

    def stop(self) -> dict[str, Any]:
        ended = self._now()
        cpu = {
            k: round(e - b, 3) if (e is not None and (b := self.began.get(k)) is not None) else None
            for k, e in ended.items()
        }
        stolen = steal_s()
        steal = None if stolen is None or self.steal_began is None else round(stolen - self.steal_began, 2)
        return {"load_1m_at_start": self.load_1m, "steal_s": steal, "cpu_s": cpu}
