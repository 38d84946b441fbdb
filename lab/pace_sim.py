"""mpca's cycle pace in the simulator: time to a target against ``algorithm.min_cycle_interval_s`` at several K.

The benchmark's tuning (``bench compare --tune``, :func:`mpca.bench.tuning.pace_next`) chose a slow pace at K = 2
(a cycle at least every 10 T) and a fast one at K = 4 (2 T) in regime ≈ 12 on the emulated network cluster.  This
runs the same question through ``mpca simulate`` — the library's own rules on real gradients, time from the
network and device model, no start-up and no CPU term — at K agents this machine cannot host as processes, and
prints, per cell, the time to each target with what a pace changes: how many cycles the run took, how long one
took, and how many steps an agent took between two contributions of one shard (τ ≈ cycle × S / T).

    python -m lab.pace_sim --agents 2,4,8 --alphas 0.05,0.1,0.4 --paces 0,0.6,1.5,3 --out DIR

``--seeds`` simulations per cell (``mpca simulate --json``, two at a time), their medians in the table, which
reads their JSON, so ``--table-only DIR`` prints it again.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

STEP_S = 0.3
REGIME_12 = ["--device-step-s", str(STEP_S), "--link", "100mbit"]  # ResNet-110's regime (mpca.bench.regimes)
TARGETS = (0.3, 0.26, 0.24)
SHARDS = 3


def cell_name(agents: int, alpha: float, pace: float, seed: int = 0) -> str:
    return f"k{agents}-a{alpha:g}-p{pace:g}" + (f"-s{seed}" if seed else "")


def cell_args(agents: int, alpha: float, pace: float, seed: int, max_seconds: float, json_path: str) -> List[str]:
    args = ["simulate", "-q", "--eval-every", "1", "--seed", str(seed), "--targets", ",".join(f"{t:g}" for t in TARGETS),
            "--rows", "100000", "-k", str(agents), *REGIME_12, "--max-seconds", f"{max_seconds:g}", "-a", "mpca",
            "--json", json_path, f"algorithm.alpha.target={alpha:g}"]  # the overrides last, together
    if pace > 0:
        args.append(f"algorithm.min_cycle_interval_s={pace:g}")
    return args


def run_cell(argv: Sequence[str]) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # two at a time on two cores
    code = "import sys; from mpca.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, stdout=subprocess.DEVNULL).returncode


def summary(result: dict, step_s: float = STEP_S) -> dict:
    """One cell's figures from ``mpca simulate --json``: the time to each target, the cycles it ran, the median
    cycle's duration, and τ, the steps an agent takes between two contributions of one shard (S cycles)."""
    cycles = result["cycles"]
    durations = [c["end"] - c["start"] for c in cycles]
    period = statistics.median([b["start"] - a["start"] for a, b in zip(cycles, cycles[1:])]) if len(cycles) > 1 \
        else None
    return {"time_to": {float(k): v for k, v in result["time_to_target"].items()}, "cycles": len(cycles),
            "cycle_s": statistics.median(durations) if durations else None, "period_s": period,
            "tau": period * SHARDS / step_s if period else None}


def _median(values: List[Optional[float]]) -> Optional[float]:
    """The median, a target not reached counting as later than any reached; None when that is the median."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if m == math.inf else m


def table(cells: Dict[str, dict], agents: Sequence[int], alphas: Sequence[float], paces: Sequence[float],
          seeds: int = 1, target: float = TARGETS[-1]) -> str:
    """Markdown: one row per (K, α, pace); the median over ``seeds`` of the time to ``target`` (min–max) and its
    ratio to the unpaced median of the same K and α, the cycles run, the cycle period and τ (medians); the fastest
    pace of each (K, α) in bold."""
    out = [f"| K | α | pace s | t({target:.0%}) s (min–max) | / unpaced | cycles | period s | τ steps |",
           "|---|---|---|---|---|---|---|---|"]
    for k in agents:
        for a in alphas:
            rows = [(p, [c for c in (cells.get(cell_name(k, a, p, s)) for s in range(seeds)) if c])
                    for p in paces]
            times = [_median([c["time_to"].get(target) for c in runs]) if runs else None for _, runs in rows]
            done = [t for t in times if t is not None]
            best = min(done) if done else None
            base = times[0] if paces and paces[0] == 0 else None
            for (p, runs), t in zip(rows, times):
                if not runs:
                    out.append(f"| {k} | {a:g} | {p:g} | not run | | | | |")
                    continue
                shown = "not reached" if t is None else (f"**{t:g}**" if t == best else f"{t:g}")
                reached = [c["time_to"].get(target) for c in runs]
                if len(runs) > 1:
                    lo = min(v for v in reached if v is not None) if any(v is not None for v in reached) else None
                    hi = None if None in reached else max(reached)
                    shown += f" ({'—' if lo is None else f'{lo:g}'}–{'not reached' if hi is None else f'{hi:g}'})"
                ratio = f"{t / base:.2f}" if t is not None and base else ""
                periods = [c["period_s"] for c in runs if c["period_s"]]
                period = f"{statistics.median(periods):.2f}" if periods else ""
                tau = f"{statistics.median(periods) * SHARDS / STEP_S:.1f}" if periods else ""
                cycles = statistics.median([c["cycles"] for c in runs])
                out.append(f"| {k} | {a:g} | {p:g} | {shown} | {ratio} | {cycles:g} | {period} | {tau} |")
    return "\n".join(out)


def _floats(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="2,4,8")
    ap.add_argument("--alphas", default="0.05,0.1,0.4", help="mpca's α target (algorithm.alpha.target)")
    ap.add_argument("--paces", default="0,0.6,1.5,3", help="algorithm.min_cycle_interval_s; 0: unpaced")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="virtual seconds per cell at most")
    ap.add_argument("--seeds", type=int, default=3, help="simulations per cell (seeds 0 … N − 1): medians")
    ap.add_argument("--out", required=True, help="a directory for each cell's JSON and the table")
    ap.add_argument("--table-only", action="store_true", help="print the table of the cells already in --out")
    args = ap.parse_args(argv)
    agents = [int(k) for k in args.agents.split(",") if k.strip()]
    alphas, paces = _floats(args.alphas), _floats(args.paces)
    if not agents or min(agents) < 1 or not alphas or not paces or min(paces) < 0 or args.seeds < 1:
        ap.error("--agents, --alphas and --paces: comma-separated, K >= 1, paces >= 0; --seeds >= 1")
    os.makedirs(args.out, exist_ok=True)
    todo = [(k, a, p, s) for k in agents for a in alphas for p in paces for s in range(args.seeds)]
    if not args.table_only:
        def one(cell):
            path = os.path.join(args.out, cell_name(*cell) + ".json")
            code = 0 if os.path.exists(path) else run_cell(cell_args(*cell, args.max_seconds, path))
            print(f"{cell_name(*cell)}: {'done' if code == 0 else f'failed ({code})'}", flush=True)
            return code

        with ThreadPoolExecutor(max_workers=2) as pool:
            failed = [c for c, code in zip(todo, pool.map(one, todo)) if code]
        if failed:
            print(f"pace_sim: {len(failed)} cells failed: {[cell_name(*c) for c in failed]}", file=sys.stderr)
    cells = {}
    for cell in todo:
        path = os.path.join(args.out, cell_name(*cell) + ".json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                cells[cell_name(*cell)] = summary(json.load(f))
    text = table(cells, agents, alphas, paces, args.seeds)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
