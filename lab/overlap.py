"""Does a cycle's reduce wait for its broadcast, and what does a cycle cost against B and R alone?

    python -m lab.overlap [--params 7500000] [--cycles 8] [--agents 2] [--alone 5]

Uses the Spark master of ``$MPCA_SPARK_MASTER`` (inside ``python -m lab.netcluster``) or a
local-cluster with 3 task slots per executor.  Prints one JSON line per exchange cycle — when each agent's
reduce task started and yielded, when the broadcast fetch on its executor started (Spark's own task events:
launch + deserialization of the deliver task, :mod:`lab.task_events`) and ended (the deliver
task's Python code started), when the shard was handed over, whether the reduce completed before the broadcast arrived, and inside the
emulated cluster the driver link's utilisation each way (its interface counters) — then one summary line
with B and R, the medians of jobs that only broadcast or only reduce one shard, and the cycle's ratio to
max(B, R) (the 3-phase pipeline's claim: close to 1).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np

RATES = {"1gbit": 1e9, "100mbit": 1e8}


class LinkSampler:
    """Samples this network namespace's eth0 byte counters (the driver's link inside the emulated cluster)."""

    def __init__(self, dev: str = "eth0", every_s: float = 0.02):
        self.base = f"/sys/class/net/{dev}/statistics"
        self.samples = []
        self.every_s = every_s
        self._stop = threading.Event()
        self.ok = os.path.exists(self.base)
        self._t = threading.Thread(target=self._run, daemon=True)

    def _read(self):
        with open(f"{self.base}/tx_bytes") as f, open(f"{self.base}/rx_bytes") as g:
            return int(f.read()), int(g.read())

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.time(), *self._read()))
            time.sleep(self.every_s)

    def __enter__(self):
        if self.ok:
            self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def between(self, t0: float, t1: float):
        """(tx bytes, rx bytes) between two wall times, from the nearest samples."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        return inside[-1][1] - inside[0][1], inside[-1][2] - inside[0][2], inside[-1][0] - inside[0][0]


def _session(agents: int):
    from mpca.bench.emulated_cluster import session_in_cluster
    from mpca.runtime.cluster import local_session

    return (session_in_cluster("mpca-overlap", {"spark.executor.memory": "1024m"})
            or local_session(agents, 3, 1024, app_name="mpca-overlap"))


