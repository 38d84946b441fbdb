"""The driver's per-cycle record: when each phase of each shard started and ended, and what agents did.

Phases of cycle ``c`` (one Spark job):

* ``stage``  — driver: Eqs. 9 → 8 → 4 → 5 for the shard reduced in the previous
  cycle and creation of its broadcast variable (runs while job ``c`` runs);
* ``broadcast`` — from the job's submission until the last agent received the
  broadcast shard and had it handed over;
* ``reduce`` — from the first agent's shard materialisation until the reduced
  result reached the driver.

Per agent, the deliver task's ``t_start`` is when its Python code began, i.e.
when Spark had finished fetching the broadcast for it (``t_bc_loaded`` just
after); the reduce task's ``t_start`` and ``t_yield`` need no broadcast.

Overlap between phases is computed from these timestamps, not assumed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mpca.runtime.reports import AgentReport


@dataclass
class CycleRecord:
    cycle: int
    reduce_shard: Optional[int]
    bcast_shard: Optional[int]
    t_submit: float
    t_end: float = 0.0
    stage_shard: Optional[int] = None
    stage_start: Optional[float] = None
    stage_end: Optional[float] = None
    bcast_end: Optional[float] = None
    reduce_start: Optional[float] = None
    bytes_up: int = 0  # shard payloads that reached the reduction (agents → driver)
    bytes_down: int = 0  # broadcast payloads handed to agents (driver → agents)
    rejected: bool = False  # its reduction held NaN/Inf and was not applied
    corrections: int = 0
    misplaced: int = 0
    missing: List[int] = field(default_factory=list)  # agents that did not contribute (hung, lost, joining)
    joined: List[int] = field(default_factory=list)  # replacement agents handed the joint model after it
    agents: Dict[int, AgentReport] = field(default_factory=dict)  # reduce tasks' reports (contributions)
    delivered: Dict[int, AgentReport] = field(default_factory=dict)  # deliver tasks' reports (broadcast hand-offs)

    @property
    def broadcast_interval(self):
        return (self.t_submit, self.bcast_end) if self.bcast_end is not None else None

    @property
    def reduce_interval(self):
        return (self.reduce_start, self.t_end) if self.reduce_start is not None else None

    def broadcast_overlaps_reduce(self) -> bool:
        b, r = self.broadcast_interval, self.reduce_interval
        return bool(b and r and b[0] < r[1] and r[0] < b[1])

    def reduce_started_before_broadcast(self) -> bool:
        """Whether some agent's reduce task began while its broadcast was still being downloaded."""
        return any(r.t_start and d.t_start and r.t_start < d.t_start
                   for a, r in self.agents.items() for d in [self.delivered.get(a)] if d is not None)

    def reduce_before_broadcast(self) -> bool:
        """Whether some agent's shard was yielded before the task holding its broadcast had started, i.e.
        before Spark had finished downloading the broadcast: the reduce did not wait for it."""
        return any(r.t_yield and d.t_start and r.t_yield < d.t_start
                   for a, r in self.agents.items() for d in [self.delivered.get(a)] if d is not None)

    def stage_overlaps_job(self) -> bool:
        return self.stage_start is not None and self.stage_start < self.t_end and self.t_submit < self.stage_end


class Timeline:
    def __init__(self):
        self.cycles: List[CycleRecord] = []

    def add(self, rec: CycleRecord) -> None:
        self.cycles.append(rec)

    def overlap_fraction(self, skip: int = 3) -> float:
        """Fraction of cycles (after ``skip`` warm-up cycles) whose broadcast and reduction overlapped."""
        rows = [c for c in self.cycles[skip:] if c.bcast_shard is not None and c.reduce_shard is not None]
        return sum(c.broadcast_overlaps_reduce() for c in rows) / len(rows) if rows else 0.0

    def rows(self) -> List[dict]:
        out = []
        for c in self.cycles:
            weights = {a: e.weight for a, e in sorted(c.agents.items())}
            rates = {a: e.steps_per_s for a, e in sorted(c.agents.items())}
            out.append({
                "cycle": c.cycle, "reduce_shard": c.reduce_shard, "bcast_shard": c.bcast_shard,
                "stage_shard": c.stage_shard, "t_submit": c.t_submit, "t_end": c.t_end,
                "stage_start": c.stage_start, "stage_end": c.stage_end, "bcast_end": c.bcast_end,
                "reduce_start": c.reduce_start, "overlap": c.broadcast_overlaps_reduce(),
                "rejected": c.rejected, "resets": sum(e.resets for e in c.agents.values()), "bytes_up": c.bytes_up, "bytes_down": c.bytes_down, "corrections": c.corrections, "misplaced": c.misplaced, "missing": list(c.missing), "joined": list(c.joined),
                "weight": weights, "steps_per_s": rates,
            })
        return out

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.rows())
