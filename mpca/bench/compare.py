"""Time to accuracy, algorithm against algorithm, on the same cluster, data, model, seed and targets.

    mpca bench compare [-c conf/teacher_mlp.yaml]
                       [--algorithms mpca,sync,easgd,diloco,streaming_diloco,delayed_diloco,ddp,single]
                       [--ablations] [--targets 0.3,0.26,0.24] [--max-seconds 120] [--repeats 1]
                       [--network none|1gbit|100mbit|RATE] [--device-speed AGENT:SPEED] [--out runs/compare]
                       [--variant LABEL=NAME,key=value,...] [--device-step-s SECONDS]
                       [--regime resnet110-gbe|vgga-gbe] [--tune|--no-tune] [--agents 1,2,4,8] [key=value ...]

Runs the chosen algorithms one after another (and, with ``--ablations``, the paper's MPCA ablations:
γ = 0 without extrapolation, Fig. 10a; unweighted instead of τ-weighted reduction, Fig. 10c; S = 1 and 2
phases, §4.2; Eq. 7 toward x* itself, the paper's pull, against the default delay-compensated target;
with ``--device-speed 1:0.5`` agent 1 runs at half speed and ``mpca:uncontested`` is mpca
without it, Fig. 10c; ``--variant 'push:28=weaksync,c=3'`` adds an algorithm with its own settings under a
label of your choice, e.g. the seeds' protocol studies) and writes to ``--out``: ``compare.csv`` (a table like the paper's Table 2: time to each
target per algorithm, ratios to ``single`` and to ``mpca``), ``compare.json`` (per algorithm: time to each
target, final error, bytes moved, duty cycle, the agents' samples/s, the cores each role of the run used
(:mod:`mpca.bench.cpu_profile`: what limits a run on a shared machine), the algorithm's own figures such as Rudra's mean staleness
or weak synchronization's dropped gradients; for the run: network, communication/computation ratio of
one model exchange, cycle overlap), ``compare.png`` (error against wall time) and each run's history.
``--network`` runs everything on the emulated cluster of the repository's lab harness (``lab/netcluster.py`` of
a checkout, :mod:`mpca.bench.emulated_cluster`) when it is at hand and this machine allows it (root, network
namespaces, ``ip``/``tc``), else on local-cluster, labelled as such; its hosts have the cores and memory of the
executors of ``cluster.master``'s ``local-cluster[K,C,MB]``.  ``--device-step-s T`` gives
every agent an emulated device (:mod:`mpca.bench.emulation`): each training step takes T, for every
algorithm; a run where agents fell behind T or the machine was saturated is marked INVALID in the table.
``--regime`` names a communication/computation ratio of the paper's Table 1 (:mod:`mpca.bench.regimes`:
link and T) and tunes every algorithm on its grid for it (:mod:`mpca.bench.tuning`: each setting once,
then the repeats at the best, afresh; the grid in ``compare.json``).  With ``--repeats`` ≥ 2 the table
gives each time's min–max and flags repeats more than 2× apart; ``--agents 1,2,4,8`` runs the whole
comparison per K and tabulates it over K (:mod:`mpca.bench.sweep`).  The default job is
``conf/teacher_mlp.yaml``: 1 M rows generated on the executors, never read twice by a run.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Dict, List, Optional

from mpca.bench.regimes import REGIMES
from mpca.local_cluster import parse_local_cluster
from mpca.spellings import parse_device_speed, refuse_renamed

ABLATIONS = {
    "mpca:gamma0": {"name": "mpca", "gamma": {"start": 0.0, "target": 0.0}},  # no extrapolation (Fig. 10a)
    "mpca:uniform": {"name": "mpca", "weighting": "uniform"},  # unweighted reduction (Fig. 10c)
    "mpca:S1": {"name": "mpca", "shards": 1},  # one phase (Fig. 6)
    "mpca:S2": {"name": "mpca", "shards": 2},  # two phases (Fig. 7)
    "mpca:elastic": {"name": "mpca", "pull": "elastic"},  # Eq. 7 toward x* itself (the paper; default: compensated)
    "mpca:uncontested": {"name": "mpca"},  # with --device-speed: the same run without the straggler
}
FIGURES = {"mean_staleness": "median", "mean_d": "median", "dropped": "sum", "updates": "sum",
           "block_updates": "sum", "commits": "sum"}  # DriverRule.metrics() columns of the history, and how to sum up
DEFAULT_CONFIG = "conf/teacher_mlp.yaml"  # 1.13 M parameters, 1 M generated rows: optimisation, not memorisation
# --task: the workloads' job configs and the targets that suit them (holdout errors; the LM's in nats per byte)
TASKS = {"teacher": ("conf/teacher_mlp.yaml", "0.3,0.26,0.24"),
         "lm": ("conf/lm.yaml", "2.6,2.4,2.3"),
         "resnet20": ("conf/resnet20.yaml", "0.1,0.06,0.04")}


def emulated_hosts(cfg) -> Dict[str, int]:
    """The emulated cluster's hosts as the run's ``local-cluster[K,C,MB]`` has its executors (C cores, MB
    megabytes each; with C ≥ 3 an agent's reduce and deliver tasks have a slot each); lab/netcluster.py's
    defaults (2 cores, 1024 MB) for any other master."""
    shape = parse_local_cluster(cfg.cluster.master)
    return {} if shape is None else {"cores": shape.cores, "memory_mb": shape.memory_mb}


def time_to(history, target: float, metric: str = "error") -> float:
    """Wall seconds until the holdout error (or loss: ``metric``, ``eval.metric``) first reached ``target`` (nan
    if it never did)."""
    column = f"holdout_{metric}"
    h = history.dropna(subset=[column])
    hit = h[h[column] <= target]
    return float(hit["wall_s"].iloc[0]) if len(hit) else math.nan


def target_name(target: float, metric: str = "error") -> str:
    """How a table names a target: ``30%`` of error, ``2.5`` nats of loss."""
    return f"{100 * target:g}%" if metric == "error" else f"{target:g}"


def _top_level_items(spec: str) -> List[str]:
    """``spec`` cut at the commas outside braces and brackets: ``"mpca,gamma={target: 1, ramp_cycles: 0}"`` →
    ``["mpca", "gamma={target: 1, ramp_cycles: 0}"]``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return [p.strip() for p in items if p.strip()]


def parse_variant(text: str) -> tuple:
    """``"push+pull=weaksync,c=3,pull_fraction=0.75"`` → ("push+pull", {"name": "weaksync", "c": 3, ...});
    values are read as YAML (numbers, true/false, null, and mappings such as ``alpha={hold_cycles: 0, target:
    0.1}``, whose commas do not end the key=value).  A dotted key is a run setting of that variant alone
    (``lock=mpca,training.lock_step=5,cluster.reduce=ordered``), kept dotted in the mapping (:func:`run_settings`)."""
    import yaml

    from mpca.algorithm import build_algorithm
    from mpca.config import Settings

    label, _, spec = text.partition("=")
    parts = _top_level_items(spec)
    if not label.strip() or not parts or "=" in parts[0]:
        raise ValueError(f"--variant takes LABEL=NAME,key=value,..., e.g. push=weaksync,c=3; got {text!r}")
    algo = {"name": parts[0]}
    for p in parts[1:]:
        key, eq, value = p.partition("=")
        if not eq:
            raise ValueError(f"--variant {label}: {p!r} is not key=value")
        try:
            algo[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:  # e.g. a mapping left open: alpha={hold_cycles: 0
            raise ValueError(f"--variant {label}: {key.strip()}={value.strip()} is not a YAML value "
                             f"({getattr(e, 'problem', None) or e}); give a nested setting as a YAML mapping, "
                             f"e.g. alpha={{hold_cycles: 0, target: 0.1}}") from None
    for dotted in [k for k in algo if "." in k]:
        section, _, key = dotted.partition(".")
        field = Settings.model_fields.get(section)
        fields = getattr(field.annotation, "model_fields", {}) if field is not None else {}
        if key not in fields:
            raise ValueError(f"--variant {label}: {dotted} is not a run setting (SECTION.KEY of the job config, "
                             f"e.g. training.lock_step)")
    try:
        build_algorithm({k: v for k, v in algo.items() if "." not in k})
    except Exception as e:  # pydantic's ValidationError or an unknown name: one line
        raise ValueError(f"--variant {label}: {str(e).splitlines()[0]}; " + "; ".join(
            f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in getattr(e, "errors", lambda: [])())) from None
    return label.strip(), algo


def run_settings(settings, algorithm: dict):
    """``settings`` with a variant's own run settings (its dotted keys, :func:`parse_variant`) applied, validated."""
    from mpca.errors import UserError

    dotted = {k: v for k, v in algorithm.items() if "." in k}
    if not dotted:
        return settings
    data = settings.model_dump()
    data["algorithm"] = settings.algorithm.model_dump()
    for key, value in dotted.items():
        section, _, name = key.partition(".")
        data[section][name] = value
    try:
        return type(settings).model_validate(data)  # a job's config keeps its own sections (run, model, ...)
    except ValueError as e:  # pydantic's ValidationError: its first error's message, one line
        why = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e).splitlines()[0]
        raise UserError(f"--variant {algorithm['name']} with {dotted}: {why}") from None


def figures(history) -> Dict[str, float]:
    """The algorithm's own figures over a run (see :data:`FIGURES`), from its history's columns."""
    out = {}
    for col, how in FIGURES.items():
        if col in history:
            vals = history[col].dropna()
            if len(vals):
                out[col] = float(vals.median() if how == "median" else vals.sum())
    return out


SPREAD_LIMIT = 2.0  # repeats of one setting whose times to a target differ more than this are flagged


def spread(times: List[Dict[float, float]], targets: List[float]) -> tuple:
    """Over the repeats' times to each target: {target: (min, max)} of the repeats that reached it, and the
    targets whose repeats disagree — the slowest more than :data:`SPREAD_LIMIT` × the fastest, or reached by
    some repeats and not by others — each as a short reason."""
    ranges, flags = {}, []
    for t in targets:
        hit = [r[t] for r in times if not math.isnan(r[t])]
        ranges[t] = (min(hit), max(hit)) if hit else (math.nan, math.nan)
        if hit and len(hit) < len(times):
            flags.append(f"{100 * t:g}%: reached in {len(hit)} of {len(times)} repeats")
        elif hit and min(hit) > 0 and max(hit) / min(hit) > SPREAD_LIMIT:
            flags.append(f"{100 * t:g}%: {max(hit) / min(hit):.1f}x between repeats")
    return ranges, flags


def _nan(v: Optional[float]) -> float:
    return math.nan if v is None else float(v)


def _median(values: List[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if len(vals) == len(values) and vals else math.nan


STARTUP_PHASES = ("task_started_s", "data_s", "build_s", "rows_there_s")  # per agent: FitResult.startup's, and
# when its rows were all there (its summary's load_s, on the run's clock: it trained on the first ones meanwhile)


def ratio_run(results: Dict[str, dict]) -> dict:
    """The run whose cycles measure the comm/comp ratio of one model exchange: mpca's at fp32 where there is one
    (``mpca@fp32``: the regimes' ratios are those of full-precision exchanges), else ``mpca`` (its default
    format: int8), else the first mpca run; {} without one."""
    for label in ("mpca@fp32", "mpca"):
        if label in results:
            return results[label]
    return next((r for r in results.values() if (r.get("algorithm") or {}).get("name") == "mpca"), {})


def startup_medians(fit) -> Dict[str, float]:
    """The median over the agents of each start-up phase: when its Spark task started (on the run's clock), the
    wait for its first rows, its build, and when all of its rows were there (on the run's clock; seconds); NaN
    for a phase no agent reported."""
    load = {s.get("agent"): s.get("load_s") for s in fit.agents}
    phases = {a: {**p, "rows_there_s": p.get("task_started_s", math.nan) + _nan(load.get(a))}
              for a, p in (fit.startup or {}).items()}
    return {k: _median([_nan(p.get(k)) for p in phases.values()]) if phases else math.nan for k in STARTUP_PHASES}


def agent_starts(fit) -> List[float]:
    """Each agent's start on the run's clock, in agent order: when its Spark task started plus its data read and
    build — the moment it began to step (an agent trains from then on, before the others are up); [] where the
    agents did not report their start-up.  Their spread is what puts the agents' steps out of phase, which
    ``mpca simulate --agent-starts`` models."""
    phases = [fit.startup[a] for a in sorted(fit.startup)] if fit.startup else []
    starts = [_nan(p.get("task_started_s")) + _nan(p.get("data_s")) + _nan(p.get("build_s")) for p in phases]
    return [] if any(math.isnan(s) for s in starts) else [round(s, 3) for s in starts]


def after_start_up(runs: List[dict], target: float) -> float:
    """The median over ``runs`` of the time to ``target`` counted from the moment every agent was up
    (``time_to[target] − agents_up_s`` per run; NaN unless every run reached it).  Start-up (agents' processes
    and their data) is the same work for every algorithm and swings by seconds with the cluster's state on a
    shared machine; this column shows what the algorithm did once it was training."""
    return _median([r["time_to"][target] - _nan(r["agents_up_s"]) for r in runs])


def _traffic(fit) -> int:
    """Payload bytes the algorithm moved: through Spark (reductions, broadcasts), the parameter service,
    and agent to agent (what the agents report as ``wire_bytes``)."""
    totals = fit.timeline.totals  # over the whole run (the timeline keeps only its last cycles in memory)
    spark = totals.bytes_up + totals.bytes_down
    p2p = sum(int((r.extra or {}).get("wire_bytes", 0)) for r in fit.timeline.cycles[-1].agents.values()) \
        if fit.timeline.cycles else 0  # cumulative counts: the last cycle's
    return spark + fit.counters.service_bytes + p2p


def _duty(fit) -> float:
    """Share of the agents' time spent computing rather than waiting in exchange hooks."""
    alive = sum(float(a.get("alive_s") or 0) for a in fit.agents)
    waiting = sum(float(a.get("exchange_s") or 0) for a in fit.agents)
    return 1.0 - waiting / alive if alive > 0 else math.nan


def _comm_comp(fit) -> Optional[float]:
    """Communication/computation ratio of one model exchange (paper Table 1): the time the pipeline needs
    to move the whole model once (median cycle × S) over the time of one local step."""
    # the cycles in memory (the last training.timeline_window) after warm-up; short runs: all
    steady = fit.timeline.cycles[3:] if len(fit.timeline.cycles) > 4 else fit.timeline.cycles
    cycles = [c.t_end - c.t_submit for c in steady if c.reduce_shard is not None]
    rates = [r.steps_per_s for c in steady for r in c.agents.values() if r.steps_per_s]
    if not cycles or not rates:
        return None
    shards = len(fit.timeline.totals.shards)
    return statistics.median(cycles) * shards * statistics.median(rates)


def _dirname(label: str) -> str:
    """A run's folder under --out: its label with anything but letters, digits, '.', '=' and '-' as '-'."""
    import re

    return re.sub(r"[^\w.=-]+", "-", label).strip("-")


def split_wire(label: str) -> tuple:
    """``"mpca@int8"`` → ("mpca", "int8"): an algorithm's label and the wire format it runs with (None: the
    configuration's ``wire.format``)."""
    base, _, fmt = label.partition("@")
    return base, fmt or None


def run_one(spark, cfg, data, label: str, algorithm: dict, targets: List[float], max_seconds: float, out: str,
            straggler=None, wire: Optional[str] = None) -> dict:
    from mpca.bench.cpu_profile import CpuProfile
    from mpca.bench.emulation import device_check
    from mpca.bench.straggler import straggle
    from mpca.config import settings_from
    from mpca.models import training_functions
    from mpca.trainer import Trainer

    metric = cfg.eval.metric
    variant, algorithm = algorithm, {k: v for k, v in algorithm.items() if "." not in k}
    overrides = {"algorithm": algorithm, "stop": {"max_seconds": max_seconds, f"target_{metric}": min(targets)},
                 "eval": {"every_cycles": None, "every_seconds": max(0.5, max_seconds / 60), "metric": metric},
                 "checkpoint": {"dir": os.path.join(out, _dirname(label), "checkpoints"),
                                "every_cycles": 10 ** 9, "init_from": cfg.checkpoint.init_from}}
    if algorithm["name"] == "single":
        overrides["agents"] = 1
    if wire is not None:
        overrides["wire"] = {**cfg.wire.model_dump(), "format": wire}
    settings = run_settings(settings_from(cfg, cluster={**cfg.cluster.model_dump(), "master": "existing"},
                                          **overrides), variant)
    model_fn, loss_fn, optimizer_fn = training_functions(cfg.model, cfg.optimizer)
    slow = straggler is not None and not label.startswith("mpca:uncontested")
    if slow:
        settings, optimizer_fn = straggle(settings, optimizer_fn, *straggler)
    print(f"--- {label}: {settings.training.agents} agent(s), up to {max_seconds:.0f}s"
          + (f", agent {straggler[0]} at {straggler[1]:g}x speed" if slow else ""), flush=True)
    profile = CpuProfile.for_spark(spark).start()
    fit = Trainer(model_fn, loss_fn, optimizer_fn, settings, spark=spark).fit(*data)
    cpu = profile.stop(int(a["pid"]) for a in fit.agents if a.get("pid"))
    os.makedirs(os.path.join(out, _dirname(label)), exist_ok=True)
    fit.history.to_csv(os.path.join(out, _dirname(label), "history.csv"), index=False)
    fit.timeline.write_csv(os.path.join(out, _dirname(label), "timeline.csv"))  # every cycle's phases and bytes
    moved = _traffic(fit)
    run = {"label": label, "algorithm": algorithm, "agents": settings.training.agents, "history": fit.history,
           "time_to": {t: time_to(fit.history, t, metric) for t in targets}, "final_error": fit.final.error,
           "final_loss": fit.final.loss,
           "wall_s": fit.wall_s, "cycles": fit.cycles, "bytes": moved, "duty_cycle": _duty(fit),
           "bytes_per_cycle": moved / fit.cycles if fit.cycles else math.nan,
           "comm_comp": _comm_comp(fit) if algorithm["name"] == "mpca" else None, "figures": figures(fit.history),
           "overlap": fit.timeline.overlap_fraction() if algorithm["name"] == "mpca" else None,
           "samples_per_s": _samples_per_s(fit), "cpu": cpu, "agents_up_s": fit.agents_up_s,
           "first_exchange_s": fit.first_exchange_s, "first_exchange_job_end_s": fit.first_exchange_job_end_s,
           "prepare_s": fit.prepare_s, "startup": startup_medians(fit),
           "agent_starts_s": agent_starts(fit),
           "emulation": device_check(fit.agents, cpu, settings.emulation.device_step_s)}
    write_run_record(run, os.path.join(out, _dirname(label), "run.json"))
    return run


def write_run_record(run: dict, path: str) -> str:
    """One finished run's figures beside its history.csv, written as soon as the run ends: a comparison cut
    short (a time limit, a lost machine) keeps each finished run's times, validity and CPU, not only its curve."""
    from mpca.report import write_json

    return write_json(path, {k: v for k, v in run.items() if k != "history"})


def _samples_per_s(fit) -> float:
    """All agents' training samples per second: each agent's samples over its time alive, summed."""
    rates = [float(a["samples"]) / float(a["alive_s"]) for a in fit.agents if a.get("samples") and a.get("alive_s")]
    return sum(rates) if rates else math.nan


WARM_UP_FITS = 2


def _warm_up(spark, cfg, data, out: str) -> None:
    """Short unrecorded runs first, so that no algorithm pays for starting the executors' Python workers
    (importing torch there takes seconds) and the JVMs' warm-up.  Two: after the session's first fit the pool
    still hands an agent a worker that only ran control tasks (PySpark takes the oldest idle one), which
    imports torch first — measured with ``python -m lab.warm_fits --workers``: the agents' tasks started at
    4.4, 1.8 and 0.3 s and were up at 16.4, 7.8 and 4.1 s in three fits, and with one warm-up the first
    measured run (always the first label's) started its agents at 1.4 s and built them in 2.4 s against 0.3
    and 0.05 s in the later runs."""
    from mpca.config import settings_from
    from mpca.models import training_functions
    from mpca.trainer import Trainer

    settings = settings_from(cfg, cluster={**cfg.cluster.model_dump(), "master": "existing"}, algorithm="mpca",
                             stop={"max_cycles": 3}, eval={"every_cycles": 100},
                             checkpoint={"dir": os.path.join(out, "warm-up"), "every_cycles": 10 ** 9}, progress="off")
    for _ in range(WARM_UP_FITS):
        Trainer(*training_functions(cfg.model, cfg.optimizer), settings, spark=spark).fit(*data)


def tune(spark, cfg, data, label: str, targets: List[float], max_seconds: float, out: str, straggler,
         ratio: float, wire: Optional[str] = None) -> tuple:
    """Run every setting of ``label``'s grid (:mod:`mpca.bench.tuning`) once; return the best setting's
    algorithm config, its name, and what each setting gave (for compare.json).  A setting whose emulated
    devices did not hold ranks after every one that did."""
    from mpca.bench.tuning import EXTEND, at_best, best, beyond, grid, pace_next

    points = grid(split_wire(label)[0], ratio, cfg.training.agents)
    if len(points) == 1:
        return points[0][1], None, []
    tried = []

    def attempt(setting, algo):
        r = run_one(spark, cfg, data, f"{label}[{setting}]", algo, targets, max_seconds, out, straggler, wire)
        tried.append({"setting": setting, "algorithm": algo, "time_to": r["time_to"],
                      "final_error": r["final_error"], "final_loss": r["final_loss"],
                      "holds": r["emulation"]["holds"] is not False})
        return best([(p["time_to"], p[f"final_{cfg.eval.metric}"], p["holds"]) for p in tried])

    for setting, algo in points:
        i = attempt(setting, algo)
    for _ in range(EXTEND):  # the best on the grid's edge: one step past it, so no optimum is cut off
        nxt = beyond(split_wire(label)[0], tried, i)
        if nxt is None:
            break
        print(f"--- {label}: best so far {tried[i]['setting']} is on the grid's edge; trying {nxt[0]}", flush=True)
        i = attempt(*nxt)
    for setting, algo in at_best(split_wire(label)[0], tried, i):  # DiLoCo's outer lrs at the period found
        print(f"--- {label}: best period so far {tried[i]['setting']}; trying {setting}", flush=True)
        i = attempt(setting, algo)
    while (nxt := pace_next(split_wire(label)[0], tried, i, cfg.emulation.device_step_s)) is not None:
        print(f"--- {label}: best so far {tried[i]['setting']}; trying its cycle pace {nxt[0]}", flush=True)
        i = attempt(*nxt)
    for p in tried:
        p["time_to"] = {str(t): v for t, v in p["time_to"].items()}  # as in the rest of compare.json
    print(f"--- {label}: best of {len(tried)} settings is {tried[i]['setting']}", flush=True)
    return tried[i]["algorithm"], tried[i]["setting"], tried


def table(results: Dict[str, dict], targets: List[float], metric: str = "error") -> "object":
    """One row per algorithm: median time to each target (of ``metric``: error or loss), and its ratio to
    ``single`` and to ``mpca``; with emulated devices, whether the emulation held in every repeat."""
    import pandas as pd

    from mpca.bench.emulation import verdict

    rows = []
    for label, r in results.items():
        row = {"algorithm": label}
        fmt = split_wire(label)[1]

        def ref_of(name: str) -> dict:  # the reference in the same wire format (sync@int8 against mpca@int8)
            return results.get(f"{name}@{fmt}" if fmt else name) or results.get(name, {})

        if any(x.get("setting") for x in results.values()):
            row["setting"] = r.get("setting") or ""
        for t in targets:
            v = r["time_to"][t]
            name = target_name(t, metric)
            row[f"t({name}) s"] = v
            if r.get("repeats", 1) > 1:
                lo, hi = r["time_range"][t]
                row[f"t({name}) min-max"] = "" if math.isnan(lo) else f"{lo:.3g}-{hi:.3g}"
            for ref in ("single", "mpca"):
                base = ref_of(ref).get("time_to", {}).get(t, math.nan)
                row[f"t({name})/{ref}"] = v / base if base and not math.isnan(base) else math.nan
        if "after_start_up_s" in r:
            last = target_name(targets[-1], metric)
            row[f"t({last}) after start-up s"] = after = r["after_start_up_s"]
            base = ref_of("mpca").get("after_start_up_s", math.nan)
            row[f"t({last}) after start-up/mpca"] = \
                after / base if base and not math.isnan(base) else math.nan
        if any(x.get("spread") for x in results.values()):
            row["repeats differ"] = "; ".join(r.get("spread") or [])  # > 2x, or a target missed by some
        if r.get("emulation") and verdict(r["emulation"]):
            row["emulated devices"] = verdict(r["emulation"])  # INVALID: not a result (agents behind T, CPU full)
        if metric == "loss":
            row["final loss"] = r.get("final_loss", math.nan)
        row.update({"final error %": 100 * r["final_error"], "MB moved": r["bytes"] / 1e6,
                    "MB per cycle": r["bytes_per_cycle"] / 1e6,
                    "duty cycle": r["duty_cycle"], "driver prep s": _nan(r.get("prepare_s")),
                    "tasks started s": _nan(r.get("startup", {}).get("task_started_s")),
                    "first rows s": _nan(r.get("startup", {}).get("data_s")),
                    "all rows s": _nan(r.get("startup", {}).get("rows_there_s")),
                    "start-up s": _nan(r.get("agents_up_s")),
                    "first exchange s": _nan(r.get("first_exchange_s")), "samples/s": r.get("samples_per_s", math.nan),
                    "agents' cores": r.get("cpu", {}).get("agents", math.nan)})
        row.update({k.replace("_", " "): r.get("figures", {}).get(k, math.nan)
                    for k in FIGURES if any(k in x.get("figures", {}) for x in results.values())})
        rows.append(row)
    return pd.DataFrame(rows)


def interleaved(labels: List[str], repeats: int) -> List[tuple]:
    """The order of the measured runs, ``(label, repeat)``: one repeat of every label per round, the rounds
    alternately forward and backward.  A long comparison shares one cluster, whose state drifts (the
    algorithms measured 35-45 minutes into one comparison started in 9.6-9.8 s, those measured first in
    5.5 s) and carries over from one run to the next (every run right after ``single``, which leaves three
    executors idle, took 23-25 s to start its agents, the others 8-18 s): rounds spread the drift over every
    algorithm, and the alternating direction gives each label a different predecessor in every other round."""
    return [(label, i) for i in range(repeats) for label in (labels if i % 2 == 0 else labels[::-1])]


def compare(spark, cfg, labels: List[str], targets: List[float], max_seconds: float, repeats: int, out: str,
            network: str, straggler=None, variants: Optional[Dict[str, dict]] = None,
            regime=None, tune_grid: bool = False) -> dict:
    """Every label's runs, the table, compare.json and the plot.  With ``regime``
    (:class:`mpca.bench.regimes.Regime`) and ``tune_grid``, each algorithm first runs its grid of settings
    for the regime's ratio once each (:func:`tune`), and its ``repeats`` runs use the best one, afresh.  The
    repeats run in rounds over the labels (:func:`interleaved`); compare.json keeps each run's order."""
    from mpca.bench.cpu_profile import describe
    from mpca.data.sources import job_dataframe, job_holdout
    from mpca.report import plot_curves, write_json

    os.makedirs(out, exist_ok=True)
    # one DataFrame for every run: the same rows, read (or built) once, a partition per agent where generated
    data = (job_dataframe(spark, cfg.data, cfg.training.agents), job_holdout(spark, cfg.data))  # holdout: None
    # where the trainer splits data.holdout of the rows by their hash (a job's own: pytext's files set aside)
    _warm_up(spark, cfg, data, out)
    chosen: Dict[str, tuple] = {}
    for label in labels:
        base, wire = split_wire(label)
        algo = (variants or {}).get(base) or ABLATIONS.get(base) or {"name": base}
        setting, tried = None, []
        if tune_grid and regime is not None and base not in (variants or {}) and base not in ABLATIONS:
            algo, setting, tried = tune(spark, cfg, data, label, targets, max_seconds, out, straggler, regime.ratio,
                                        wire)
        chosen[label] = (algo, setting, tried)
    runs_of: Dict[str, List[dict]] = {label: [] for label in labels}
    for seq, (label, i) in enumerate(interleaved(labels, repeats)):
        run = run_one(spark, cfg, data, label if repeats == 1 else f"{label}:r{i}", chosen[label][0], targets,
                      max_seconds, out, straggler, split_wire(label)[1])
        runs_of[label].append({**run, "sequence": seq})
    results: Dict[str, dict] = {}
    for label in labels:
        algo, setting, tried = chosen[label]
        runs = runs_of[label]
        first = runs[0]
        ranges, flags = spread([r["time_to"] for r in runs], targets)
        results[label] = {**first, "algorithm": algo, "setting": setting, "grid": tried, "time_range": ranges,
                          "spread": flags,
                          "time_to": {t: _median([r["time_to"][t] for r in runs]) for t in targets},
                          "final_error": statistics.median(r["final_error"] for r in runs),
                          "final_loss": statistics.median(r["final_loss"] for r in runs),
                          "bytes": statistics.median(r["bytes"] for r in runs),
                          "bytes_per_cycle": _median([r["bytes_per_cycle"] for r in runs]),
                          "duty_cycle": statistics.median(r["duty_cycle"] for r in runs), "repeats": len(runs),
                          "samples_per_s": _median([r["samples_per_s"] for r in runs]),
                          "agents_up_s": _median([_nan(r["agents_up_s"]) for r in runs]),
                          "first_exchange_s": _median([_nan(r["first_exchange_s"]) for r in runs]),
                          "first_exchange_job_end_s": _median([_nan(r.get("first_exchange_job_end_s")) for r in runs]),
                          "after_start_up_s": after_start_up(runs, targets[-1]),
                          "cpu": {k: statistics.median(r["cpu"][k] for r in runs) for k in first["cpu"]},
                          "emulation": [r["emulation"] for r in runs],
                          "prepare_s": _median([_nan(r.get("prepare_s")) for r in runs]),
                          "startup": {k: _median([_nan(r["startup"].get(k)) for r in runs]) for k in STARTUP_PHASES},
                          "runs": [{"sequence": r["sequence"], "prepare_s": r.get("prepare_s"), "startup": r["startup"],
                                    "agent_starts_s": r.get("agent_starts_s", []), "agents_up_s": r["agents_up_s"],
                                    "first_exchange_s": r["first_exchange_s"],
                                    "first_exchange_job_end_s": r.get("first_exchange_job_end_s"),
                                    "wall_s": r["wall_s"],
                                    "time_to": {str(t): r["time_to"][t] for t in targets}} for r in runs]}
    metric = cfg.eval.metric
    tab = table(results, targets, metric)
    tab.to_csv(os.path.join(out, "compare.csv"), index=False)
    mpca = ratio_run(results)
    summary = {
        "network": network, "straggler": list(straggler) if straggler else None, "targets": targets,
        "metric": metric,
        "max_seconds": max_seconds, "repeats": repeats, "agents": cfg.training.agents,
        "device_step_s": cfg.emulation.device_step_s,
        "regime": None if regime is None else {"name": regime.name, "link": regime.link, "ratio": regime.ratio,
                                               "device_step_s": regime.device_step_s, "paper": regime.paper},
        "model": cfg.model.name, "model_args": cfg.model.args, "data": cfg.data.dataset or cfg.data.path,
        "comm_comp_ratio": mpca.get("comm_comp"), "cycle_overlap": mpca.get("overlap"),
        "algorithms": {label: {k: r[k] for k in ("algorithm", "agents", "final_error", "final_loss", "wall_s",
                                                  "cycles", "bytes",
                                                  "bytes_per_cycle",
                                                  "duty_cycle", "repeats", "figures", "samples_per_s", "cpu",
                                                  "emulation", "setting", "grid", "spread", "prepare_s", "startup",
                                                  "agents_up_s", "first_exchange_s", "first_exchange_job_end_s",
                                                  "after_start_up_s", "runs")}
                       | {"time_to": {str(t): r["time_to"][t] for t in targets},
                          "time_range": {str(t): list(r["time_range"][t]) for t in targets}}
                       for label, r in results.items()},
    }
    write_json(os.path.join(out, "compare.json"), summary)
    plot_curves({label: r["history"] for label, r in results.items()}, os.path.join(out, "compare.png"),
                f"time to {'accuracy' if metric == 'error' else 'loss'}: {cfg.model.name}, network "
                f"{network.split(' (')[0]}", targets, metric=metric)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 40, "display.float_format", "{:.3g}".format):
        ratio = summary["comm_comp_ratio"]
        nominal = ""
        if regime is not None:
            from mpca.bench.regimes import off_by

            nominal = f" (regime {regime.name}: ≈ {regime.ratio:g}" + (
                "; not measured: it comes from an mpca run's cycles)" if ratio is None else
                f"; measured {off_by(ratio, regime.ratio):.1f}x off it: this cluster is not that regime)"
                if off_by(ratio, regime.ratio) > 2 else ")")
        print(f"\nnetwork: {network} | model {cfg.model.name} | {cfg.training.agents} agents | comm/comp of one "
              f"model exchange: {ratio if ratio is None else round(ratio, 2)}{nominal}"
              f" | cycle overlap {summary['cycle_overlap']}")
        print(tab.to_string(index=False))
    print("\nCPU by role (cores used; agents = training processes, python workers = exchange tasks):")
    for label, r in results.items():
        print(f"  {label:<{max(map(len, results))}}  {describe(r['cpu'])}")
    step_s = cfg.emulation.device_step_s
    if step_s is not None:
        print(f"\nEmulated devices: every step takes {1000 * step_s:g} ms (real step, then waited out); per algorithm "
              "the median real step, its CPU, late steps and machine load:")
        for label, r in results.items():
            for c in r["emulation"]:
                print(f"  {label:<{max(map(len, results))}}  real {1000 * c['real_step_s']:.1f} ms, CPU "
                      f"{1000 * c['cpu_per_step_s']:.1f} ms, late {100 * c['late_fraction']:.1f}%, machine "
                      f"{100 * c['machine_busy']:.0f}% busy: {'holds' if c['holds'] else 'INVALID: ' + c['why']}")
    print(f"\nwrote {out}/compare.csv, compare.json, compare.png", flush=True)
    return summary


def _session(cfg, network: str):
    """The Spark session: the emulated cluster's master when this process runs inside one, else the
    configured one (``existing``: spark-submit spark_jobs/benchmark.py compare ..., its cluster and network;
    or a local-cluster)."""
    from mpca.bench.emulated_cluster import session_in_cluster
    from mpca.runtime.cluster import session_for

    conf = {"spark.ui.showConsoleProgress": "false"}  # the benchmark prints its own lines
    spark = session_in_cluster("mpca-compare", {**conf, **cfg.cluster.conf})
    if spark is not None:
        return spark, f"{network} (emulated cluster: standalone master, workers in network namespaces)"
    spark, _ = session_for(cfg.cluster, "mpca-compare", conf)
    if cfg.cluster.master == "existing":
        return spark, f"{network} (the submitted cluster)"
    return spark, "none (local-cluster on one machine)" if network == "none" else \
        f"local-cluster on one machine (no {network} emulation here)"


def build_parser() -> argparse.ArgumentParser:
    """``mpca bench compare``'s options (the docs' commands are checked against it)."""
    ap = argparse.ArgumentParser(prog="mpca bench compare", description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[], help=f"job YAML (default {DEFAULT_CONFIG})")
    ap.add_argument("--task", choices=sorted(TASKS), help="a workload: " + ", ".join(
        f"{k} ({c})" for k, (c, _) in TASKS.items()) + "; its job config goes before any -c, and its targets "
        "are the default")
    ap.add_argument("--algorithms", default="mpca,sync,easgd,diloco,streaming_diloco,delayed_diloco,ddp,single")
    ap.add_argument("--ablations", action="store_true",
                    help="add mpca:gamma0, mpca:uniform, mpca:S1, mpca:S2, mpca:elastic")
    ap.add_argument("--targets", default=None, help="holdout errors, or losses in nats with eval.metric: loss, "
                    "comma-separated (default: the --task's, else the teacher task's 0.3,0.26,0.24)")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="per algorithm and repeat")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--network", default="none", help="emulated link of every host: none, 1gbit, 100mbit, "
                    "or a rate like 30mbit (default none; a --regime sets it)")
    ap.add_argument("--regime", choices=sorted(REGIMES), help="the paper's Table 1 ratio of one model exchange "
                    "to one step: " + "; ".join(r.describe() for r in REGIMES.values()) + " (sets --network and "
                    "--device-step-s; implies --tune)")
    ap.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                    help="run each algorithm's grid of settings for the regime once, then its repeats at the "
                         "best one (mpca.bench.tuning; default: on with --regime)")
    ap.add_argument("--agents", metavar="K,K,...", help="one comparison per number of agents, e.g. 1,2,4,8, "
                    "each in its own cluster and --out/K<k>, then the table over K (sweep.csv)")
    ap.add_argument("--out", default="runs/compare")
    ap.add_argument("--device-speed", metavar="AGENT:SPEED", help="slow one agent, e.g. 1:0.5: its steps take "
                    "T / 0.5 (emulation.device_speed; Fig. 10c: compare --algorithms mpca,mpca:uniform,mpca:uncontested)")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=NAME,key=value,...",
                    help="an algorithm with its own settings under LABEL, e.g. 'push:2=weaksync,c=2', and run settings "
                         "of its own as SECTION.KEY, e.g. 'lock=mpca,training.lock_step=5' (repeatable)")
    ap.add_argument("--wire", metavar="FORMAT,...", help="run every algorithm once per wire format, labelled "
                    "ALGO@FORMAT, e.g. fp32,int8 (mpca.algorithm.wire; one format: wire.format=FORMAT does the same "
                    "without the suffix)")
    ap.add_argument("--device-step-s", type=float, metavar="SECONDS",
                    help="emulated devices: every agent's training step takes this wall time, for every algorithm "
                         "(emulation.device_step_s); runs where agents fall behind it or the machine is saturated "
                         "are marked INVALID")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the job config")
    refuse_renamed(ap, "--device-step", "--straggler")
    return ap


