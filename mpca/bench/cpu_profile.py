"""Where a run's CPU went: cores used by each role of a Spark training run on this machine, from /proc.

A benchmark that misses a speed target on a shared machine has to say what limits it.  ``CpuProfile``
reads every process's CPU time (utime + stime, all threads) over a window and sums it by role:

- ``agents``: the processes running agents (their PIDs come from the agents' reports): training, and the
  agent's own channel thread that snapshots and receives shards;
- ``python workers``: the other PySpark worker processes — the exchange tasks, data loading;
- ``executor JVMs``, ``driver JVM``, ``driver Python`` (this process), ``standalone JVMs`` (master and
  workers of an emulated cluster), ``other`` (everything else on the machine: shells, other users' work).

It also reads /proc/stat: how busy the machine's CPUs were over the window.  A thread reads /proc every
``interval_s`` so that a process that ends inside the window (an agent's Python worker when the run stops)
keeps the CPU it had used when last seen; processes started inside the window count from zero.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

ROLES = ("agents", "python workers", "executor JVMs", "driver JVM", "driver Python", "standalone JVMs", "other")
_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> Optional[float]:
    """utime + stime of a process (all its threads) in seconds, from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError):
        return None


def command_line(pid: int) -> Optional[bytes]:
    """The process's NUL-separated command line, from /proc; None if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def pids() -> List[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cpu_and_cmd(pid: int) -> Optional[Tuple[float, bytes]]:
    cpu, cmd = process_cpu_s(pid), command_line(pid)
    return None if cpu is None or cmd is None else (cpu, cmd)


def _machine_ticks() -> Tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (idle and iowait count as not busy)."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals[:8]) - idle, sum(vals[:8])


def role_of(pid: int, cmd: bytes, agent_pids: Iterable[int], driver_jvm: Optional[int]) -> str:
    if pid in agent_pids:
        return "agents"
    if pid == os.getpid():
        return "driver Python"
    if driver_jvm is not None and pid == driver_jvm:
        return "driver JVM"
    if b"CoarseGrainedExecutorBackend" in cmd:
        return "executor JVMs"
    if b"deploy.master.Master" in cmd or b"deploy.worker.Worker" in cmd:
        return "standalone JVMs"
    if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd or b"pyspark/daemon" in cmd:
        return "python workers"
    return "other"


class CpuProfile:
    """``start()``, run the work, ``stop(agent_pids)`` → cores used per role over the window (CPU seconds
    divided by wall seconds; 1.0 = one core busy all the time) and the machine's busy share."""

    def __init__(self, driver_jvm_pid: Optional[int] = None, interval_s: float = 1.0):
        self.driver_jvm = driver_jvm_pid
        self.interval_s = interval_s
        self._t0 = 0.0
        self._first: Dict[int, float] = {}
        self._last: Dict[int, Tuple[float, bytes]] = {}
        self._ticks0 = (0, 0)
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def for_spark(cls, spark, interval_s: float = 1.0) -> "CpuProfile":
        proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
        return cls(proc.pid if proc is not None else None, interval_s)

    def _sample(self) -> None:
        for pid in pids():
            if (got := _cpu_and_cmd(pid)) is not None:
                self._last[pid] = got

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            self._sample()

    def start(self) -> "CpuProfile":
        self._sample()
        self._first = {pid: cpu for pid, (cpu, _) in self._last.items()}
        self._ticks0 = _machine_ticks()
        self._t0 = time.time()
        self._done.clear()
        self._thread = threading.Thread(target=self._loop, name="mpca-cpu-profile", daemon=True)
        self._thread.start()
        return self

    def stop(self, agent_pids: Iterable[int] = ()) -> Dict[str, float]:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        wall = max(1e-9, time.time() - self._t0)
        busy1, total1 = _machine_ticks()
        agents = set(agent_pids)
        cores = {r: 0.0 for r in ROLES}
        for pid, (cpu, cmd) in self._last.items():
            cores[role_of(pid, cmd, agents, self.driver_jvm)] += max(0.0, cpu - self._first.get(pid, 0.0)) / wall
        busy0, total0 = self._ticks0
        return {**cores, "machine busy": (busy1 - busy0) / max(1, total1 - total0), "cpus": float(os.cpu_count() or 1)}


def describe(profile: Dict[str, float]) -> str:
    """One line: ``machine 97% busy of 2 CPUs | agents 1.21 | executor JVMs 0.21 | ...`` (cores used)."""
    parts = [f"{r} {profile[r]:.2f}" for r in ROLES if profile.get(r, 0.0) >= 0.005]
    return f"machine {100 * profile['machine busy']:.0f}% busy of {profile['cpus']:.0f} CPUs | " + " | ".join(parts)
