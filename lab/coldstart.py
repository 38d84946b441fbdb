"""A fresh session's first fit: how long until its agents start and the joint model first moves.

    python -m lab.coldstart [-c conf/digits.yaml] [--repeats 3] [--tree before=/path/to/old/checkout] [KEY=VALUE ...]

Every run is its own Python process with its own local-cluster session, as a ``spark-submit`` job or a
notebook's first ``fit`` is: no Python worker exists on the executors yet. This is what ``bench compare``
keeps out of its times by a warm-up run. Each run times ``fit`` from its call: the driver's preparation
before the clock's 0, when every agent had answered, the first useful exchange (the first cycle that handed
the agents a shard of the joint model) and when each agent's Spark task started. ``--tree NAME=DIR`` adds
the code of another checkout (its ``mpca`` first on ``PYTHONPATH``, on the driver and on the executors) as a
row beside the installed code; the rows take turns, run by run. It prints a table of medians (min–max) and
writes every run to ``coldstart.json``.

What it does not model: executors on other machines. On a real cluster the executors' Python workers start
on their own cores; here the executors, the driver and its JVM share this machine's cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

FIELDS = ("prepare_s", "agents_up_s", "task_started_s", "first_exchange_s", "first_exchange_from_call_s", "fit_s")


def one_run(config: str, overrides: List[str]) -> dict:
    """One fit in this process's own fresh session (the child's side); its start-up figures."""
    from mpca import __file__ as mpca_file
    from mpca.config import load_config
    from mpca.job import job_dataframe
    from mpca.models import training_functions
    from mpca.runtime.cluster import session_for
    from mpca.trainer import Trainer

    out = tempfile.mkdtemp(prefix="mpca-coldstart-")
    cfg = load_config([config], [f"run.output_dir={out}", f"checkpoint.dir={out}/ck", "progress=off", *overrides])
    spark, _ = session_for(cfg.cluster, "mpca-coldstart")
    try:
        df = job_dataframe(spark, cfg.data, cfg.training.agents)
        called = time.time()
        fit = Trainer(*training_functions(cfg.model, cfg.optimizer), cfg, spark=spark).fit(df)
        fit_s = time.time() - called
        workers = spark.sparkContext.parallelize(range(cfg.training.agents), cfg.training.agents).map(
            lambda _: ("torch" in sys.modules, os.path.dirname(__import__("mpca").__file__))).collect()  # the
        # control and exchange jobs' workers, idle now: whether they imported torch, and whose mpca they run
    finally:
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    started = [p["task_started_s"] for p in fit.startup.values() if p.get("task_started_s") is not None]
    first = fit.first_exchange_s
    return {"mpca": os.path.dirname(mpca_file), "executors_mpca": sorted({w[1] for w in workers}),
            "prepare_s": fit.prepare_s, "agents_up_s": fit.agents_up_s,
            "task_started_s": max(started) if started else None, "first_exchange_s": first,
            "first_exchange_from_call_s": None if first is None else first + fit.prepare_s, "fit_s": fit_s,
            "torch_in_control_workers": sum(w[0] for w in workers), "control_workers": len(workers)}


def _child(tree: str, config: str, overrides: List[str]) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    # run as a script (its own directory first on sys.path, not the working directory): mpca then comes from
    # the tree where one is given, else from the installed package
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "-c", config, *overrides], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise SystemExit(f"a run failed (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(lines[-1])


def _cell(values: List[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def table(runs: Dict[str, List[dict]]) -> str:
    rows = ["| code | " + " | ".join(FIELDS) + " | control workers with torch |",
            "|---" * (len(FIELDS) + 2) + "|"]
    for name, rs in runs.items():
        torch_workers = f"{sum(r['torch_in_control_workers'] for r in rs)} of {sum(r['control_workers'] for r in rs)}"
        rows.append(f"| {name} | " + " | ".join(_cell([r[f] for r in rs]) for f in FIELDS) + f" | {torch_workers} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default="conf/digits.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="another checkout's code as a row (its directory first on PYTHONPATH)")
    ap.add_argument("--out", default="coldstart.json")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one run, one JSON line
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.config, args.overrides)), flush=True)
        return 0
    trees = {"installed": ""}
    for item in args.tree:
        name, _, path = item.partition("=")
        if not os.path.isdir(os.path.join(path, "mpca")):
            raise SystemExit(f"--tree {item}: {path} has no mpca package; give a checkout's root directory")
        trees[name] = os.path.abspath(path)
    config = os.path.abspath(args.config)
    runs: Dict[str, List[dict]] = {name: [] for name in trees}
    for r in range(args.repeats):
        order = list(trees) if r % 2 == 0 else list(reversed(list(trees)))  # turns: neither always goes first
        for name in order:
            result = _child(trees[name], config, args.overrides)
            runs[name].append(result)
            print(f"repeat {r + 1}/{args.repeats} {name} ({result['mpca']}; executors: "
                  f"{', '.join(result['executors_mpca'])}): " + ", ".join(
                      f"{f} {result[f]:.1f}" for f in FIELDS if result[f] is not None), flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"config": args.config, "overrides": args.overrides, "runs": runs}, f, indent=1)
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