def main(argv=None, *, nested: bool = False) -> int:
    """``nested``: one K of this process's ``--agents`` sweep (an emulated cluster runs as a child of it)."""
    args = build_parser().parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    from mpca.errors import UserError

    if args.agents:
        from mpca.bench.sweep import run_sweep

        try:
            ks = [int(k) for k in args.agents.split(",") if k.strip()]
        except ValueError:
            raise UserError(f"--agents takes numbers like 1,2,4,8, got {args.agents!r}") from None
        if not ks or min(ks) < 1:
            raise UserError(f"--agents takes numbers >= 1, got {args.agents!r}")
        return run_sweep(lambda k_argv: main(k_argv, nested=True), argv, ks, args.out)
    regime = None
    if args.regime:
        from mpca.bench.regimes import regime as named

        regime = named(args.regime)
        for flag, given, wanted in (("--network", args.network, regime.link),
                                    ("--device-step-s", args.device_step_s, regime.device_step_s)):
            if given not in (None, "none", wanted):
                raise UserError(f"--regime {regime.name} sets {flag} {wanted}; drop {flag} {given} or the regime")
        args.network, args.device_step_s = regime.link, regime.device_step_s
    tune_grid = bool(regime) if args.tune is None else args.tune
    if tune_grid and regime is None:
        raise UserError("--tune needs a --regime (its grid is built from the regime's communication/computation "
                        "ratio)")
    if args.network != "none":
        from mpca.bench.emulated_cluster import rate_bits

        try:
            rate_bits(args.network)
        except UserError as e:
            raise UserError(f"--network: {e}") from None
    if args.device_step_s is not None:
        if not args.device_step_s > 0:
            raise UserError(f"--device-step-s must be > 0 seconds, got {args.device_step_s}")
        args.overrides.append(f"emulation.device_step_s={args.device_step_s}")
    from mpca.algorithm import algorithm_names
    from mpca.config import load_config

    labels = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        raise UserError(str(e)) from None
    labels += [v for v in variants if v not in labels]
    for a in [x for x in labels if x not in variants]:
        if a not in algorithm_names() and a not in ABLATIONS:
            raise UserError(f"--algorithms: unknown {a!r}; choose from {', '.join(algorithm_names())}")
    if args.ablations:
        labels += [a for a in ABLATIONS if a not in labels and (args.device_speed or a != "mpca:uncontested")]
    if args.wire:
        from mpca.algorithm.wire import FORMATS

        formats = [f.strip() for f in args.wire.split(",") if f.strip()]
        if not formats or any(f not in FORMATS for f in formats):
            raise UserError(f"--wire takes formats among {', '.join(FORMATS)}, comma-separated, got {args.wire!r}")
        labels = [f"{label}@{f}" for label in labels for f in formats]
    speeds = parse_device_speed(args.device_speed or "")
    if len(speeds) > 1:
        raise UserError(f"--device-speed {args.device_speed!r}: the comparison slows one agent (its ablation "
                        "mpca:uncontested runs without it); give one AGENT:SPEED")
    straggler = next(iter(speeds.items()), None)
    task_config, task_targets = TASKS[args.task or "teacher"]
    try:
        targets = sorted((float(t) for t in (args.targets or task_targets).split(",")), reverse=True)
    except ValueError:
        raise UserError(f"--targets must be numbers like 0.3,0.2,0.1, got {args.targets!r}") from None
    cfg = load_config(([task_config] if args.task else []) + args.config or [DEFAULT_CONFIG], args.overrides)
    loss = cfg.eval.metric == "loss"  # targets in nats (a language model's), not error shares
    if not targets or not all(0 < t and (loss or t < 1) for t in targets) or args.repeats < 1 or args.max_seconds <= 0:
        raise UserError(f"--targets must lie in {'(0, inf): losses in nats' if loss else '(0, 1)'}, --repeats >= 1 "
                        "and --max-seconds > 0")
    if args.network != "none":
        from mpca.bench import emulated_cluster

        if not emulated_cluster.inside():
            # this same command again, inside an emulated cluster (lab/netcluster.py as a process: this one becomes
            # it, so SIGTERM/SIGHUP/Ctrl-C tear the cluster down; one K of an --agents sweep runs it as a child)
            rc, why = emulated_cluster.run_inside(cfg.training.agents, args.network,
                                                  [sys.executable, "-m", "mpca.bench.compare", *argv],
                                                  replace=not nested, **emulated_hosts(cfg))
            if rc is not None:
                return rc
            print(f"mpca bench compare: {why}; falling back to local-cluster (results labelled as such)",
                  file=sys.stderr)
    spark, network = _session(cfg, args.network)
    try:
        compare(spark, cfg, labels, targets, args.max_seconds, args.repeats, args.out, network, straggler, variants,
                regime, tune_grid)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
