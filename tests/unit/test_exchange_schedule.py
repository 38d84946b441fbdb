"""The 3-phase schedule of the exchange core (mpca.exchange.schedule) against hand-worked sequences: which shard each
cycle reduces and broadcasts with S = 3 (Fig. 8, the fill staged at once) and S = 2 (Fig. 7), a non-finite
reduction refused, hand-ins, and the pending reduction through a checkpoint."""
from __future__ import annotations

import numpy as np
import torch

from mpca.algorithm.base import DriverRule
from mpca.algorithm.weighted_sum import WeightedSum
from mpca.exchange.schedule import ExchangeEvent, PhaseSchedule


class Recording(DriverRule):
    """The joint model is the last mean of each shard; every reduction is broadcast back."""

    def __init__(self, shards: int, takes: bool = True):
        super().__init__([torch.zeros(2) for _ in range(shards)], agents=2)
        self.reduced = []
        self.takes = takes

    def on_reduced(self, cycle, shard, partial):
        self.reduced.append((cycle, shard, float(partial.weight)))
        if partial.total is not None:
            self.joint[shard] = partial.total / partial.weight
        return self.joint[shard].clone()

    def takes_hand_in(self, shard, extra):
        return self.takes


def _sum(value: float, weight: float = 1.0) -> WeightedSum:
    return WeightedSum(np.full(2, value * weight, np.float32), weight)


def _run(schedule: PhaseSchedule, cycles: int):
    """Drive ``cycles`` as a pipeline does: open, overlap while the job runs, close with the reduction."""
    broadcasts = []
    for c in range(cycles):
        opened = schedule.open(c)
        broadcasts.append((opened.shard, opened.staged.shard if opened.staged else None))
        schedule.overlap()
        schedule.close(opened, _sum(float(c)))
    return broadcasts


def test_three_shards_stage_while_the_next_job_runs_after_the_fill():
    rule = Recording(3)
    published = []
    schedule = PhaseSchedule(rule, lambda shard, vec: published.append(shard) or f"bc{len(published)}")
    # (reduced, broadcast) per cycle: c0's reduction staged at once (the fill) and broadcast by c1; from c1 on a
    # reduction is staged while the next job runs and broadcast by the job after it — c2 broadcasts nothing
    assert _run(schedule, 6) == [(0, None), (1, 0), (2, None), (0, 1), (1, 2), (2, 0)]
    # staged: c0's at its close, c1's during c2, c2's during c3, ...; c5's still pending
    assert [(c, s) for c, s, _ in rule.reduced] == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1)]
    assert schedule.pending[:2] == (5, 2)


def test_two_shards_stage_between_jobs():
    rule = Recording(2)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    assert _run(schedule, 4) == [(0, None), (1, 0), (0, 1), (1, 0)]
    assert [(c, s) for c, s, _ in rule.reduced] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert schedule.pending is None


def test_a_non_finite_reduction_is_refused_and_nothing_is_broadcast():
    rule = Recording(2)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    opened = schedule.open(0)
    outcome = schedule.close(opened, WeightedSum(np.array([np.nan, 1.0], np.float32), 1.0))
    assert outcome.rejected and schedule.rejected == 1 and rule.reduced == []
    assert schedule.open(1).staged is None


def test_a_hand_in_joins_the_next_reduction_of_its_shard():
    rule = Recording(2)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    schedule.hand_in(7, 1, _sum(4.0, 2.0), {})
    outcome = schedule.close(schedule.open(0), _sum(1.0))  # shard 0: the hand-in waits for shard 1
    assert outcome.handed_in == []
    outcome = schedule.close(schedule.open(1), _sum(1.0))  # shard 1: (1·1 + 4·2) / 3 = 3
    assert outcome.handed_in == [7] and rule.reduced[-1] == (1, 1, 3.0)
    assert rule.joint[1].tolist() == [3.0, 3.0]


