"""The seeds' many-worker claims in simulation (issue 26, part 3): the library's own Rudra and Hermans rules,
real gradients on the teacher task, virtual time (:mod:`mpca.sim`).

    python -m lab.seeds_sim rudra     # Rudra Fig. 3: λ = 30 learners, n-softsync, ⟨σ⟩ ≈ n
    python -m lab.seeds_sim hermans   # Hermans: accumulated DOWNPOUR diverges with 40 workers, AGN and ADAG hold

Rudra (Gupta, Zhang and Wang 2016, §V-A, Fig. 3): "⟨σ⟩ = n for our implementation of the n-softsync
protocol" with λ = 30 learners (σ ≤ 2n with high probability).  Each run: λ learners, each step one
gradient pushed with its weights' timestamp and the server's weights pulled (``rudra-softsync``, n), the
staleness ⟨σ⟩ per update from the server's own history (:class:`mpca.algorithm.rudra.RudraServer`).

Hermans (thesis, §3.2 / the final text's Fig. 3.2 and 4.4): DOWNPOUR with accumulated updates (λ > 1) adds
every worker's Δ unscaled, so with many workers the centre moves ~n times a worker's step and diverges;
AGN (Δ/λ) and ADAG (per-weight scaled) stay bounded.  Each run: 40 workers, λ = 10, the workers' optimizer
SGD at ``--lr``; a run whose centre turns NaN stops there (the service refuses a NaN commit): "diverged".
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Dict, List

import torch

from mpca.sim import NetworkConstants, SimConfig, Simulator
from mpca.sim.command import parse_rate
from mpca.exchange.device import ComputeModel
from mpca.sim.grid import mean_metric, split_rows
from mpca.sim.workload import TeacherWorkload


def run_one(cfg: SimConfig) -> Dict:
    """One simulation; a ValueError during the run (a NaN commit refused) ends it as diverged."""
    sim = Simulator(cfg)
    wall = time.perf_counter()
    failed = ""
    try:
        res = sim.run()
    except ValueError as e:
        res, failed = sim.result, str(e).splitlines()[0]
        res.virtual_s = sim.clock.now
    h = res.history
    return {"history": h, "failed": failed, "virtual_s": res.virtual_s, "wall_s": time.perf_counter() - wall,
            "rule": sim.rule, "steps": sum(a.steps for a in sim.agents)}


def base_config(args, algorithm: Dict, agents: int) -> SimConfig:
    work = split_rows(TeacherWorkload(hidden=tuple(int(h) for h in args.hidden.split(",")), holdout=1000,
                                      optimizer=args.optimizer, lr=args.lr), agents, args.rows)
    return SimConfig(algorithm=algorithm, agents=agents, network=NetworkConstants(link_bps=parse_rate(args.link)),
                     compute=ComputeModel(step_s=args.device_step_s, jitter=args.jitter, seed=args.seed), workload=work,
                     batch_size=args.batch_size, max_virtual_s=args.seconds, eval_every_s=args.seconds / 20,
                     seed=args.seed)


def rudra(args) -> List[Dict]:
    rows = []
    for n in [int(x) for x in args.n.split(",")]:
        out = run_one(base_config(args, {"name": "rudra-softsync", "n": n, "lr": args.server_lr}, args.learners))
        history = list(out["rule"].history)  # (ts, ⟨σ⟩ of the update, lr)
        sigmas = [s for _, s, _ in history]
        row = {"n": n, "gradients_per_update": max(1, args.learners // n), "updates": len(history),
               "mean_staleness": mean_metric(out["history"], "mean_staleness", "updates"),
               "max_update_staleness": max(sigmas) if sigmas else None,
               "final_error": out["history"][-1].holdout_error, "steps": out["steps"], "wall_s": out["wall_s"]}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"| n | gradients per update (λ/n) | updates | ⟨σ⟩ measured | max ⟨σ⟩ of an update | holdout error at "
          f"{args.seconds:g} s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['gradients_per_update']} | {r['updates']} | {r['mean_staleness']:.2f} | "
              f"{r['max_update_staleness']:.2f} | {r['final_error']:.3f} |")
    return rows


def hermans(args) -> List[Dict]:
    rows = []
    for name in args.variants.split(","):
        out = run_one(base_config(args, {"name": name, "every": args.every}, args.workers))
        h = out["history"]
        finite = [r for r in h if math.isfinite(r.holdout_loss)]
        norm = float(torch.cat([v.reshape(-1) for v in out["rule"].joint_vectors()]).norm())
        row = {"variant": name, "workers": args.workers, "every": args.every, "failed": out["failed"],
               "stopped_at_s": out["virtual_s"], "start_loss": h[0].holdout_loss,
               "min_loss": min(r.holdout_loss for r in finite) if finite else None,
               "last_loss": h[-1].holdout_loss, "last_error": h[-1].holdout_error, "centre_norm": norm,
               "mean_staleness": mean_metric(h, "mean_staleness", "commits"), "steps": out["steps"],
               "wall_s": out["wall_s"]}
        row["outcome"] = (f"diverged: NaN at {row['stopped_at_s']:.1f} s" if row["failed"] else
                          "diverged (ends worse than untrained)" if not math.isfinite(row["last_loss"]) or
                          row["last_loss"] > row["start_loss"] else "holds (trains)")
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"| variant | workers, λ | holdout loss: start → best → last | last error | ‖centre‖ | mean staleness τ | "
          "outcome |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        best = "—" if r["min_loss"] is None else f"{r['min_loss']:.3g}"
        tau = "—" if r["mean_staleness"] is None else f"{r['mean_staleness']:.1f}"
        print(f"| {r['variant']} | {r['workers']}, {r['every']} | {r['start_loss']:.3g} → {best} → {r['last_loss']:.3g} | "
              f"{r['last_error']:.3f} | {r['centre_norm']:.3g} | {tau} | {r['outcome']} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.seeds_sim")
    ap.add_argument("which", choices=["rudra", "hermans"])
    ap.add_argument("--hidden", default="256,256")
    ap.add_argument("--rows", type=int, default=120_000, help="the data set's rows, split among the agents")
    ap.add_argument("--device-step-s", type=float, default=0.1)
    ap.add_argument("--jitter", type=float, default=0.1, help="log-normal σ of the step time (desynchronises)")
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--seconds", type=float, default=60.0, help="virtual seconds per run")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.05, help="the agents' own optimizer (Hermans' workers)")
    ap.add_argument("--learners", type=int, default=30, help="Rudra's λ")
    ap.add_argument("--n", default="1,2,3,5,10,15,30", help="Rudra's n-softsync values")
    ap.add_argument("--server-lr", type=float, default=0.05, help="Rudra's α0")
    ap.add_argument("--workers", type=int, default=40, help="Hermans' workers")
    ap.add_argument("--every", type=int, default=10, help="Hermans' λ: local steps per commit")
    ap.add_argument("--variants", default="downpour,agn,adag")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = rudra(args) if args.which == "rudra" else hermans(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
