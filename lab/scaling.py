"""K-scaling in simulation (issue 26, part 3): the time to a target holdout error and the speed-up over one agent
against K, for every algorithm, at 100 Mbit, 1 Gbit and 10 Gbit — :func:`mpca.sim.plan.plan`'s grid with the
model itself as the gradient model (no proxy: the byte scale is 1), real gradients on the teacher task, virtual
time.  Writes ``<out>.json`` (every cell) and ``<out>.png`` (time to target and speed-up against K, one column
per link; skipped with a line when matplotlib is missing) and prints a Markdown table.

    python -m lab.scaling --preset benchmark --out docs/scaling            # 1.13 M-parameter MLP, K = 1..64
    python -m lab.scaling --preset small --out docs/scaling-small          # 9 k-parameter MLP, K = 1..256

A cell runs until the target or until ``--horizon`` × one agent's time (slower: not reached, "—").
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Dict, List

import torch

from mpca.models import MLP
from mpca.sim.command import parse_rate
from mpca.sim.measure import exchanged_values
from mpca.sim.plan import PlanConfig, plan

PRESETS = {
    # the benchmark's MLP (conf/teacher_mlp.yaml), T = 0.3 s: comm/compute ≈ 12 at 100 Mbit (the paper's regime)
    "benchmark": dict(hidden=(1024, 1024), agents=(1, 2, 4, 8, 16, 32, 64), step_s=0.3, target=0.27,
                      rows=100_000, holdout=2000),
    # a small MLP, T = 10 ms: the exchange's per-job overhead, not its bytes, is what costs
    "small": dict(hidden=(64, 64), agents=(1, 2, 4, 8, 16, 32, 64, 128, 256), step_s=0.01, target=0.27,
                  rows=100_000, holdout=2000),
}
LINKS = ("100mbit", "1gbit", "10gbit")
ALGORITHMS = ("single", "mpca", "sync", "diloco", "easgd", "ddp")


def run(preset: str, links, algorithms, agents, horizon: float, seeds: int, settings: Dict, path: str = "") -> Dict:
    """Every link's plan grid; with ``path``, the JSON so far is written after each link."""
    p = PRESETS[preset]
    n = exchanged_values(MLP(64, p["hidden"], 10))
    out = {"preset": preset, "hidden": list(p["hidden"]), "parameters": n, "step_s": p["step_s"],
           "target_error": p["target"], "links": {}}
    for link in links:
        cfg = PlanConfig(parameters=n, device_step_s=p["step_s"], link_bps=parse_rate(link, "scaling"),
                         agents=tuple(agents or p["agents"]), algorithms=tuple(algorithms), settings=settings,
                         proxy_hidden=p["hidden"], rows=p["rows"], holdout=p["holdout"],
                         target_error=p["target"], horizon=horizon, evals=100, seeds=seeds)

        def progress(row, link=link):
            t = "—" if row.time_s is None else f"{row.time_s:.1f}"
            print(f"{link} {row.algorithm} K={row.agents}: {t} s (wall {row.wall_s:.1f} s) {row.skipped or row.failed}",
                  file=sys.stderr, flush=True)

        res = plan(cfg, progress)
        out["links"][link] = res.to_dict()
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=1)
    return out


def cells(data: Dict, link: str) -> Dict:
    """(algorithm, K) → (time or None, speed-up or None) of one link."""
    d = data["links"][link]
    ref = d["reference_s"]
    return {(r["algorithm"], r["agents"]): (r["time_s"], ref / r["time_s"] if r["time_s"] else None)
            for r in d["rows"] if not r["skipped"] and not r["failed"]}


def markdown(data: Dict) -> str:
    links = list(data["links"])
    head = "| algorithm | K | " + " | ".join(f"{link}: s (speed-up)" for link in links) + " |"
    lines = [head, "|---|---|" + "---|" * len(links)]
    keys = list(dict.fromkeys(k for link in links for k in cells(data, link)))
    for algo, k in keys:
        row = []
        for link in links:
            t, s = cells(data, link).get((algo, k), (None, None))
            row.append("—" if t is None else f"{t:.1f} ({s:.2f}x)")
        lines.append(f"| {algo} | {k} | " + " | ".join(row) + " |")
    refs = ", ".join(f"{link} {data['links'][link]['reference_s']:.1f} s" for link in links)
    lines.append(f"\n(one agent alone to error {data['target_error']}: {refs}; —: not within "
                 f"{data['links'][links[0]]['config']['horizon']:g}× that)")
    return "\n".join(lines)


def plot(data: Dict, path: str) -> str:
    try:
        import matplotlib
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = list(data["links"])
    fig, axes = plt.subplots(2, len(links), figsize=(4.2 * len(links), 6.4), dpi=72, sharex=True, squeeze=False)
    for j, link in enumerate(links):
        c = cells(data, link)
        for algo in dict.fromkeys(a for a, _ in c):
            ks = sorted(k for a, k in c if a == algo)
            t = [c[(algo, k)][0] if c[(algo, k)][0] is not None else math.nan for k in ks]
            s = [c[(algo, k)][1] if c[(algo, k)][1] is not None else math.nan for k in ks]
            style = dict(marker="o", ms=3, label=algo)
            axes[0][j].plot(ks, t, **style)
            axes[1][j].plot(ks, s, **style)
        axes[0][j].set_title(f"{link}")
        axes[0][j].set_yscale("log")
        axes[1][j].axhline(1.0, color="grey", lw=0.8, ls="--")
        axes[1][j].set_xlabel("agents K")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"virtual s to error {data['target_error']}")
    axes[1][0].set_ylabel("speed-up over one agent")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"simulated: {data['parameters']:,}-parameter MLP, T = {data['step_s']} s (mpca/sim, "
                 "predicted, not measured)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.scaling")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="benchmark")
    ap.add_argument("--links", default=",".join(LINKS))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--agents", default="", help="agent counts (default: the preset's)")
    ap.add_argument("--horizon", type=float, default=2.0, help="each run's virtual time at most, × one agent's")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", default="docs/scaling", help="writes OUT.json and OUT.png")
    ap.add_argument("--plot-only", action="store_true", help="redraw OUT.png and the table from OUT.json")
    ap.add_argument("--merge", default="", help="with --plot-only: also take the links of these JSON files "
                    "(comma-separated; runs of the same preset split over links), and write the whole to OUT.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.plot_only:
        with open(args.out + ".json", encoding="utf-8") as f:
            data = json.load(f)
        for path in filter(None, args.merge.split(",")):
            with open(path, encoding="utf-8") as f:
                more = json.load(f)
            data["links"].update(more["links"])
            data["wall_s"] = data.get("wall_s", 0) + more.get("wall_s", 0)
        if args.merge:
            with open(args.out + ".json", "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
    else:
        wall = time.perf_counter()
        data = run(args.preset, [x for x in args.links.split(",") if x],
                   [a for a in args.algorithms.split(",") if a],
                   [int(k) for k in args.agents.split(",") if k.strip()], args.horizon, args.seeds, {},
                   args.out + ".json")
        data["wall_s"] = time.perf_counter() - wall
        with open(args.out + ".json", "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        print(f"wrote {args.out}.json ({data['wall_s']:.0f} s of wall time)")
    print(plot(data, args.out + ".png"))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
