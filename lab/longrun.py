"""Long runs: memory of the driver and the executors over thousands of exchange cycles (a command).

    python -m lab.longrun [--cycles 10000] [--samples 20] [--numel 100000] [--timeline-window 1000]

Runs MPCA with 2 agents of a small flat model on local-cluster and samples, every ``cycles / samples``
cycles, the resident memory (RSS) of the driver's Python process and JVM, of the executors' JVMs and of
their Python workers (agents and exchange tasks), with the broadcasts created and destroyed so far and the
timeline's cycles in memory and spilled to disk.  It prints a table, the growth after warm-up (the first
tenth of the cycles: median of the last 5 samples / of the first 5 after it) and the driver's Python from
the end of warm-up to the end of the run (with 10,000 cycles: from cycle 1,000 to 10,000).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Dict, List, Tuple

import numpy as np

from lab.faults import parent_of


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pids: List[int]) -> List[int]:
    """Every process below the given ones (the executors' pyspark daemons and their workers)."""
    parent: Dict[int, int] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[int(p)] = parent_of(int(p))
        except OSError:
            continue
    found, frontier = [], set(pids)
    while frontier:
        frontier = {c for c, pp in parent.items() if pp in frontier}
        found += sorted(frontier)
    return found


def sample(spark) -> Dict[str, float]:
    from mpca.bench.exchange import executor_jvms

    sc = spark.sparkContext
    jvm = getattr(getattr(sc, "_gateway", None), "proc", None)
    executors = executor_jvms(sc.applicationId)
    return {"driver_py_mb": _rss_mb(os.getpid()), "driver_jvm_mb": _rss_mb(jvm.pid) if jvm is not None else 0.0,
            "executor_jvms_mb": sum(_rss_mb(p) for p in executors),
            "executor_python_mb": sum(_rss_mb(p) for p in _children(executors))}


def long_run(spark, cycles: int, samples: int, numel: int, timeline_window: int = 1000) -> List[dict]:
    from mpca.bench.exchange import flat_model_fn, sgd
    from mpca.models import cross_entropy
    from mpca.config import settings_from
    from mpca.data.datasets import to_dataframe
    from mpca.runtime.run import AgentRun

    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.random((256, 10), dtype=np.float32), rng.integers(0, 10, 256), 2)
    fn = flat_model_fn(numel)
    settings = settings_from(agents=2, batch_size=32, input_shape=(10,), timeline_window=timeline_window)
    every = max(1, cycles // samples)
    rows, t0 = [], time.time()
    with AgentRun(spark, df, model=fn(), model_fn=fn, loss_fn=cross_entropy, optimizer_fn=sgd, settings=settings) as run:
        for c in range(cycles):
            run.cycle(c)
            if (c + 1) % every == 0:
                b = run.counters().broadcasts
                rows.append({"cycle": c + 1, "wall_s": time.time() - t0, **sample(spark),
                             "broadcasts_created": b["created"], "broadcasts_destroyed": b["destroyed"],
                             "timeline_in_memory": len(run.timeline.cycles), "timeline_spilled": run.timeline.spilled})
                r = rows[-1]
                print(f"{r['cycle']:>7} {r['wall_s']:>8.0f} {r['driver_py_mb']:>10.0f} {r['driver_jvm_mb']:>10.0f} "
                      f"{r['executor_jvms_mb']:>10.0f} {r['executor_python_mb']:>10.0f} "
                      f"{r['broadcasts_created']:>8} {r['broadcasts_destroyed']:>8}", flush=True)
    return rows


def growth(rows: List[dict], key: str, warm_up: float = 0.1, window: int = 5) -> float:
    """Median of the last ``window`` samples over the median of the first ``window`` after the warm-up
    fraction of the run (medians: a JVM's RSS swings with its garbage collections)."""
    import statistics

    after = [r[key] for r in rows if r["cycle"] > warm_up * rows[-1]["cycle"]]
    if not after:
        return float("nan")
    first, last = statistics.median(after[:window]), statistics.median(after[-window:])
    return last / first if first else float("nan")


def span(rows: List[dict], key: str, warm_up: float = 0.1) -> Tuple[int, float, int, float]:
    """(cycle, value) of the first sample at or after the warm-up fraction of the run, and of the last."""
    first = next(r for r in rows if r["cycle"] >= warm_up * rows[-1]["cycle"])
    return first["cycle"], first[key], rows[-1]["cycle"], rows[-1][key]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--numel", type=int, default=100_000, help="model parameters (S = 3 shards)")
    ap.add_argument("--timeline-window", type=int, default=1000,
                    help="cycles of the timeline kept in memory (training.timeline_window; above --cycles: all, as before)")
    ap.add_argument("--out", default="runs/longrun.csv")
    args = ap.parse_args(argv)
    from mpca.runtime.cluster import local_session

    spark = local_session(2, 2, 1024, app_name="mpca-longrun")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"{'cycle':>7} {'wall s':>8} {'driver py':>10} {'driver JVM':>10} {'exec JVMs':>10} {'exec py':>10} "
              f"{'bc made':>8} {'bc gone':>8}   (RSS in MB)")
        rows = long_run(spark, args.cycles, args.samples, args.numel, args.timeline_window)
    finally:
        spark.stop()
    import pandas as pd

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    keys = ("driver_py_mb", "driver_jvm_mb", "executor_jvms_mb", "executor_python_mb")
    print("growth after warm-up (median of the last 5 samples / of the first 5 after the first 10% of cycles): " +
          ", ".join(f"{k.removesuffix('_mb')} {growth(rows, k):.2f}" for k in keys))
    c0, v0, c1, v1 = span(rows, "driver_py_mb")
    print(f"driver Python {v0:.0f} MB at cycle {c0:,} -> {v1:.0f} MB at cycle {c1:,}: growth {v1 / v0:.3f}")
    print(f"timeline: {rows[-1]['timeline_in_memory']:,} cycles in memory, {rows[-1]['timeline_spilled']:,} spilled "
          f"to disk")
    print(f"broadcasts created {rows[-1]['broadcasts_created']}, destroyed {rows[-1]['broadcasts_destroyed']}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
