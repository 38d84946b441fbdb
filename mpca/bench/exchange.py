"""Benchmark of the Spark runtime (a command, not a test).

    python -m mpca.bench.exchange [--agents 1 2] [--window 8] [--repeats 3] [--sizes-mb 1 10 100]

1. **Exchange overhead on training.**  The same agents, in one run, alternate
   windows with the exchange running and windows with it off; the ratio of
   their steps/s (medians over the windows) shows what the exchange costs the
   training.  The model is compute-dominated (an MLP on a large batch).
2. **Cycle time per shard size.**  For shards of 1, 10 and 100 MB (S = 3, so
   models of 3, 30 and 300 MB) the median wall time of one exchange cycle.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import List, Optional

import numpy as np
import torch
from torch import nn

from mpca.algorithm import AlphaSchedule
from mpca.bench.cpu_profile import command_line, pids, process_cpu_s
from mpca.config import settings_from
from mpca.models import cross_entropy


class ComputeHeavyMLP(nn.Module):
    """~0.4M parameters (1.6 MB); a batch of 512 makes its step compute-dominated."""

    def __init__(self, width: int = 384):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x.flatten(1))


class FlatModel(nn.Module):
    """A model that is one big parameter vector of ``numel`` floats with a cheap forward (cycle-time bench).

    Random, not zero: Spark compresses broadcast blocks, and zeros would cross the wire as almost nothing."""

    def __init__(self, numel: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 0.01)

    def forward(self, x):
        return x.flatten(1)[:, :10] * self.w[:10]


def compute_heavy():
    return ComputeHeavyMLP()


def flat_model_fn(numel: int):
    import functools

    return functools.partial(FlatModel, numel)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01)


def _steps(run) -> dict:
    return {a: e.steps for a, e in run.agent_status().items()}


def processes_with(*needles: bytes) -> list:
    """PIDs of the processes whose command line holds any of ``needles`` (from /proc)."""
    return [pid for pid in pids() if (cmd := command_line(pid)) is not None and any(n in cmd for n in needles)]


def executor_jvms(app_id: str) -> list:
    executors = set(processes_with(b"CoarseGrainedExecutorBackend"))
    return [p for p in processes_with(app_id.encode()) if p in executors]


class CpuMeter:
    """CPU seconds spent by the driver (its Python process and its JVM) and by the executors' JVMs."""

    def __init__(self, spark):
        sc = spark.sparkContext
        self.jvm = getattr(getattr(sc, "_gateway", None), "proc", None)
        self.executors = executor_jvms(sc.applicationId)

    def read(self) -> dict:
        return {"driver_python": time.process_time(),
                "driver_jvm": (process_cpu_s(self.jvm.pid) or 0.0) if self.jvm is not None else 0.0,
                "executor_jvms": sum(process_cpu_s(p) or 0.0 for p in self.executors)}


def overhead(spark, agents: int, window: float, repeats: int, interval: float = 0.0,
             agent_cpus: Optional[List[int]] = None) -> dict:
    from mpca.data.datasets import dataset_dataframe
    from mpca.runtime.run import AgentRun

    df = dataset_dataframe(spark, "digits")
    settings = settings_from(algorithm={"name": "mpca", "alpha": AlphaSchedule.constant(0.05)}, input_shape=(64,),
                             training={"agents": agents, "batch_size": 512, "agent_cpus": agent_cpus})
    on, off, cycles, task_cpu = [], [], [], []
    meter = CpuMeter(spark)
    cpu_on = {k: 0.0 for k in meter.read()}
    with AgentRun(spark, df, model=compute_heavy(), model_fn=compute_heavy, loss_fn=cross_entropy, optimizer_fn=sgd,
                  settings=settings) as run:
        c = 0
        time.sleep(2)  # let the agents reach their steady speed
        for _ in range(repeats):
            s0, t0 = _steps(run), time.time()
            time.sleep(window)
            s1, t1 = _steps(run), time.time()
            off.append(sum(s1[a] - s0[a] for a in s1) / (t1 - t0))
            s0, t0 = _steps(run), time.time()
            c0, m0 = c, meter.read()
            while time.time() - t0 < window:
                rec = run.cycle(c)
                cycles.append(rec.t_end - rec.t_submit)
                task_cpu.append(sum(r.exchange_cpu_s or 0 for part in (rec.agents, rec.delivered)
                                    for r in part.values()))
                c += 1
                time.sleep(max(0.0, interval - (time.time() - rec.t_submit)))  # throttled exchange
            m1 = meter.read()
            for k in cpu_on:
                cpu_on[k] += (m1[k] - m0[k]) / max(1, c - c0)
            s1, t1 = _steps(run), time.time()
            on.append(sum(s1[a] - s0[a] for a in s1) / (t1 - t0))
    return {"agents": agents, "interval": interval, "steps_s_on": statistics.median(on), "steps_s_off": statistics.median(off),
            "ratio": statistics.median(on) / statistics.median(off), "cycle_s": statistics.median(cycles),
            "cycles": c, "exchange_task_cpu_s": statistics.median(task_cpu) if task_cpu else float("nan"),
            **{f"{k}_cpu_s": v / repeats for k, v in cpu_on.items()}}


