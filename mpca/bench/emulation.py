"""Whether a benchmark run's emulated devices held (``emulation.device_step_s``, :class:`~mpca.exchange.device.DeviceClock`).

An emulated device makes every agent's training step take a fixed wall time T, as if each agent had its own
accelerator and the host's CPU were free for the exchange.  That model holds only while the real step fits
in T and the machine has CPU to spare: a run where agents fell behind T, or where the machine was saturated
(the exchange, the JVMs and the driver then compete with the agents), measures this machine, not the
emulated cluster, and is marked instead of reported as a result.
"""
from __future__ import annotations

import statistics
from typing import Dict, Iterable, Optional

LATE_LIMIT = 0.05  # at most 5% of the steps may take longer than T
BUSY_LIMIT = 0.90  # the machine's CPUs at most 90% busy over the run


def device_check(agents: Iterable[dict], cpu: Dict[str, float], step_s: Optional[float],
                 late_limit: float = LATE_LIMIT, busy_limit: float = BUSY_LIMIT) -> dict:
    """From the agents' summaries (``steps``, ``compute_s``, ``cpu_s``, ``late_steps``) and the run's CPU profile
    (:mod:`mpca.bench.cpu_profile`): the median real step and its CPU, the share of late steps, how busy the
    machine was, and whether the emulation held (None without emulation: measured only)."""
    agents = [a for a in agents if a.get("steps")]
    steps = sum(int(a["steps"]) for a in agents)
    compute = [float(a.get("compute_s") or 0.0) / int(a["steps"]) for a in agents]
    cpu_step = [float(a.get("cpu_s") or 0.0) / int(a["steps"]) for a in agents]
    late = sum(int(a.get("late_steps") or 0) for a in agents) / steps if steps else 0.0
    busy = float(cpu.get("machine busy", 0.0))
    problems = []
    if step_s is not None:
        if not steps:
            problems.append("no agent made a step")
        if late > late_limit:
            problems.append(f"agents fell behind T: {100 * late:.0f}% of steps took longer than "
                            f"{1000 * step_s:g} ms (median real step {1000 * _median(compute):.1f} ms)")
        if busy > busy_limit:
            problems.append(f"machine saturated: {100 * busy:.0f}% busy (limit {100 * busy_limit:.0f}%)")
    return {"device_step_s": step_s, "real_step_s": _median(compute), "cpu_per_step_s": _median(cpu_step),
            "late_fraction": late, "machine_busy": busy,
            "holds": None if step_s is None else not problems, "why": "; ".join(problems)}


def verdict(checks: Iterable[dict]) -> str:
    """One cell for the table: '' without emulation, 'ok' when every repeat held, else 'INVALID: why'."""
    checks = list(checks)
    if not checks or all(c["holds"] is None for c in checks):
        return ""
    bad = [c["why"] for c in checks if c["holds"] is False]
    return "ok" if not bad else f"INVALID: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")