def test_a_hand_in_the_rule_does_not_take_is_dropped():
    rule = Recording(2, takes=False)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    schedule.hand_in(7, 0, _sum(4.0, 2.0), {})
    outcome = schedule.close(schedule.open(0), _sum(1.0))
    assert outcome.handed_in == [] and rule.reduced[-1] == (0, 0, 1.0)
    assert schedule.close(schedule.open(1), _sum(1.0)).handed_in == []  # dropped, not kept for later


def test_the_pending_reduction_survives_a_checkpoint_and_a_resume_is_not_a_fill():
    rule = Recording(3)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    _run(schedule, 2)  # c1's reduction (shard 1, mean 1) pending
    state = schedule.pending_state()
    assert state["cycle"] == 1 and state["shard"] == 1 and state["weight"] == 1.0
    assert state["total"].tolist() == [1.0, 1.0]

    resumed_rule = Recording(3)
    resumed = PhaseSchedule(resumed_rule, lambda shard, vec: shard)
    resumed.restore_pending(state)
    opened = resumed.open(2)
    assert not opened.first  # the resumed pipeline is not filling: its next reduction waits a cycle
    resumed.overlap()
    assert resumed_rule.reduced == [(1, 1, 1.0)] and resumed.staged[3].shard == 1
    resumed.close(opened, _sum(2.0))
    assert resumed.pending[:2] == (2, 2)


def test_a_two_shard_run_applies_a_restored_pending_reduction_at_once():
    rule = Recording(2)
    schedule = PhaseSchedule(rule, lambda shard, vec: shard)
    schedule.restore_pending({"cycle": 4, "shard": 0, "total": torch.tensor([6.0, 6.0]), "weight": 3.0})
    assert rule.reduced == [(4, 0, 3.0)] and rule.joint[0].tolist() == [2.0, 2.0] and schedule.pending is None


def test_flush_applies_the_pending_reduction_and_releases_what_no_job_carries():
    rule = Recording(3)
    released = []
    schedule = PhaseSchedule(rule, lambda shard, vec: f"bc{shard}", released.append)
    _run(schedule, 3)  # c1's staged for c3 (bc1), c2's pending
    schedule.flush()
    assert released == ["bc1"] and schedule.staged == {} and schedule.pending is None
    assert [(c, s) for c, s, _ in rule.reduced] == [(0, 0), (1, 1), (2, 2)]


def test_the_schedule_logs_what_it_does_in_order():
    """The events both drivers produce (the scenario test compares the runtime's with the simulator's)."""
    rule = Recording(3)
    schedule = PhaseSchedule(rule, lambda shard, vec: f"bc{shard}")
    schedule.hand_in(7, 1, _sum(4.0, 2.0), {})
    _run(schedule, 4)
    schedule.flush()
    ev = [(e.kind, e.cycle, e.shard) + ((e.agent,) if e.agent is not None else ()) for e in schedule.events]
    assert ev == [("reduce", 0, 0), ("stage", 0, 0),  # the fill: staged at its close
                  ("reduce", 1, 1), ("broadcast", 1, 0),
                  ("reduce", 2, 2), ("hand_in", 1, 1, 7), ("stage", 1, 1),  # c1's staged while c2 runs
                  ("reduce", 3, 0), ("broadcast", 3, 1), ("stage", 2, 2),
                  ("stage", 3, 0)]  # the stop's flush
    assert all(isinstance(e, ExchangeEvent) for e in schedule.events)


def test_a_rejected_reduction_is_logged_as_such():
    rule = Recording(1)
    schedule = PhaseSchedule(rule, lambda shard, vec: "bc")
    opened = schedule.open(0)
    schedule.close(opened, WeightedSum(np.array([np.nan, 0.0], np.float32), 1.0))
    assert [(e.kind, e.cycle, e.shard) for e in schedule.events] == [("reduce", 0, 0), ("rejected", 0, 0)]
