"""The driver's 3-phase schedule (§4.2, Figs. 6–8): which shard each cycle reduces, which staged shard its job
broadcasts, and when a reduction is staged — written once, driven by the Spark runtime's pipeline
(:class:`mpca.runtime.pipeline.ExchangePipeline`, real jobs) and the simulator's
(:class:`mpca.sim.cycles.VirtualPipeline`, virtual time).  No Spark, no clock: a driver calls
:meth:`PhaseSchedule.open` when it submits cycle ``c``'s job, :meth:`PhaseSchedule.overlap` while that job runs, and
:meth:`PhaseSchedule.close` with what the job reduced.

Cycle ``c`` reduces the shard the driver rule names (``rule.reduce_shard(c)``, ``c mod S``) with
``rule.cycle_params(c)``.  With S ≥ 3 the shard reduced in cycle ``c − 1`` is *staged* — the driver rule's
:meth:`~mpca.algorithm.DriverRule.on_reduced` (for MPCA Eqs. 9 → 8 → 4 → 5), then published (a broadcast variable,
or the encoded bytes the simulator delivers) — while job ``c`` runs, and broadcast by job ``c + 1``: after the fill
one shard is being reduced, one broadcast and one staged at every moment (Fig. 8).  With S ≤ 2 (Figs. 6–7) a
reduction is staged when its job ends and broadcast by the next.  The first reduction of a pipeline is staged at once
whatever S (:meth:`~mpca.algorithm.DriverRule.stage_lag` with ``first``): nothing runs to overlap it with, and the
fill takes a cycle less.

A reduction whose sum holds NaN/Inf is not applied (:func:`~mpca.exchange.partials.driver_sum`).  What leaving
agents handed in (:meth:`PhaseSchedule.hand_in`) is added to the next reduction of their shard that the driver rule
takes it in (:meth:`~mpca.algorithm.DriverRule.takes_hand_in`).

The schedule logs what it does (:attr:`PhaseSchedule.events`, the latest :data:`EVENTS_KEPT`): ``reduce`` and
``broadcast`` when a cycle opens, ``stage`` when a reduction is applied to the joint model (``rejected`` where its sum
held NaN/Inf), ``hand_in`` for each leaving agent's contribution a staging took — the same sequence whichever driver
runs it, which ``tests/integration/test_lock_step_scenario.py`` checks of the Spark runtime and the simulator.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, List, Optional, Tuple, TypeVar

from mpca.algorithm.base import DriverRule
from mpca.algorithm.weighted_sum import WeightedSum
from mpca.exchange.partials import Partial, combine, decoded, driver_sum

log = logging.getLogger("mpca.pipeline")

P = TypeVar("P")  # what a driver publishes a staged shard as: a Spark broadcast variable, encoded bytes
EVENTS_KEPT = 10_000  # the schedule's latest events kept (a few per cycle)


@dataclass(frozen=True)
class ExchangeEvent:
    """One thing the schedule did: ``kind`` (reduce, broadcast, stage, rejected, hand_in) in cycle ``cycle`` (a
    staging: the cycle of the reduction it applies), of shard ``shard``; ``agent``: a hand-in's."""

    kind: str
    cycle: int
    shard: int
    agent: Optional[int] = None


@dataclass
class Staged(Generic[P]):
    """Shard ``shard``'s projection, published for the job that carries it."""

    shard: int
    payload: P


@dataclass
class CycleOpen(Generic[P]):
    """What cycle ``cycle``'s job does: reduce ``shard`` with the rule's ``params``, broadcast ``staged`` (if any).
    ``first``: the pipeline's first reduction (staged at once whatever S)."""

    cycle: int
    shard: int
    params: dict
    staged: Optional[Staged[P]]
    first: bool


@dataclass
class StageOutcome:
    """A staging: the reduction of ``shard`` from cycle ``cycle``; ``rejected`` when its sum held NaN/Inf (not
    applied); ``handed_in``: leaving agents whose last contribution it took."""

    cycle: int
    shard: int
    rejected: bool = False
    handed_in: List[int] = field(default_factory=list)


