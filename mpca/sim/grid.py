"""Time to one target error for one algorithm at one K (a cell of ``mpca plan``'s grid and of the K-scaling
study, ``lab/scaling.py``).  Each cell is one simulation per seed of a base
:class:`~mpca.sim.simulator.SimConfig` with the algorithm, K and seed replaced; a run stops at the target (or
at the base config's ``max_virtual_s``, the horizon).  A cell the algorithm refuses (``single`` with K > 1,
``rudra-softsync`` with n > K) is kept with the reason instead of a time, and so is a run that failed."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from mpca.algorithm.base import Algorithm
from mpca.sim.simulator import SimConfig, Simulator
from mpca.sim.workload import Workload


@dataclass
class GridRow:
    algorithm: str
    agents: int
    settings: Dict[str, Any]  # the algorithm's settings as run (name excluded)
    time_s: Optional[float] = None  # virtual seconds to the target (crossing_time), mean over the seeds; None: not reached
    times: List[Optional[float]] = field(default_factory=list)  # per seed
    steps: float = 0.0  # total agent steps per run (mean over the seeds)
    final_error: float = math.nan  # last evaluated holdout error (mean over the seeds)
    wall_s: float = 0.0  # wall seconds of the cell's simulations
    skipped: str = ""  # why the cell was not run
    failed: str = ""  # why a run stopped before its end (a diverged model's NaN refused by the service)
    metrics: Dict[str, float] = field(default_factory=dict)  # the driver rule's figures, e.g. mean staleness

    @property
    def reached(self) -> bool:
        return self.time_s is not None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def crossing_time(history, target: float, metric: str = "error") -> Optional[float]:
    """When the holdout error (``metric`` "error") or loss ("loss") first reaches ``target``: linear between the
    last evaluation above it and the first at or under it (the first evaluation's time when that is already under
    it); None if never."""
    column = "holdout_error" if metric == "error" else "holdout_loss"
    prev = None
    for r in history:
        now = getattr(r, column)
        if now <= target:
            if prev is None or getattr(prev, column) <= now:
                return r.t
            frac = (getattr(prev, column) - target) / (getattr(prev, column) - now)
            return prev.t + frac * (r.t - prev.t)
        prev = r
    return None


def mean_metric(history, name: str, weight: str) -> Optional[float]:
    """A driver metric averaged over a run's history rows, each row weighted by its ``weight`` count (e.g.
    Rudra's ``mean_staleness`` over its ``updates``); None when no row has both."""
    pairs = [(r.metrics[name], r.metrics[weight]) for r in history
             if name in r.metrics and weight in r.metrics and r.metrics[weight] and
             not math.isnan(r.metrics[name])]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def split_rows(work: Workload, agents: int, rows_total: int) -> Workload:
    """One data set of ``rows_total`` rows split evenly among the agents (as Spark partitions a table: K agents
    see 1/K of it each), one holdout for every K (the workload's ``split``)."""
    return work.split(agents, rows_total)


def run_cell(base: SimConfig, algorithm: Algorithm, agents: int, seeds: Sequence[int],
             rows_total: Optional[int] = None) -> GridRow:
    """One algorithm at K = ``agents``: every seed's simulation towards ``base.targets``' smallest target;
    with ``rows_total``, the base workload's rows split among the agents (:func:`split_rows`)."""
    row = GridRow(algorithm.name, agents, algorithm.model_dump(mode="json", exclude={"name"}))
    update = {"algorithm": algorithm, "agents": agents}
    if rows_total is not None:
        update["workload"] = split_rows(base.workload, agents, rows_total)
    cfg = base.model_copy(update=update)
    target = min(base.targets) if base.targets else None
    results = []
    for seed in seeds:
        try:
            sim = Simulator(cfg.model_copy(update={"seed": seed}))
        except ValueError as e:  # the algorithm refuses this K (or the simulator the algorithm)
            row.skipped = str(e).splitlines()[0]
            return row
        try:
            results.append(sim.run())
        except ValueError as e:  # e.g. an agent's update went NaN and the service refused it
            row.failed = str(e).splitlines()[0]
            row.wall_s += sim.result.wall_s
            return row
    hits = [None if target is None else crossing_time(r.history, target, base.metric) for r in results]
    row.times = hits
    row.time_s = statistics.fmean(hits) if hits and all(h is not None for h in hits) else None
    row.steps = statistics.fmean(r.steps for r in results)
    row.final_error = statistics.fmean(r.final_error for r in results)
    row.wall_s = sum(r.wall_s for r in results)
    for name, weight in (("mean_staleness", "updates"), ("mean_staleness", "commits")):
        values = [mean_metric(r.history, name, weight) for r in results]
        if values and all(v is not None for v in values):
            row.metrics[name] = statistics.fmean(values)
    return row


__all__ = ["GridRow", "crossing_time", "mean_metric", "run_cell", "split_rows"]