def _timed(fn) -> float:
    t = time.time()
    fn()
    return time.time() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=7_500_000, help="model size (3 shards; 7.5 M: 10 MB each)")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--alone", type=int, default=5, help="jobs that only broadcast / only reduce, each")
    ap.add_argument("--wire", default="fp32", help="wire format of the exchange (fp32, bf16, int8, int4)")
    args = ap.parse_args(argv)
    from mpca.algorithm import AlphaSchedule
    from mpca.algorithm.mpca import MPCA
    from mpca.bench.exchange import flat_model_fn, sgd
    from mpca.models import cross_entropy
    from mpca.config import settings_from
    from mpca.data.datasets import to_dataframe
    from mpca.runtime.run import AgentRun
    from lab.task_events import TaskEvents

    spark = _session(args.agents)
    spark.sparkContext.setLogLevel("ERROR")
    rate = RATES.get(os.environ.get("MPCA_NETWORK", ""))
    try:
        rng = np.random.default_rng(0)
        df = to_dataframe(spark, rng.random((128, 10), dtype=np.float32), rng.integers(0, 10, 128), args.agents)
        fn = flat_model_fn(args.params)
        settings = settings_from(agents=args.agents, input_shape=(10,), batch_size=16, holdout=0.0,
                                 executor_wait_s=120, algorithm=MPCA(shards=3, alpha=AlphaSchedule.constant(0.05)),
                                 wire=args.wire)
        events = TaskEvents(spark.sparkContext)  # Spark's own task launch / deserialization times
        with LinkSampler() as link, AgentRun(spark, df, model=fn(), model_fn=fn, loss_fn=cross_entropy,
                                             optimizer_fn=sgd, settings=settings) as run:
            pipe, K = run.pipeline, args.agents
            cycles = [run.cycle(c) for c in range(args.cycles)]
            shard = pipe.codec.encode(run.joint_vectors()[0].numpy())  # as the cycles send it
            B, R = [], []
            for i in range(args.alone):
                bc = spark.sparkContext.broadcast(shard)
                plan = pipe.jobs.plan(f"alone-b{i}", "deliver", bcast_shard=0, params={"alpha": 0.05})
                B.append(_timed(lambda: pipe.jobs.run_parts([(plan, K, bc)], "mpca: broadcast alone", "control")))
                bc.destroy(blocking=False)
                plan = pipe.jobs.plan(f"alone-r{i}", "reduce", reduce_shard=i % 3, params={},
                                      reduce_numel=run.rule.shard_numel(i % 3))
                R.append(_timed(lambda: pipe.jobs.run_parts([(plan, K, None)], "mpca: reduce alone", "control")))
        events.close()
        steady = []
        for c in cycles:
            row = {"cycle": c.cycle, "cycle_s": c.t_end - c.t_submit, "reduce_shard": c.reduce_shard,
                   "bcast_shard": c.bcast_shard, "split_tasks": pipe.split_tasks,
                   "reduce_before_broadcast": c.reduce_before_broadcast(),
                   "reduce_started_before_broadcast": c.reduce_started_before_broadcast(),
                   "agents": {a: {"reduce_start": r.t_start - c.t_submit, "yield": (r.t_yield or 0) - c.t_submit,
                                  "deliver_start": (c.delivered[a].t_start - c.t_submit) if a in c.delivered else None,
                                  "handed_over": ((c.delivered[a].t_bc or 0) - c.t_submit) if a in c.delivered else None}
                              for a, r in c.agents.items()}}
            # the broadcast fetch per agent's executor: start from Spark's task events, end when the deliver
            # task's Python code began; and whether the agent's shard went up while that fetch was running
            windows = events.fetch_windows(c)
            row["fetch"] = {a: [w[0] - c.t_submit, w[1] - c.t_submit] for a, w in windows.items()}
            row["reduce_during_fetch"] = any(w[0] <= (c.agents[a].t_yield or 0) <= w[1]
                                             for a, w in windows.items() if a in c.agents)
            moved = link.between(c.t_submit, c.t_end) if link.ok else None
            if moved and rate:
                tx, rx, dt = moved
                row.update({"driver_tx_util": 8 * tx / dt / rate, "driver_rx_util": 8 * rx / dt / rate})
            if moved:
                row.update({"driver_tx_mb": moved[0] / 1e6, "driver_rx_mb": moved[1] / 1e6})  # its link, as counted
            print(json.dumps(row), flush=True)
            if c.bcast_shard is not None and c.cycle >= 3:
                steady.append(row)
        if steady:
            cyc, b, r = statistics.median(x["cycle_s"] for x in steady), statistics.median(B), statistics.median(R)
            summary = {"summary": True, "network": os.environ.get("MPCA_NETWORK", "local-cluster"), "wire": args.wire,
                       "shard_mb": len(shard) / 1e6, "agents": K, "split_tasks": pipe.split_tasks, "cycle_s": cyc,
                       "B_s": b, "R_s": r, "cycle_over_max_BR": cyc / max(b, r), "cycle_over_B_plus_R": cyc / (b + r),
                       "reduce_before_broadcast": sum(x["reduce_before_broadcast"] for x in steady),
                       "reduce_during_fetch": sum(x["reduce_during_fetch"] for x in steady),
                       "steady_cycles": len(steady)}
            for k in ("driver_tx_util", "driver_rx_util", "driver_tx_mb", "driver_rx_mb"):
                vals = [x[k] for x in steady if k in x]
                if vals:
                    summary[k] = statistics.median(vals)
            print(json.dumps(summary), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
