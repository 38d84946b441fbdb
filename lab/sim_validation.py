"""The simulator against the runtime (issue 26, part 2): the validation rows of README's "How far to trust it",
simulated on the benchmark's own task.

Each row is one algorithm and K as `bench compare` measured it (``--regime resnet110-gbe``: 100 Mbit, T = 300 ms,
the 1.13 M-parameter MLP, Adam 1e-3, batch 64; sync H = 15, EASGD τ = 30, DiLoCo H = 50), with the exchange's CPU as
calibrated on this machine (0.06 s/MB on 2 shared cores); ``--regime vgga-gbe`` runs instead the rows measured in
the ≈ 100 regime (30 Mbit, T = 100 ms) on a 16-core host (``--host-cores 16`` to match it). The teacher task is held
at the benchmark's (``--task-seed 0``, ``conf/teacher_mlp.yaml``) and so is the holdout: the 5,000 rows the trainer
scores on, those of the smallest row hash among the 9,915 its hash split puts aside from that task's 1 M rows
(``--split-rows``; until 2026-11-26 it was 10,000 rows after the agents', whose error on the plateau near 24% ran
about one point above the runtime's holdout for the same model, and then all 9,915 rows, of which the runtime scored
on whichever 5,000 a collection returned first), and so are the agents' rows: agent a trains on the runtime's
partition a, the task's rows [a·N/K, (a+1)·N/K) less the holdout's (``--rows``; until 2026-11-26 50,000 other rows
per agent). The run's seed is the benchmark's, 0 (``--seeds 1``): its repeats share the initial model and batch
order and differ in timing alone, which the simulator's fixed step time does not; ``--seeds 3`` adds seeds 1 and 2
(another initial model and batch order: how far those move a time). Until 2026-11-26 the README's table took the
median of seeds 0–2, and before that a new teacher per seed, which mixed the task's difficulty into the spread.
The agents' starts (``--measured``): the runtime's agents each step from the moment each is built, a few hundredths
of a second apart, and which one starts first decides the order of their exchanges for the run — for EASGD at
K = 2, 20 / 41 / 61 s to 30 / 26 / 24% with agent 1 first against 30 / 30 / 61 s with agent 0 first (this
row was 30% off until 2026-11-26: simulated with both agents starting at one instant, which orders them as agent
0 first, against runs whose starts were not recorded and which read the agent-1-first curve in two repeats of
three).  Given the ``compare.json`` of the measured runs,
a row that ``bench compare`` measured is simulated once per measured repeat with that repeat's agents' starts
(``agent_starts_s``, kept since 2026-11-26), its times counted from the last agent's start, and printed beside the
measured median after start-up.  ``--row`` replaces the regime's table by settings of your own (bench compare's
``--variant`` syntax) at ``--agents`` K, and ``--link`` / ``--device-step-s`` replace the regime's link and T: a period's
grid before a comparison, or a regime run on a slower clock (issue 23's K = 8 on a 2-core machine: 30 Mbit,
T = 1.2 s).  Prints medians and per-run times to each target and the mean cycle, and writes JSON:

    python -m lab.sim_validation --json /tmp/sim-validation.json
    python -m lab.sim_validation --measured runs/k2/compare.json --only "easgd t30@2"
    python -m lab.sim_validation --agents 8 --row "sync:H15=sync,every=15" --row "sync:H30=sync,every=30" --row mpca=mpca
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from lab.regimes_sim import TARGETS
from mpca.algorithm.registry import build as build_algorithm
from mpca.bench.regimes import regime
from mpca.sim.command import parse_rate
from mpca.exchange.device import ComputeModel
from mpca.sim.constants import NetworkConstants
from mpca.sim.simulator import SimConfig, Simulator
from mpca.sim.workload import TeacherWorkload

# (label, algorithm, K, wire): the rows bench compare measured (README, "How far to trust it"), by the regime
# they ran in (its link and step time T): resnet110-gbe on this 2-core machine, vgga-gbe on a 16-core host
# (lab/gpu_host.sh, 2026-11-26: sync and DiLoCo at the simulator's best H = 62, DiLoCo's outer learning rate 0.5)
ROWS = (
    ("mpca@fp32", {"name": "mpca"}, 4, "fp32"),
    ("mpca@int8", {"name": "mpca"}, 4, "int8"),
    ("diloco@fp32 H50", {"name": "diloco", "every": 50}, 4, "fp32"),
    ("diloco@int8 H50", {"name": "diloco", "every": 50}, 4, "int8"),
    ("sync H15", {"name": "sync", "every": 15}, 4, "fp32"),
    ("easgd t30", {"name": "easgd", "every": 30}, 4, "fp32"),
    ("mpca", {"name": "mpca"}, 2, "fp32"),
    ("diloco H50", {"name": "diloco", "every": 50}, 2, "fp32"),
    ("sync H15", {"name": "sync", "every": 15}, 2, "fp32"),
    ("easgd t30", {"name": "easgd", "every": 30}, 2, "fp32"),
)
VGGA_ROWS = (
    ("mpca@fp32", {"name": "mpca"}, 4, "fp32"),
    ("mpca@int8", {"name": "mpca"}, 4, "int8"),
    ("sync H62@fp32", {"name": "sync", "every": 62}, 4, "fp32"),
    ("sync H62@int8", {"name": "sync", "every": 62}, 4, "int8"),
    ("diloco H62@fp32", {"name": "diloco", "every": 62, "outer_lr": 0.5}, 4, "fp32"),
    ("diloco H62@int8", {"name": "diloco", "every": 62, "outer_lr": 0.5}, 4, "int8"),
)
ROWS_BY_REGIME = {"resnet110-gbe": ROWS, "vgga-gbe": VGGA_ROWS}
DEFAULT_REGIME = "resnet110-gbe"


def rows_per_agent(args, agents: int) -> int:
    """``--rows``, or by default the runtime's own: with ``--split-rows`` N, the trainer hands agent a the rows
    [a·N/K, (a+1)·N/K) of the task less the holdout's, in that order (``coalesce(K)`` of the task's max(4, K)
    contiguous ``spark.range`` partitions; until 2026-11-27 K = 8 repartitioned 4 partitions, other rows), which is
    what the simulated agent trains on; then sync, whose runs are deterministic, reads the runtime's very errors
    round for round."""
    if args.rows:
        return args.rows
    if not args.split_rows:
        raise SystemExit("sim_validation: --rows is needed with --split-rows 0")
    return args.split_rows // agents


def measured_runs(paths: List[str]) -> List[dict]:
    """Every algorithm of the given ``compare.json`` files: its algorithm settings, K, wire format, and per
    repeat its agents' starts and its times after start-up (to each target less the run's agents-up time)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        for label, entry in summary["algorithms"].items():
            wire = label.partition("@")[2] or "fp32"
            runs = [{"agent_starts_s": r.get("agent_starts_s") or [],
                     "after_start_up": {t: (None if v is None or r.get("agents_up_s") is None
                                            else v - r["agents_up_s"]) for t, v in r["time_to"].items()}}
                    for r in entry["runs"]]
            out.append({"label": label, "algorithm": entry["algorithm"], "agents": entry["agents"], "wire": wire,
                        "runs": runs, "source": path})
    return out


