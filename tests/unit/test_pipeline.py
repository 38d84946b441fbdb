"""The runtime's pipeline (mpca.runtime.pipeline) and the control jobs it runs (mpca.runtime.control), without Spark."""
from __future__ import annotations

import pytest

from mpca.algorithm import WeightedSum
from mpca.algorithm.wire import Codec
from mpca.runtime.roster import AgentRoster
from mpca.runtime.timeline import CycleRecord
from tests.helpers import answered


def _pipeline(executors=1):
    import torch

    from mpca.algorithm.mpca import MPCA
    from mpca.runtime.broadcasts import Broadcasts
    from mpca.runtime.jobs import ExchangeJobs
    from mpca.runtime.pipeline import ExchangePipeline
    from mpca.runtime.roster import AgentRoster

    algorithm = MPCA(shards=1)
    rule = algorithm.driver_rule([torch.zeros(4)], agents=2)
    return ExchangePipeline(ExchangeJobs(None, "r", b"s", AgentRoster([0, 1]), Codec(), executors),
                            Broadcasts(None, Codec()), rule, algorithm)


def test_with_fewer_agents_than_executors_jobs_reach_every_executor_at_once(monkeypatch):
    """One agent on two executors: the start handshake and each cycle send tasks to every executor (K tasks
    would often land on the agent-less one: a 10 s wait at start, a corrective job per cycle)."""
    from mpca.runtime.pipeline import CycleRecord as Rec

    sent, agents = [], [0]

    def fake(plan, tasks, bc, description, purpose="control"):
        sent.append((plan.op, tasks, plan.wait_for_agent_s))
        return answered(*agents)

    from mpca.runtime import control

    p = _pipeline(executors=2)
    p.roster.agents = [0]
    monkeypatch.setattr(p.jobs, "run", fake)
    monkeypatch.setattr(p.jobs, "run_parts", lambda parts, d, purpose: fake(parts[0][0], parts[0][1], None, d))
    control.hello(p.jobs, 1, 5.0, lambda: True)
    plan = p.jobs.plan("c0", "reduce")
    p.job_with_corrections(plan, None, None, "cycle 0", Rec(0, 0, None, t_submit=0.0))
    assert sent == [("hello", 4, 2.0), ("reduce", 4, 0.0)]
    sent.clear()
    agents.append(1)
    p = _pipeline(executors=2)  # two agents on two executors: exactly K tasks, as before
    monkeypatch.setattr(p.jobs, "run", fake)
    monkeypatch.setattr(p.jobs, "run_parts", lambda parts, d, purpose: fake(parts[0][0], parts[0][1], None, d))
    monkeypatch.setattr(p.roster, "track", lambda rec, result: None)
    p.job_with_corrections(plan, None, None, "cycle 0", Rec(0, 0, None, t_submit=0.0))
    assert sent[0][1] == 2


def test_a_handed_in_contribution_joins_the_next_reduction_of_its_shard_if_the_driver_rule_takes_it():
    """A leaving agent's last contribution (sync: its model, weight 1) is added to the reduction staged next —
    (2, 2) from the exchange and (4, 6) handed in average to (3, 4) — and one of another round is dropped."""
    import torch

    from mpca.algorithm.sync import Sync
    from mpca.runtime.broadcasts import Broadcasts
    from mpca.runtime.jobs import ExchangeJobs
    from mpca.runtime.pipeline import ExchangePipeline

    algorithm = Sync(every=5)
    rule = algorithm.driver_rule([torch.zeros(2)], agents=2)
    pipe = ExchangePipeline(ExchangeJobs(None, "r", b"s", AgentRoster([0, 1]), Codec()), Broadcasts(None, Codec()),
                            rule, algorithm)
    pipe.hand_in(1, 0, WeightedSum.of(torch.tensor([4.0, 6.0]), 1.0), {"round": 0})
    pipe.hand_in(1, 0, WeightedSum.of(torch.tensor([100.0, 100.0]), 1.0), {"round": 3})  # not this round's
    from_exchange = WeightedSum(torch.tensor([2.0, 2.0]), 1.0)
    pipe.schedule.publish = lambda shard, vec: None  # no SparkContext: nothing to broadcast with
    outcome = pipe.schedule.close(pipe.schedule.open(0), from_exchange)  # the stage phase of round 0
    assert rule.joint[0].tolist() == [3.0, 4.0] and outcome.handed_in == [1]
    outcome = pipe.schedule.close(pipe.schedule.open(1), from_exchange)
    assert rule.joint[0].tolist() == [2.0, 2.0] and outcome.handed_in == []  # taken once
    pipe.close()


