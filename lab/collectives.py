"""One shard each way through Spark, side by side on the emulated cluster: how a cycle's two transfers can go.

    python -m lab.collectives --workers 4 --link 30mbit [--numel 376666] [--repeats 7] [--json out.json]

A lab tool of the repository (run from a checkout, as root: it runs itself inside lab/netcluster.py).  With
``--workers`` hosts, each a Spark executor of 2 cores behind a ``--link`` port, it times in rounds:

* **up, tree**: every executor's contribution (``--numel`` float32 values, a partial sum of Eq. 9 as
  :class:`~mpca.runtime.record.ExchangeRecord`) tree-reduced into the driver, as ``cluster.reduce: tree`` does
  (Spark's treeReduce adds no level below a handful of partitions: K shards into the driver's port);
* **up, reduce-scatter**: the same records cut, shuffled and summed on the executors
  (:mod:`mpca.runtime.scatter`, ``cluster.reduce: scatter``), one shard into the driver's port;
* **down, broadcast**: the shard as a Spark broadcast variable read by one task per executor (what the deliver
  tasks do; TorrentBroadcast, ``spark.broadcast.blockSize`` by default 4 MiB);
* **down, all-gather**: the shard cut into one piece per executor, each piece in its own task's data (the
  driver's port carries one shard), then shuffled so that every executor gathers all pieces (not built into
  the runtime: this row says what it would buy).

Each collective alone on an idle cluster: the cycle runs both directions at once, beside training agents and
their task slots, so these are bounds on what a change of one direction can buy, not cycle times.  Prints the
medians, min–max and each alternative's ratio to the built default.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

DEFAULT_NUMEL = 1_130_000 // 3  # a third of the default task's 1.13 M parameters: one shard of S = 3


def _contribution(numel: int, index: int, _rows):
    from mpca.algorithm.rules import WeightedSum
    from mpca.runtime.record import ExchangeRecord

    x = np.random.default_rng(index).standard_normal(numel).astype(np.float32)  # random: Spark compresses zeros
    yield ExchangeRecord(WeightedSum(x, 1.0))


def _spread(pieces: int, it):
    for j, piece in it:
        for dest in range(pieces):
            yield dest, (j, piece)


def _gather(it):
    parts = sorted((v for _, v in it), key=lambda t: t[0])
    yield int(np.concatenate([p for _, p in parts]).size)


def measure(sc, workers: int, numel: int, repeats: int) -> Dict[str, List[float]]:
    from mpca.runtime import scatter
    from mpca.runtime.record import merge_records

    def contributions():
        return sc.parallelize(range(workers), workers).mapPartitionsWithIndex(
            lambda i, rows: _contribution(numel, i, rows))

    def tree():
        return contributions().treeReduce(merge_records, depth=2)

    def reduce_scatter():
        keyed = contributions().flatMap(functools.partial(scatter.split, pieces=workers))
        return scatter.join(keyed.reduceByKey(merge_records, workers, scatter.partition).collect())

    def broadcast(x):
        b = sc.broadcast(x)
        try:
            return sc.parallelize(range(workers), workers).map(lambda i: int(b.value.size)).collect()
        finally:
            b.destroy()

    def all_gather(x):
        pieces = list(enumerate(np.array_split(x, workers)))
        return (sc.parallelize(pieces, workers).mapPartitions(functools.partial(_spread, workers))
                .partitionBy(workers, scatter.partition).mapPartitions(_gather).collect())

    x = np.random.default_rng(99).standard_normal(numel).astype(np.float32)
    runs = {"up, tree": tree, "up, reduce-scatter": reduce_scatter,
            "down, broadcast": lambda: broadcast(x), "down, all-gather": lambda: all_gather(x)}
    assert np.allclose(tree().partial.total, reduce_scatter().partial.total, atol=1e-4)  # and warms the workers
    assert broadcast(x) == all_gather(x) == [numel] * workers
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for r in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
        print(f"collectives: round {r + 1}/{repeats}", file=sys.stderr, flush=True)
    return times


def table(times: Dict[str, List[float]], link: str, workers: int, numel: int) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    base = {"up": med["up, tree"], "down": med["down, broadcast"]}
    lines = [f"{workers} executors behind {link} ports, one shard of {numel} float32 ({numel * 4 / 1e6:.2f} MB); "
             f"medians of {len(next(iter(times.values())))} rounds", "",
             "| collective | median s | min–max s | ÷ built default |", "|---|---|---|---|"]
    for k, v in times.items():
        lines.append(f"| {k} | {med[k]:.2f} | {min(v):.2f}–{max(v):.2f} | {med[k] / base[k.split(',')[0]]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.collectives", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4, help="executor hosts (default 4)")
    ap.add_argument("--link", default="30mbit", help="every host's port (default 30mbit: the ≈ 100 regime)")
    ap.add_argument("--numel", type=int, default=DEFAULT_NUMEL, help=f"values per shard (default {DEFAULT_NUMEL})")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the times here")
    args = ap.parse_args(argv)
    if args.workers < 2 or args.numel < args.workers or args.repeats < 1:
        ap.error("need --workers >= 2, --numel >= --workers and --repeats >= 1")
    from mpca.bench import emulated_cluster

    if not emulated_cluster.inside():
        rc, why = emulated_cluster.run_inside(args.workers, args.link,
                                              [sys.executable, "-m", "lab.collectives", *sys.argv[1:]])
        print(f"collectives: {why}", file=sys.stderr)
        return 2 if rc is None else rc
    spark = emulated_cluster.session_in_cluster("mpca-collectives", {"spark.ui.showConsoleProgress": "false"})
    try:
        times = measure(spark.sparkContext, args.workers, args.numel, args.repeats)
    finally:
        spark.stop()
    print(table(times, args.link, args.workers, args.numel))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"link": args.link, "workers": args.workers, "numel": args.numel, "seconds": times}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