def measured_for(measured: List[dict], algorithm: dict, agents: int, wire: str) -> Optional[dict]:
    """The measured algorithm of the row (same settings, K and wire), the last one given; None if none."""
    settings = build_algorithm(algorithm).model_dump()  # defaults filled in: {"name": "diloco"} is H = 50
    found = [m for m in measured if m["agents"] == agents and m["wire"] == wire
             and build_algorithm(m["algorithm"]).model_dump() == settings]
    return found[-1] if found else None


def relative_starts(starts: List[float]) -> Tuple[float, Tuple[float, ...]]:
    """(start-up, starts) for the simulator from a run's measured starts: the first agent at 0, the start-up
    at the last one's start; (0, ()) without starts."""
    if len(starts) < 2:
        return 0.0, ()
    first = min(starts)
    rel = tuple(round(s - first, 6) for s in starts)
    return max(rel), rel


def config(algorithm: dict, agents: int, wire: str, seed: int, args,
           starts: Tuple[float, Tuple[float, ...]] = (0.0, ())) -> SimConfig:
    measured_in = regime(getattr(args, "regime", DEFAULT_REGIME))
    link = getattr(args, "link", None) or measured_in.link
    step_s = getattr(args, "device_step_s", None) or measured_in.device_step_s
    net = NetworkConstants(link_bps=parse_rate(link), exchange_cpu_s_per_mb=args.exchange_cpu,
                           host_cores=args.host_cores)
    return SimConfig(algorithm=algorithm, agents=agents, wire=wire, network=net,
                     compute=ComputeModel(step_s=step_s, seed=seed),
                     workload=TeacherWorkload(rows_per_agent=rows_per_agent(args, agents), holdout=args.holdout,
                                              seed=args.task_seed,
                                              holdout_at=args.holdout_at, split_rows=args.split_rows or None),
                     max_virtual_s=args.max_seconds + starts[0], eval_every_s=1.0, targets=TARGETS, seed=seed,
                     startup_s=starts[0], agent_starts_s=starts[1])