def test_an_agents_error_for_the_user_is_one_line_and_any_other_fails_the_run_naming_the_agent():
    from mpca.errors import RunFailedError, UserError
    from mpca.runtime.pipeline import agent_failure

    e = agent_failure(3, "labels reach 29 but the model outputs 10 classes (found in agent 3's rows)", True)
    assert type(e) is UserError and str(e).startswith("labels reach 29")
    e = agent_failure(3, "training failed: boom", False)
    assert type(e) is RunFailedError and str(e) == "agent 3 failed: training failed: boom"


def test_the_start_handshake_is_cancelled_the_moment_the_agents_job_ends(monkeypatch):
    """hello's tasks wait long for agents still loading data (control.HELLO_WAIT_S); when the agents' job ends
    meanwhile (an error every agent hit) the driver cancels the handshake at once and says why."""
    import threading
    import time
    import types

    from mpca.errors import RunFailedError
    from mpca.runtime import control

    p = _pipeline(executors=2)
    cancelled, waits = threading.Event(), []

    def blocked(plan, tasks, bc, description, purpose="control"):
        waits.append(plan.wait_for_agent_s)
        cancelled.wait(20)  # a Spark job whose tasks wait for agents that never listen
        raise RuntimeError("job cancelled")

    monkeypatch.setattr(p.jobs, "run", blocked)
    monkeypatch.setattr(p.jobs, "sc", types.SimpleNamespace(cancelJobGroup=lambda group: cancelled.set()))
    ended_at = time.time() + 0.5
    t = time.time()
    with pytest.raises(RunFailedError, match="ended before all agents came up: no module named team_models"):
        control.hello(p.jobs, 2, 300.0, lambda: time.time() < ended_at, lambda: "no module named team_models")
    assert time.time() - t < 3 and cancelled.is_set() and waits == [control.HELLO_WAIT_S]


def test_the_cycle_deadline_rule_against_hand_computed_values():
    """cluster.cycle_deadline_s: as set (0: never); unset, no bound before 5 cycles ended, then 2 × the bounded
    wait + 4 × the median recent cycle."""
    from mpca.exchange.presence import cycle_deadline_s

    assert cycle_deadline_s(7.5, [], 10.0) == 7.5
    assert cycle_deadline_s(0, [1.0] * 9, 2.0) is None
    assert cycle_deadline_s(None, [0.3] * 4, 2.0) is None  # 4 cycles: too few to tell a slow cycle
    assert cycle_deadline_s(None, [0.2, 0.3, 0.25, 9.0, 0.3], 2.0) == pytest.approx(2 * 2.0 + 4 * 0.3)
    roster = AgentRoster([0, 1])  # the bounded wait: 5 × the median cycle within 2-10 s
    for took in (1.0, 1.0, 1.2, 1.0, 1.0):
        roster.cycle_took(took)
    assert roster.wait_s() == 5.0 and roster.cycle_deadline_s(None) == pytest.approx(2 * 5.0 + 4 * 1.0)


def test_a_resumed_driver_sets_a_cycle_deadline_from_its_first_cycle_with_the_checkpoint_s_cycle_times():
    """The fault campaign's run 14: a resumed driver's first cycle, submitted while an agent's link was cut, took
    109 s, because no deadline holds before 5 cycles of a driver have ended.  A checkpoint keeps the last cycles'
    durations; the resumed roster takes them as its own, so its first cycle has the deadline (and the bounded
    wait) of the cycles before the restart."""
    before = AgentRoster([0, 1])
    for took in (0.3, 0.4, 0.35, 0.3, 0.5, 0.35):
        before.cycle_took(took)
    kept = before.recent_cycles_s()
    assert kept == [0.3, 0.4, 0.35, 0.3, 0.5, 0.35]
    assert AgentRoster([0, 1]).cycle_deadline_s(None) is None  # a fresh driver: no bound yet
    resumed = AgentRoster([0, 1])
    resumed.resume_cycles(kept)
    assert resumed.wait_s() == 2.0  # 5 x 0.35 s, within 2-10 s
    assert resumed.cycle_deadline_s(None) == pytest.approx(2 * 2.0 + 4 * 0.35)
    nothing = AgentRoster([0, 1])
    nothing.resume_cycles(None)  # a checkpoint of an older version, or none
    assert nothing.cycle_deadline_s(None) is None and nothing.wait_s() == 10.0