class PhaseSchedule(Generic[P]):
    """The schedule of one run's cycles for ``rule``; ``publish(shard, vec)`` turns a staged projection into what
    the driver's job carries, ``release(payload)`` drops one no job will carry (a run that stops)."""

    def __init__(self, rule: DriverRule, publish: Callable[[int, "object"], P],
                 release: Callable[[P], None] = lambda payload: None):
        self.rule = rule
        self.publish, self.release = publish, release
        self.lag = rule.stage_lag()
        self.pending: Optional[Tuple[int, int, Partial]] = None  # (cycle, shard, partial) reduced, not staged yet
        self.staged: Dict[int, Staged[P]] = {}  # by the cycle whose job carries it
        self.rejected = 0
        self._filling = True  # no reduction yet
        self._handed_in: Dict[int, List[Tuple[int, WeightedSum, dict]]] = {}  # shard -> (agent, contribution, extra)
        self.events: "collections.deque[ExchangeEvent]" = collections.deque(maxlen=EVENTS_KEPT)

    def open(self, cycle: int) -> CycleOpen[P]:
        """Cycle ``cycle``'s job is submitted: what it reduces and broadcasts (the staged shard leaves the book)."""
        first, self._filling = self._filling and self.pending is None, False  # a resumed run's pending: not first
        opened = CycleOpen(cycle, self.rule.reduce_shard(cycle), self.rule.cycle_params(cycle),
                           self.staged.pop(cycle, None), first)
        self.events.append(ExchangeEvent("reduce", cycle, opened.shard))
        if opened.staged is not None:
            self.events.append(ExchangeEvent("broadcast", cycle, opened.staged.shard))
        return opened

    def overlap(self) -> Optional[StageOutcome]:
        """While the job just opened runs: stage the previous cycle's reduction (lag 2, Fig. 8)."""
        if self.lag != 2 or self.pending is None:
            return None
        cycle, shard, partial = self.pending
        self.pending = None
        return self._stage(cycle, shard, partial, 2)

    def close(self, opened: CycleOpen[P], partial: Optional[Partial]) -> Optional[StageOutcome]:
        """The job of ``opened`` reduced ``partial`` (None: nobody answered, nothing to stage): staged now (lag 1)
        or held for the next job to overlap (lag 2)."""
        if partial is None:
            return None
        lag = self.rule.stage_lag(first=opened.first)
        if lag == 1:
            return self._stage(opened.cycle, opened.shard, partial, 1)
        self.pending = (opened.cycle, opened.shard, partial)
        return None

    def hand_in(self, agent: int, shard: int, contribution: WeightedSum, extra: dict) -> None:
        """A leaving agent's last contribution of ``shard``: added to the next reduction of that shard the driver
        rule takes it in."""
        self._handed_in.setdefault(shard, []).append((agent, contribution, extra))

    def _stage(self, cycle: int, shard: int, partial: Partial, lag: int) -> StageOutcome:
        outcome = StageOutcome(cycle, shard)
        ws = driver_sum(partial)
        if ws is None:
            self.rejected += 1
            outcome.rejected = True
            self.events.append(ExchangeEvent("rejected", cycle, shard))
            log.warning("cycle %d: the reduction of shard %d holds NaN/Inf; not applied to the joint model",
                        cycle, shard)
            return outcome
        for agent, contribution, extra in self._handed_in.pop(shard, []):
            if self.rule.takes_hand_in(shard, extra):
                ws = combine(ws, contribution)
                outcome.handed_in.append(agent)
                self.events.append(ExchangeEvent("hand_in", cycle, shard, agent))
            else:
                log.info("agent %s's handed-in shard %d came too late for its reduction; dropped", agent, shard)
        self.events.append(ExchangeEvent("stage", cycle, shard))
        out = self.rule.on_reduced(cycle, shard, ws)
        if out is not None:
            self.staged[cycle + lag] = Staged(shard, self.publish(shard, out))
        return outcome

    # ------------------------------------------------------------------ checkpoints and the stop
    def pending_state(self) -> Optional[Dict[str, object]]:
        """The reduction received but not staged yet, for checkpoints: without it a resume would drop one shard's
        reduction."""
        if self.pending is None:
            return None
        import numpy as np
        import torch

        cycle, shard, partial = self.pending
        p = decoded(partial)
        total = None if p.total is None else torch.from_numpy(np.array(p.total))
        return {"cycle": cycle, "shard": shard, "total": total, "weight": float(p.weight)}

    def restore_pending(self, state: Optional[Dict[str, object]]) -> None:
        """Take back a checkpoint's pending reduction: staged with the first cycle, as if never interrupted; where
        this run stages between jobs (a checkpoint of an overlapped run), applied to the joint model at once."""
        if state is None:
            return
        total = state["total"]
        self.pending = (int(state["cycle"]), int(state["shard"]),
                        WeightedSum(None if total is None else total.numpy(), float(state["weight"])))
        if self.lag == 1:  # no cycle would stage it
            self.flush()

    def flush(self) -> None:
        """Apply whatever was reduced but not staged yet, so the joint model holds every reduction, and release
        the staged shards no job will carry."""
        if self.pending is not None:
            cycle, shard, partial = self.pending
            self.pending = None
            ws = driver_sum(partial)
            if ws is None:
                log.warning("cycle %d: the reduction of shard %d holds NaN/Inf; not applied to the joint model",
                            cycle, shard)
                self.events.append(ExchangeEvent("rejected", cycle, shard))
            else:
                self.events.append(ExchangeEvent("stage", cycle, shard))
                self.rule.on_reduced(cycle, shard, ws)
        for st in self.staged.values():
            self.release(st.payload)
        self.staged.clear()


__all__ = ["CycleOpen", "EVENTS_KEPT", "ExchangeEvent", "PhaseSchedule", "StageOutcome", "Staged"]