def median_time(times: List[Optional[float]]) -> Optional[float]:
    """The median over seeds, an unreached seed counting as slowest (None when most did not reach it)."""
    ordered = sorted(times, key=lambda v: float("inf") if v is None else v)
    return ordered[len(ordered) // 2]


def run_row(label: str, algorithm: dict, agents: int, wire: str, args, measured: Optional[dict] = None
            ) -> Dict[str, object]:
    """The row simulated per seed, and with ``measured`` once per measured repeat (its agents' starts) and seed;
    times after the last agent's start."""
    starts = [relative_starts(r["agent_starts_s"]) for r in measured["runs"]] if measured else [(0.0, ())]
    per_seed = []
    for seed in range(args.seeds):
        for start in starts:
            cfg = config(algorithm, agents, wire, seed, args, start)
            res = Simulator(cfg).run()
            done = [c for c in res.cycles if c.end > c.start]
            per_seed.append({"seed": seed, "agent_starts_s": list(cfg.agent_starts_s),
                             "times": {k: (None if t is None else t - cfg.startup_s)
                                       for k, t in res.time_to_target.items()}, "wall_s": res.wall_s,
                             "mean_cycle_s": statistics.mean(c.end - c.start for c in done) if done else None,
                             "steps_per_agent_at_tightest": next(
                                 (r.steps / agents for r in res.history if r.holdout_error <= min(TARGETS)), None)})
    times = {f"{t:g}": [s["times"][f"{t:g}"] for s in per_seed] for t in TARGETS}
    cycles = [s["mean_cycle_s"] for s in per_seed if s["mean_cycle_s"] is not None]
    row = {"label": label, "algorithm": algorithm, "agents": agents, "wire": wire, "per_seed": per_seed,
           "median": {t: median_time(v) for t, v in times.items()},
           "mean_cycle_s": statistics.median(cycles) if cycles else None}
    if measured:
        row["measured"] = {"source": measured["source"], "label": measured["label"],
                           "median_after_start_up": {f"{t:g}": median_time([r["after_start_up"].get(f"{t:g}")
                                                                            for r in measured["runs"]])
                                                     for t in TARGETS}}
    return row


def fmt(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1f}"


def fmt_ratio(measured: Optional[float], simulated: Optional[float]) -> str:
    return "—" if not measured or simulated is None else f"{simulated / measured:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.sim_validation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1,
                    help="run seeds 0..N-1 (0: the benchmark's; the task stays --task-seed's)")
    ap.add_argument("--task-seed", type=int, default=0, help="the teacher task (0: the benchmark's)")
    ap.add_argument("--rows", type=int, default=0,
                    help="teacher rows per agent (0: the runtime's partition, --split-rows / K; until 2026-11-26 "
                         "50,000 rows of other layout, so the simulated agents trained on other rows)")
    ap.add_argument("--split-rows", type=int, default=1_000_000,
                    help="evaluate on the runtime's holdout: the rows of the task's first N (the benchmark's 1 M) "
                         "that the trainer's hash split (data.holdout 1%%, seed 0) holds out; 0: --holdout rows "
                         "from --holdout-at instead")
    ap.add_argument("--holdout", type=int, default=10_000, help="with --split-rows 0: holdout rows")
    ap.add_argument("--holdout-at", type=int, default=None,
                    help="with --split-rows 0: the holdout's first row (default: after the agents' rows, so it "
                         "moves with K; 200000 gives every row of the table the holdout of K = 4)")
    ap.add_argument("--regime", choices=sorted(ROWS_BY_REGIME), default=DEFAULT_REGIME,
                    help="the measured rows of this regime (vgga-gbe: measured on a 16-core host)")
    ap.add_argument("--max-seconds", type=float, default=90.0, help="virtual seconds after the start-up")
    ap.add_argument("--row", action="append", default=[], metavar="LABEL=NAME,key=value",
                    help="simulate these settings (bench compare's --variant syntax, repeatable) instead of the "
                         "regime's measured rows")
    ap.add_argument("--agents", type=int, default=4, help="K of the --row rows")
    ap.add_argument("--wire", default="fp32", help="wire format of the --row rows")
    ap.add_argument("--link", default=None, help="every host's port instead of the regime's (e.g. 30mbit)")
    ap.add_argument("--device-step-s", type=float, default=None, help="the device step T instead of the regime's")
    ap.add_argument("--measured", action="append", default=[], metavar="COMPARE_JSON",
                    help="bench compare's compare.json (repeatable): a row it measured is simulated once per measured "
                         "repeat with that repeat's agents' starts, and printed beside the measured median")
    ap.add_argument("--exchange-cpu", type=float, default=0.06)
    ap.add_argument("--host-cores", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated labels@K to run (e.g. 'sync H15@2'), default all")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: leaves a core to other work)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def rows(args) -> List[Tuple[str, dict, int, str]]:
    """(label, algorithm, K, wire) of every row to simulate: ``--row``'s, else the regime's measured rows."""
    if args.row:
        from mpca.bench.compare import parse_variant

        try:
            return [(*parse_variant(r), args.agents, args.wire) for r in args.row]
        except ValueError as e:
            raise SystemExit(f"sim_validation: {e}") from None
    return list(ROWS_BY_REGIME[args.regime])


def _run(args) -> int:
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    measured = measured_runs(args.measured)
    out = []
    if measured:
        print("A row bench compare measured: measured median after start-up / simulated median (runs) "
              "(simulated ÷ measured)")
    print("| run | K | mean cycle s | " + " | ".join(f"t({t:g}) s median (runs)" for t in TARGETS) + " | wall s |")
    print("|---|---|---|" + "---|" * len(TARGETS) + "---|")
    for label, algorithm, agents, wire in rows(args):
        if wanted and f"{label}@{agents}" not in wanted:
            continue
        t0 = time.time()
        row = run_row(label, algorithm, agents, wire, args, measured_for(measured, algorithm, agents, wire))
        out.append(row)
        cells = [f"{fmt(row['median'][f'{t:g}'])} ({', '.join(fmt(s['times'][f'{t:g}']) for s in row['per_seed'])})"
                 for t in TARGETS]
        if "measured" in row:  # measured / simulated (simulated ÷ measured)
            cells = [f"{fmt(m)} / {c} ({fmt_ratio(m, row['median'][f'{t:g}'])})"
                     for t, c, m in zip(TARGETS, cells, row["measured"]["median_after_start_up"].values())]
        cyc = row["mean_cycle_s"]
        print(f"| {label} | {agents} | {'—' if cyc is None else f'{cyc:.2f}'} | " + " | ".join(cells) +
              f" | {time.time() - t0:.0f} |", flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"settings": vars(args), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
