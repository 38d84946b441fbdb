"""The paper's two regimes in simulation (issue 26, part 3; issue 23's ≈ 100 regime, which this machine cannot
hold with real agents): every algorithm through the benchmark's own grid (:mod:`mpca.bench.tuning`: the 1:5
rule's periods and neighbours, EASGD's K r, DiLoCo's outer learning rates, MPCA's α, extended past the grid's
edge as ``bench compare`` does, up to four points here), each setting over several seeds, at the regime's link and step time
(:data:`mpca.bench.regimes.REGIMES`), on the benchmark's 1.13 M-parameter MLP and teacher task; the best setting
of each algorithm and its time to each target, and mpca's ratio to each.  A prediction of the simulator
(``mpca simulate``'s models: no start-up, no CPU), not a measurement.

    python -m lab.regimes_sim --regime vgga-gbe --agents 4,8 --json docs/regimes-sim.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Dict, List

import torch

from mpca.algorithm import build_algorithm
from mpca.bench.regimes import regime
from mpca.bench.tuning import at_best, beyond, grid
from mpca.sim.command import parse_rate
from mpca.sim.constants import NetworkConstants
from mpca.exchange.device import ComputeModel
from mpca.sim.grid import crossing_time
from mpca.sim.simulator import SimConfig, Simulator
from mpca.sim.workload import TeacherWorkload

ALGORITHMS = ("mpca", "sync", "diloco", "streaming_diloco", "delayed_diloco", "easgd")
TARGETS = (0.30, 0.26, 0.24)  # the benchmark's (bench compare's default on the teacher task)


def base_config(name: str, agents: int, max_s: float, rows: int, link: str = None) -> SimConfig:
    """The regime's link (or ``link``: ``inf`` is the physical limit, where only compute counts) and step time."""
    r = regime(name)
    return SimConfig(agents=agents, network=NetworkConstants(link_bps=parse_rate(link or r.link)),
                     compute=ComputeModel(step_s=r.device_step_s),
                     workload=TeacherWorkload(hidden=(1024, 1024), rows_per_agent=rows),
                     max_virtual_s=max_s, eval_every_s=1.0, targets=TARGETS)


def times_to(base: SimConfig, algorithm: dict, seeds) -> Dict[str, object]:
    """Every seed's run of one setting: the crossing time of each target (None: not reached), per seed."""
    cfg = base.model_copy(update={"algorithm": build_algorithm(algorithm)})
    runs = [Simulator(cfg.model_copy(update={"seed": s})).run() for s in seeds]
    return {"algorithm": algorithm, "times": {str(t): [crossing_time(r.history, t) for r in runs] for t in TARGETS},
            "wall_s": sum(r.wall_s for r in runs)}


def score(entry: Dict[str, object]) -> tuple:
    """Smaller is better: more targets reached on every seed, then the mean time to the tightest of them."""
    reached = [t for t, v in entry["times"].items() if all(x is not None for x in v)]
    if not reached:
        return (0, math.inf)
    tight = min(reached, key=float)
    return (-len(reached), sum(entry["times"][tight]) / len(entry["times"][tight]))


def best_index(tried: List[Dict[str, object]]) -> int:
    """Index of the best of ``tried`` by :func:`score`."""
    return min(range(len(tried)), key=lambda j: score(tried[j]))


def tune(base: SimConfig, name: str, ratio: float, seeds, extend: int) -> List[Dict[str, object]]:
    """The benchmark's grid for ``name``, extended past its edge up to ``extend`` times (simulation is cheap:
    further than ``bench compare``'s two, so that no baseline's optimum is cut off); every entry kept."""
    tried = []
    for label, algo in grid(name, ratio, base.agents):
        tried.append({"label": label, **times_to(base, algo, seeds)})
        print(f"  {name} {label}: {_fmt(tried[-1])}", file=sys.stderr, flush=True)
    for _ in range(extend):
        more = beyond(name, tried, best_index(tried))
        if more is None:
            break
        tried.append({"label": more[0], **times_to(base, more[1], seeds)})
        print(f"  {name} {more[0]} (past the grid's edge): {_fmt(tried[-1])}", file=sys.stderr, flush=True)
    for label, algo in at_best(name, tried, best_index(tried)):
        tried.append({"label": label, **times_to(base, algo, seeds)})  # DiLoCo's outer lrs at the period found
        print(f"  {name} {label} (at the best period): {_fmt(tried[-1])}", file=sys.stderr, flush=True)
    return tried


def _mean(values) -> float:
    return math.nan if any(v is None for v in values) else sum(values) / len(values)


def _fmt(entry) -> str:
    return " / ".join("—" if math.isnan(_mean(v)) else f"{_mean(v):.1f}" for v in entry["times"].values())


def markdown(result: Dict[str, object]) -> str:
    lines = []
    for key, cell in result["cells"].items():
        lines += [f"**{key}** (mean over {len(result['seeds'])} seeds; t in virtual seconds)", "",
                  "| algorithm | best setting | " + " | ".join(f"t({100 * t:g}%) s" for t in TARGETS) +
                  " | seeds' t(24%) | mpca / it | settings tried |", "|---|---|" + "---|" * (len(TARGETS) + 3)]
        ref = _mean(cell["mpca"]["best"]["times"][str(TARGETS[-1])]) if "mpca" in cell else math.nan
        for name, r in cell.items():
            best = r["best"]
            tight = best["times"][str(TARGETS[-1])]
            t = _mean(tight)
            ratio = "—" if math.isnan(t) or math.isnan(ref) else f"{ref / t:.2f}"
            seeds = ", ".join("—" if x is None else f"{x:.0f}" for x in tight)
            lines.append(f"| {name} | {best['label']} | " + " | ".join(
                "—" if math.isnan(_mean(v)) else f"{_mean(v):.1f}" for v in best["times"].values()) +
                f" | {seeds} | {ratio} | {len(r['tried'])} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regime", default="vgga-gbe", help="resnet110-gbe or vgga-gbe (comma-separated for both)")
    ap.add_argument("--agents", default="4", help="K values, comma-separated")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="virtual seconds per run at most")
    ap.add_argument("--rows", type=int, default=50_000, help="teacher rows per agent")
    ap.add_argument("--extend", type=int, default=4, help="points past the grid's edge at most, per algorithm")
    ap.add_argument("--link", default=None, help="every host's port instead of the regime's: inf gives the "
                    "infinite-bandwidth limit that every time is divided by (the period grid stays the regime's)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (one: several of these side by side run far faster than oversubscribed)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = list(range(args.seeds))
    result = {"targets": list(TARGETS), "seeds": seeds, "rows_per_agent": args.rows, "cells": {}}
    t0 = time.time()
    for name in args.regime.split(","):
        r = regime(name)
        for k in (int(x) for x in args.agents.split(",")):
            key = f"{r.describe()}, K = {k}" + (f", link {args.link}" if args.link else "")
            print(key, file=sys.stderr, flush=True)
            base = base_config(name, k, args.max_seconds, args.rows, args.link)
            cell = {}
            for algo in args.algorithms.split(","):
                tried = tune(base, algo, r.ratio, seeds, args.extend)
                cell[algo] = {"best": tried[best_index(tried)], "tried": tried}
            result["cells"][key] = cell
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=1)
    result["wall_s"] = time.time() - t0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(markdown(result))
    print(f"wall {result['wall_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