def cycle_time(spark, shard_mb: float, agents: int, cycles: int) -> dict:
    from mpca.data.datasets import to_dataframe
    from mpca.runtime.run import AgentRun

    numel = int(3 * shard_mb * 1024 * 1024 / 4)
    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.random((256, 10), dtype=np.float32), rng.integers(0, 10, 256), agents)
    fn = flat_model_fn(numel)
    times = []
    settings = settings_from(agents=agents, batch_size=32, input_shape=(10,), agent_start_timeout_s=600)
    with AgentRun(spark, df, model=fn(), model_fn=fn, loss_fn=cross_entropy, optimizer_fn=sgd, settings=settings) as run:
        for c in range(cycles):
            rec = run.cycle(c)
            times.append(rec.t_end - rec.t_submit)
    steady = times[3:] or times
    return {"shard_mb": shard_mb, "cycle_s": statistics.median(steady), "min_s": min(steady), "max_s": max(steady)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="mpca runtime benchmark: exchange overhead and cycle time")
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--window", type=float, default=8.0, help="seconds per on/off window")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes-mb", type=float, nargs="*", default=[1, 10, 100])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--intervals", type=float, nargs="+", default=[0.0, 1.0],
                    help="minimum seconds between cycle starts (0 = exchange as fast as possible)")
    ap.add_argument("--executor-memory-mb", type=int, default=2048)
    ap.add_argument("--reserve-core", action="store_true",
                    help="pin the agents' training threads to CPU 0 and everything else (driver, JVMs, exchange "
                         "tasks) to the other CPUs: the runtime's own cost, without competing for the agent's core")
    args = ap.parse_args(argv)

    from mpca.runtime.cluster import local_session

    agent_cpus = None
    if args.reserve_core:
        others = set(os.sched_getaffinity(0)) - {0}
        if not others or 0 not in os.sched_getaffinity(0):
            raise SystemExit("--reserve-core needs CPU 0 and at least one other CPU")
        os.sched_setaffinity(0, others)  # this driver and every process it starts (JVMs, Python workers)
        agent_cpus = [0]
        print(f"reserved core: agents' training threads on CPU 0; driver, JVMs and exchange tasks on CPUs "
              f"{sorted(others)}")
    spark = local_session(max(args.agents), 2, args.executor_memory_mb, app_name="mpca-bench",
                          conf={"spark.driver.maxResultSize": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"cluster: local-cluster[{max(args.agents)},2,{args.executor_memory_mb}] on {torch.get_num_threads()} "
              "driver threads")
        print("\n1) agents' steps/s with the exchange running / with it off (same agents, alternating windows)")
        print(f"{'agents':>6} {'min interval s':>14} {'on steps/s':>11} {'off steps/s':>12} {'ratio':>6} "
              f"{'cycle s':>8} {'cycles':>7}   CPU s per cycle: {'tasks':>6} {'exec JVM':>8} {'drv py':>6} {'drv JVM':>7}")
        for k in args.agents:
            for iv in args.intervals:
                r = overhead(spark, k, args.window, args.repeats, iv, agent_cpus)
                print(f"{r['agents']:>6} {iv:>14.1f} {r['steps_s_on']:>11.1f} {r['steps_s_off']:>12.1f} "
                      f"{r['ratio']:>6.2f} {r['cycle_s']:>8.2f} {r['cycles']:>7}   {'':>16} "
                      f"{r['exchange_task_cpu_s']:>6.3f} {r['executor_jvms_cpu_s']:>8.3f} "
                      f"{r['driver_python_cpu_s']:>6.3f} {r['driver_jvm_cpu_s']:>7.3f}", flush=True)
        if args.sizes_mb:
            print("\n2) exchange cycle time per shard size (S = 3, 2 agents, median after 3 warm-up cycles)")
            print(f"{'shard MB':>8} {'cycle s':>8} {'min s':>7} {'max s':>7}")
            for mb in args.sizes_mb:
                r = cycle_time(spark, mb, min(2, max(args.agents)), args.cycles)
                print(f"{r['shard_mb']:>8.0f} {r['cycle_s']:>8.2f} {r['min_s']:>7.2f} {r['max_s']:>7.2f}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
