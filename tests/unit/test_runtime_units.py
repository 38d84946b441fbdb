"""Runtime pieces that need no Spark: record merging, capacity checks, session kind."""
import time

import numpy as np

import pytest

from mpca.algorithm import WeightedSum
from mpca.algorithm.wire import Codec
from mpca.errors import ClusterTooSmallError, UserError
from mpca.runtime.cluster import ClusterShape, check_capacity, require_classic
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.reports import AgentReport
from mpca.runtime.roster import AgentRoster
from mpca.runtime.timeline import CycleRecord, Timeline


def _rec(agent, x, tau):
    r = ExchangeRecord()
    r.partial = WeightedSum.of(np.array(x, dtype=np.float32), tau)
    r.agents[agent] = AgentReport(agent, weight=tau)
    return r


def test_merge_is_eq9_partial_and_flags_duplicates():
    m = merge_records(merge_records(_rec(0, [1, 2], 1), _rec(1, [5, 6], 3)), ExchangeRecord())
    assert m.partial.weight == 4
    np.testing.assert_allclose(m.partial.total / m.partial.weight, [4, 5])
    assert sorted(m.agents) == [0, 1] and m.duplicates == []
    assert merge_records(m, _rec(1, [0, 0], 1)).duplicates == [1]


def test_capacity_rule_two_cores_per_agent():
    check_capacity(ClusterShape(2, 2, 0, 1), 2, use_gpus=False)
    with pytest.raises(ClusterTooSmallError, match="lower 'agents' to 2"):
        check_capacity(ClusterShape(2, 2, 0, 1), 3, use_gpus=False)
    with pytest.raises(ClusterTooSmallError):
        check_capacity(ClusterShape(4, 1, 0, 1), 1, use_gpus=False)  # no core left for exchange tasks
    check_capacity(ClusterShape(1, 8, 4, 0), 4, use_gpus=True)
    with pytest.raises(ClusterTooSmallError):
        check_capacity(ClusterShape(1, 6, 4, 0), 4, use_gpus=True)  # 4 GPUs but cores for 3 agents


class _RegisteringCluster:
    """What inspect_cluster reads of a SparkContext: the master, its conf, and executors registering one more
    each time they are counted (the driver's block manager counts as one, as in Spark)."""

    def __init__(self, master, conf, executors):
        self.master, self.conf, self.registered, self.counted = master, conf, 0, 0
        self.executors = executors
        self.defaultParallelism = 2
        self._jsc = self

    def sc(self):
        return self

    def getConf(self):
        return self.conf

    def getExecutorMemoryStatus(self):
        self.counted += 1
        self.registered = min(self.executors, self.registered + 1)
        return self

    def size(self):
        return self.registered + 1


def test_the_driver_waits_for_room_for_the_agents_not_for_one_executor_per_agent(monkeypatch):
    """Four agents on two executors of two agent slots each: the wait ends once both executors registered
    (it once waited for four executors, the whole executor_wait_s, on every start of such a cluster)."""
    from mpca.runtime import cluster

    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    slots = {"spark.executor.resource.agentslot.amount": "2"}
    sc = _RegisteringCluster("local-cluster[2,4,1024]", slots, executors=2)
    t = time.time()
    shape = cluster.inspect_cluster(sc, 4, wait_s=5.0)
    assert (shape.executors, shape.agent_slots_per_executor) == (2, 2) and time.time() - t < 1.0
    assert cluster.agent_capacity(shape, use_gpus=False) == 4
    one_each = _RegisteringCluster("local-cluster[3,2,1024]", {}, executors=3)  # one agent per executor: all three
    assert cluster.inspect_cluster(one_each, 3, wait_s=5.0).executors == 3
    few_cores = _RegisteringCluster("local-cluster[2,1,1024]", {}, executors=2)  # room for none: no wait
    assert cluster.inspect_cluster(few_cores, 2, wait_s=5.0).executors == 1 and few_cores.counted == 1


def test_spark_connect_is_refused():
    Connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    with pytest.raises(UserError, match="Spark Connect"):
        require_classic(Connect())
    from mpca.trainer import Trainer

    with pytest.raises(UserError, match="Spark Connect"):  # by the Trainer, before it touches the data
        Trainer(lambda: None, lambda o, y: o, lambda p: None, max_cycles=1, spark=Connect()).fit(df=None)


def test_overlap_is_computed_from_timestamps():
    tl = Timeline()
    a = CycleRecord(0, 0, 1, t_submit=0.0, t_end=2.0, bcast_end=1.5, reduce_start=1.0)
    b = CycleRecord(1, 1, 2, t_submit=3.0, t_end=5.0, bcast_end=3.5, reduce_start=4.0)
    tl.add(a)
    tl.add(b)
    assert a.broadcast_overlaps_reduce() and not b.broadcast_overlaps_reduce()
    assert tl.overlap_fraction(skip=0) == 0.5


