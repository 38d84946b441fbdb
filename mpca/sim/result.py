"""What a simulation returns: the holdout history of the driver's joint model in virtual time, one record per
exchange cycle, the parameter service's traffic, and the time to each target error; as a table and as JSON."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mpca.exchange.schedule import ExchangeEvent


@dataclass
class HistoryRow:
    t: float  # virtual seconds
    steps: int  # total agent steps so far
    holdout_error: float
    holdout_loss: float
    metrics: Dict[str, float] = field(default_factory=dict)  # the driver rule's own figures since the last row


@dataclass
class CycleStat:
    cycle: int
    start: float
    end: float
    reduce_shard: Optional[int]
    bcast_shard: Optional[int]
    bytes_in: int  # into the driver's port: treeReduce's last level
    bytes_out: int  # out of the driver's port: the broadcast's copies
    bytes_up: int  # what the agents sent (their contributions as encoded)
    missing: List[int] = field(default_factory=list)  # agents whose contribution did not reach the reduction
    joined: List[int] = field(default_factory=list)  # replacements handed the joint model at the cycle's end


@dataclass
class SimResult:
    algorithm: str
    agents: int
    wire: str
    constants: Dict[str, Any]
    settings: Dict[str, Any]
    history: List[HistoryRow] = field(default_factory=list)
    cycles: List[CycleStat] = field(default_factory=list)
    # what the exchange core's schedule did, in order (mpca.exchange.schedule.ExchangeEvent), as FitResult's
    exchange_events: List[ExchangeEvent] = field(default_factory=list)  # not in to_dict: the cycles say it
    targets: List[float] = field(default_factory=list)
    time_to_target: Dict[str, Optional[float]] = field(default_factory=dict)
    virtual_s: float = 0.0
    steps: int = 0
    service_requests: int = 0
    service_bytes_in: int = 0
    service_bytes_out: int = 0
    ring_bytes: float = 0.0  # ddp: bytes every host sent in its all-reduces
    wall_s: float = 0.0

    def reach(self) -> None:
        """Fill ``time_to_target`` from the history: the first evaluation at or under each target."""
        for target in self.targets:
            hit = next((r.t for r in self.history if r.holdout_error <= target), None)
            self.time_to_target[f"{target:g}"] = hit

    @property
    def bytes_on_driver_port(self) -> int:
        return sum(c.bytes_in + c.bytes_out for c in self.cycles) + self.service_bytes_in + self.service_bytes_out

    @property
    def final_error(self) -> float:
        return self.history[-1].holdout_error if self.history else math.nan

    @property
    def mean_cycle_s(self) -> float:
        """The mean duration of the cycles that took time (NaN for the service algorithms, which run none)."""
        done = [c for c in self.cycles if c.end > c.start]
        return sum(c.end - c.start for c in done) / len(done) if done else math.nan

    @property
    def missed_cycles(self) -> Dict[int, int]:
        """Per agent that was away (mpca.sim.presence), the cycles its contribution missed."""
        missed: Dict[int, int] = {}
        for c in self.cycles:
            for a in c.missing:
                missed[a] = missed.get(a, 0) + 1
        return dict(sorted(missed.items()))

    @property
    def joins(self) -> List[Tuple[int, float]]:
        """(agent, virtual second) of every replacement handed the joint model, at its cycle's end."""
        return [(a, c.end) for c in self.cycles for a in c.joined]

    def table(self) -> str:
        head = " | ".join(["algorithm", "K", "wire"] + [f"t({t:g}) s" for t in self.targets] +
                          ["final error", "steps", "cycles", "mean cycle s", "driver port MB", "virtual s", "wall s"])
        mean_cycle = self.mean_cycle_s
        cells = [self.algorithm, str(self.agents), self.wire] + \
            [("—" if v is None else f"{v:.1f}") for v in self.time_to_target.values()] + \
            [f"{self.final_error:.4f}", str(self.steps), str(len(self.cycles)),
             "—" if math.isnan(mean_cycle) else f"{mean_cycle:.2f}", f"{self.bytes_on_driver_port / 1e6:.1f}",
             f"{self.virtual_s:.1f}", f"{self.wall_s:.1f}"]
        return head + "\n" + " | ".join(cells) + self.presence_line()

    def presence_line(self) -> str:
        """Agents that were away (mpca.sim.presence): per agent the cycles its contribution missed, then joins."""
        missed, joins = self.missed_cycles, self.joins
        if not missed and not joins:
            return ""
        parts = [f"agent {a} missing from {n} cycle(s)" for a, n in sorted(missed.items())]
        parts += [f"agent {a} joined from the joint model at {t:.1f} s" for a, t in joins]
        return "\nagents away: " + "; ".join(parts)

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out.pop("exchange_events")
        out.update(bytes_on_driver_port=self.bytes_on_driver_port, final_error=self.final_error,
                   mean_cycle_s=self.mean_cycle_s, cycle_count=len(self.cycles),
                   missed_cycles={str(a): n for a, n in self.missed_cycles.items()}, joins=self.joins)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=True)