def test_the_derived_cycle_deadline_doubles_for_each_cycle_abandoned_in_a_row():
    """An abandoned cycle's time never enters the statistics, so cycles that all run slower than the deadline
    (cycle times resumed from a faster cluster) would be abandoned for ever: the derived deadline doubles for each
    one abandoned in a row (up to 64 x) and is itself again once a cycle ends.  A set deadline stays as set."""
    roster = AgentRoster([0, 1])
    roster.resume_cycles([0.35] * 6)
    base = 2 * 2.0 + 4 * 0.35
    assert roster.cycle_deadline_s(None) == pytest.approx(base)
    roster.cycle_abandoned()
    assert roster.cycle_deadline_s(None) == pytest.approx(2 * base)
    roster.cycle_abandoned()
    assert roster.cycle_deadline_s(None) == pytest.approx(4 * base) and roster.cycle_deadline_s(7.5) == 7.5
    for _ in range(10):
        roster.cycle_abandoned()
    assert roster.cycle_deadline_s(None) == pytest.approx(64 * base)
    roster.cycle_took(0.35)
    assert roster.cycle_deadline_s(None) == pytest.approx(base)


def test_a_cycle_past_its_deadline_is_cancelled_counts_nobody_and_the_next_cycle_goes_on(monkeypatch):
    """An exchange job held by a task that cannot start (an executor cut off: here a job that blocks until it
    is cancelled) is abandoned at the deadline: its jobs are cancelled, it counts no agent and stages nothing,
    no agent is counted absent for it, its time does not enter the cycle statistics, and the next cycle runs
    and counts both agents."""
    import threading
    import time

    import torch

    from mpca.algorithm.mpca import MPCA
    from mpca.runtime.broadcasts import Broadcasts
    from mpca.runtime.jobs import ExchangeJobs
    from mpca.runtime.pipeline import ExchangePipeline

    algorithm = MPCA(shards=1)
    rule = algorithm.driver_rule([torch.zeros(4)], agents=2)
    jobs = ExchangeJobs(None, "r", b"s", AgentRoster([0, 1]), Codec())
    pipe = ExchangePipeline(jobs, Broadcasts(None, Codec()), rule, algorithm, cycle_deadline_s=0.3)
    monkeypatch.setattr(pipe.broadcasts, "publish", lambda data: type("Held", (), {"destroy": lambda *a, **k: None})())
    cancelled = threading.Event()
    stuck = {1}

    def run_parts(parts, description, purpose):
        plan = parts[0][0]
        if plan.cycle in stuck:  # a task Spark cannot start: the job ends only when cancelled
            assert cancelled.wait(10.0)
            raise RuntimeError("Job 7 cancelled part of cancelled job group")
        rec = answered(0, 1)
        for a in (0, 1):
            rec.agents[a].weight = 1.0
        rec.partial = WeightedSum.of(torch.ones(4), 2.0)
        return rec

    monkeypatch.setattr(jobs, "run_parts", run_parts)
    monkeypatch.setattr(jobs, "cancel", cancelled.set)
    first = pipe.cycle(0)
    t0 = time.time()
    held = pipe.cycle(1)
    assert time.time() - t0 < 5.0 and cancelled.is_set()
    assert held.abandoned and held.agents == {} and held.missing == [] and held.stage_shard is None
    assert pipe.roster.absent == {} and len(pipe.roster._durations) == 1  # only cycle 0's time
    assert pipe.roster._abandoned_in_row == 1  # a derived deadline would double for the next cycle
    after = pipe.cycle(2)
    assert pipe.roster._abandoned_in_row == 0
    assert not first.abandoned and not after.abandoned and sorted(after.agents) == [0, 1]
    assert [r["abandoned"] for r in pipe.timeline.rows()] == [False, True, False]
    pipe.close()