def test_exchange_work_runs_niced_without_renicing_the_worker():
    import os
    import threading

    from mpca.runtime.exchange import EXCHANGE_NICENESS, run_niced

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    inner = run_niced(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert inner == EXCHANGE_NICENESS or before >= EXCHANGE_NICENESS
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    with pytest.raises(KeyError):
        run_niced(lambda: {}["x"])


def _pipeline(executors=1):
    import torch

    from mpca.algorithm.mpca import MPCA
    from mpca.runtime.pipeline import ExchangePipeline
    from mpca.runtime.roster import AgentRoster

    algorithm = MPCA(shards=1)
    rule = algorithm.driver_rule([torch.zeros(4)], agents=2)
    return ExchangePipeline(None, "r", b"s", rule, algorithm, AgentRoster([0, 1]), Codec(), executors=executors)


def _answered(*agents, joining=()):
    rec = ExchangeRecord()
    for a in agents:
        rec.agents[a] = AgentReport(agent=a, t_yield=1.0, joining=a in joining)
    return rec


def test_absent_agents_are_named_once_and_fewer_than_min_agents_fail_the_run_after_the_timeout(caplog):
    from mpca.errors import RunFailedError

    p = AgentRoster([0, 1], min_agents=2, agent_lost_timeout_s=0.3)
    rec = CycleRecord(0, 0, None, t_submit=0.0)
    p.track(rec, _answered(0))
    assert rec.missing == [1] and list(p.absent) == [1] and "agent 1 did not answer" in caplog.text
    import time

    time.sleep(0.35)
    with pytest.raises(RunFailedError, match=r"only 1 of 2 agents answered .*absent: \[1\].*min_agents=2"):
        p.track(CycleRecord(1, 0, None, t_submit=0.0), _answered(0))


def test_a_returning_agent_is_counted_again_and_a_replacement_waits_to_join():
    p = AgentRoster([0, 1], min_agents=1)
    p.track(CycleRecord(0, 0, None, t_submit=0.0), _answered(0))
    assert 1 in p.absent
    rec = CycleRecord(1, 0, None, t_submit=0.0)
    p.track(rec, _answered(0, 1, joining=[1]))
    assert not p.absent and p.joining == {1} and rec.missing == [1]  # answers, but contributes nothing yet
    assert list(p.counted()[0]) == [0, 1] and list(p.counted()[1]) == []  # only counted contributions are confirmed


def test_an_elastic_runs_later_agents_are_absent_until_they_come_then_join():
    p = AgentRoster([0, 1, 2], min_agents=1)
    p.reset([0], later=[1, 2])
    assert p.agents == [0, 1, 2] and set(p.absent) == {1, 2} and p.not_started == {1, 2}
    rec = CycleRecord(0, 0, None, t_submit=0.0)
    p.track(rec, _answered(0))
    assert rec.missing == [1, 2] and p.missing_from({0: None}) == []  # no wait, no corrective job for them
    rec = CycleRecord(1, 0, None, t_submit=0.0)
    p.track(rec, _answered(0, 2, joining=[2]))  # agent 2's task found room: it answers as a newcomer
    assert p.not_started == {1} and set(p.absent) == {1} and p.joining == {2} and rec.missing == [1, 2]


def test_agents_that_left_are_no_longer_expected():
    p = AgentRoster([0, 1, 2], min_agents=1)
    p.track(CycleRecord(0, 0, None, t_submit=0.0), _answered(0))
    p.remove([1, 2])
    assert p.agents == [0] and p.left == {1, 2} and not p.absent
    rec = CycleRecord(3, 0, None, t_submit=0.0)
    p.track(rec, _answered(0))
    assert rec.missing == [] and not p.absent  # no wait for those that left


def test_an_executor_error_is_reduced_to_its_python_exception_line():
    from mpca.runtime.agent_job import executor_cause

    msg = ("An error occurred while calling o123.collectToPython.\n: org.apache.spark.SparkException: Job aborted "
           "due to stage failure: Task 1 in stage 9.0 failed 4 times\norg.apache.spark.api.python.PythonException: "
           "Traceback (most recent call last):\n  File \"/x/worker.py\", line 1, in main\n"
           "ModuleNotFoundError: No module named 'team_models'\n\tat org.apache.spark.api.python.BasePythonRunner")
    assert executor_cause(msg) == "on an executor: ModuleNotFoundError: No module named 'team_models'"
    assert executor_cause("Job 3 cancelled\nmore") == "Job 3 cancelled"


def test_with_fewer_agents_than_executors_jobs_reach_every_executor_at_once(monkeypatch):
    """One agent on two executors: the start handshake and each cycle send tasks to every executor (K tasks
    would often land on the agent-less one: a 10 s wait at start, a corrective job per cycle)."""
    from mpca.runtime.pipeline import CycleRecord as Rec

    sent, agents = [], [0]

    def fake(plan, tasks, bc, description, purpose="control"):
        sent.append((plan.op, tasks, plan.wait_for_agent_s))
        return _answered(*agents)

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


def test_dynamic_allocation_is_refused_in_one_line_that_says_what_to_set():
    from mpca.errors import UserError
    from mpca.runtime.cluster import refuse_dynamic_allocation

    refuse_dynamic_allocation({})  # off by default
    refuse_dynamic_allocation({"spark.dynamicAllocation.enabled": "false"})
    with pytest.raises(UserError, match=r"needs spark.dynamicAllocation.enabled=false") as e:
        refuse_dynamic_allocation({"spark.dynamicAllocation.enabled": "True"})
    assert "\n" not in str(e.value)


def test_an_elastic_runs_service_agent_is_missing_until_it_first_calls():
    p = AgentRoster([0, 1], min_agents=1)
    p.reset([0], later=[1])
    p.came_up({0})
    assert p.not_started == {1} and set(p.absent) == {1}
    p.came_up({0, 1})
    assert p.not_started == set() and not p.absent


def test_a_handed_in_contribution_joins_the_next_reduction_of_its_shard_if_the_driver_rule_takes_it():
    """A leaving agent's last contribution (sync: its model, weight 1) is added to the reduction staged next —
    (2, 2) from the exchange and (4, 6) handed in average to (3, 4) — and one of another round is dropped."""
    import torch

    from mpca.algorithm.sync import Sync
    from mpca.runtime.pipeline import ExchangePipeline

    algorithm = Sync(every=5)
    rule = algorithm.driver_rule([torch.zeros(2)], agents=2)
    pipe = ExchangePipeline(None, "r", b"s", rule, algorithm, AgentRoster([0, 1]), Codec())
    pipe.hand_in(1, 0, WeightedSum.of(torch.tensor([4.0, 6.0]), 1.0), {"round": 0})
    pipe.hand_in(1, 0, WeightedSum.of(torch.tensor([100.0, 100.0]), 1.0), {"round": 3})  # not this round's
    from_exchange = WeightedSum(torch.tensor([2.0, 2.0]), 1.0)
    pipe.schedule.publish = lambda shard, vec: None  # no SparkContext: nothing to broadcast with
    outcome = pipe.schedule.close(pipe.schedule.open(0), from_exchange)  # the stage phase of round 0
    assert rule.joint[0].tolist() == [3.0, 4.0] and outcome.handed_in == [1]
    outcome = pipe.schedule.close(pipe.schedule.open(1), from_exchange)
    assert rule.joint[0].tolist() == [2.0, 2.0] and outcome.handed_in == []  # taken once
    pipe.close()


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


def test_the_rosters_bounded_wait_follows_its_cycles_or_the_setting():
    """The roster keeps the presence book's bounded wait (tests/unit/test_exchange_presence.py) on its cycles."""
    roster = AgentRoster([0, 1])
    for s in (1.0, 0.9, 1.4):
        roster.cycle_took(s)
    assert roster.wait_s() == 5.0 and AgentRoster([0], agent_wait_s=1.5).wait_s() == 1.5


def test_an_agents_error_for_the_user_is_one_line_and_any_other_fails_the_run_naming_the_agent():
    from mpca.errors import RunFailedError, UserError
    from mpca.runtime.pipeline import agent_failure

    e = agent_failure(3, "labels reach 29 but the model outputs 10 classes (found in agent 3's rows)", True)
    assert type(e) is UserError and str(e).startswith("labels reach 29")
    e = agent_failure(3, "training failed: boom", False)
    assert type(e) is RunFailedError and str(e) == "agent 3 failed: training failed: boom"


def test_an_agents_task_start_is_its_executors_clock_kept_within_what_the_drivers_clock_allows():
    """control.task_started_at: the hello job's results arrive together, at the slowest agent's answer; an agent
    that answered 3 s sooner must not read as started 3 s late (the bound received - since_start alone did)."""
    from mpca.runtime.control import task_started_at

    # submitted at 100; this agent started at 100.7 on its clock and answered 2 s later (at 102.7), the slowest
    # at 105.7, when the results came: the bound alone says 103.7
    fast = {"since_start_s": 2.0, "started_at": 100.7}
    assert task_started_at(fast, received=105.7, submitted=100.0) == 100.7
    slow = {"since_start_s": 4.0, "started_at": 101.7}  # the slowest: its bound is exact
    assert task_started_at(slow, received=105.7, submitted=100.0) == 101.7
    # an executor clock 2 s ahead cannot place the start after the bound, one behind not before the submission
    assert task_started_at({"since_start_s": 4.0, "started_at": 103.7}, received=105.7, submitted=100.0) == 101.7
    assert task_started_at({"since_start_s": 4.0, "started_at": 98.0}, received=105.7, submitted=100.0) == 100.0
    assert task_started_at({"since_start_s": 4.0}, received=105.7, submitted=100.0) == 101.7  # an older agent
    assert task_started_at({"since_start_s": 4.0, "started_at": 98.0}, received=105.7, submitted=None) == 98.0
