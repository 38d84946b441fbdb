"""One scripted scenario through both drivers of the exchange core (issue 56): the Spark runtime on a real
local-cluster and the simulator's virtual clock run the same schedule, partial sums, agent step, batch order and lock
step (mpca.exchange), so with ``training.lock_step`` and ``cluster.reduce: ordered`` they must log the same ordered
stage / broadcast / reduce / hand-in events and end with the same joint model, bit for bit.

The scenario: 3 agents on their own rows (a DataFrame of 3 partitions: partition a is agent a's, in order), one of
them a straggler (its emulated device at half speed), mpca in lock step and the two round-based algorithms (sync,
DiLoCo), whose rounds pace the agents by themselves — first with every agent there for a fixed number of cycles,
then in an elastic run where agent 2 comes up late and joins, and agent 1's executor is killed and its replacement
joins.  When those two come up is Spark's doing (its scheduling, its retry), which no lock step orders: the
simulator replays the membership the runtime's cycles recorded (:func:`mpca.sim.presence.replayed`), and
everything else must follow from the core.  The test goes red when either driver bypasses the core's lock step
(a broadcast taken when it arrives) or sums in another order (checked by breaking each on purpose).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from mpca.data.datasets import to_dataframe
from mpca.exchange.device import ComputeModel
from mpca.sim.presence import replayed
from mpca.sim.simulator import SimConfig, Simulator
from mpca.sim.workload import SampleWorkload
from mpca.trainer import Trainer
from pyspark import cloudpickle
from tests import helpers

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import tests/

pytestmark = pytest.mark.cluster(executors=3, cores=2)

AGENTS, ROWS, FEATURES, CLASSES = 3, 3 * 96, 12, 4
STEP_S, STRAGGLER = 0.02, {2: 0.5}  # agent 2's device takes 0.04 s a step
CYCLES, BATCH = 7, 16
SCENARIOS = {  # algorithm settings, training.lock_step
    "mpca": ({"name": "mpca"}, 4),
    "sync": ({"name": "sync", "every": 4}, None),
    "diloco": ({"name": "diloco", "every": 4}, None),
}


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def cross_entropy(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def rows(n: int, seed: int):
    gen = np.random.default_rng(seed)
    x = gen.standard_normal((n, FEATURES)).astype(np.float32)
    y = (x[:, :CLASSES] * np.arange(1, CLASSES + 1)).argmax(axis=1).astype(np.int64)
    return x, y


def partitions(df):
    """Each partition's rows in order, as the agent of that partition reads them."""
    parts = df.rdd.mapPartitionsWithIndex(lambda i, it: [(i, [(list(r[0]), int(r[1])) for r in it])]).collect()
    return [p for _, p in sorted(parts)]


SHAPE = (AGENTS, 2, 0, False, 1, 0)  # as the cluster mark: 3 executors of 2 cores


@pytest.fixture(scope="module")
def data(_spark_sessions):
    spark = _spark_sessions(SHAPE)
    x, y = rows(ROWS, 1)
    hx, hy = rows(64, 2)
    df = to_dataframe(spark, x, y, partitions=AGENTS)
    parts = partitions(df)
    assert [len(p) for p in parts] == [ROWS // AGENTS] * AGENTS, [len(p) for p in parts]
    px = torch.tensor(np.array([r[0] for p in parts for r in p], dtype=np.float32))
    py = torch.tensor([r[1] for p in parts for r in p], dtype=torch.int64)
    return df, to_dataframe(spark, hx, hy, partitions=1), px, py, torch.from_numpy(hx), torch.from_numpy(hy)


def run_spark(spark, df, holdout, algorithm, lock_step):
    settings = {"training": {"agents": AGENTS, "batch_size": BATCH, "lock_step": lock_step},
                "emulation": {"device_step_s": STEP_S, "device_speed": STRAGGLER},
                "algorithm": algorithm, "cluster": {"reduce": "ordered"}, "stop": {"max_cycles": CYCLES},
                "eval": {"every_cycles": None}, "progress": "off", "seed": 3}
    return Trainer(mlp, cross_entropy, sgd, settings, spark=spark).fit(df, holdout=holdout)


def run_sim(px, py, hx, hy, algorithm, lock_step, cycles=CYCLES, reduce="ordered"):
    work = SampleWorkload(mlp, cross_entropy, sgd, px, py, hx, hy, rows_per_agent=ROWS // AGENTS)
    cfg = SimConfig(algorithm=algorithm, agents=AGENTS, workload=work, batch_size=BATCH, seed=3,
                    lock_step=lock_step, reduce=reduce, max_cycles=cycles, max_virtual_s=10_000.0,
                    compute=ComputeModel(step_s=STEP_S, speeds=STRAGGLER))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each agent's task (spark.task.cpus = 1): the same kernels, the same bits
    try:
        sim = Simulator(cfg)
        start = [v.clone() for v in sim.joint_vectors()]
        result = sim.run()
    finally:
        torch.set_num_threads(threads)
    return result, start, sim.joint_vectors()


def events(log):
    return [(e.kind, e.cycle, e.shard, e.agent) for e in log]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_spark_and_the_simulator_run_the_same_scenario_to_the_same_bits(spark, data, name):
    df, holdout, px, py, hx, hy = data
    algorithm, lock_step = SCENARIOS[name]
    fit = run_spark(spark, df, holdout, algorithm, lock_step)
    sim, start, sim_joint = run_sim(px, py, hx, hy, algorithm, lock_step)
    assert fit.cycles == CYCLES and len(sim.cycles) == CYCLES
    assert events(fit.exchange_events) == events(sim.exchange_events)
    kinds = {e[0] for e in events(sim.exchange_events)}
    assert {"reduce", "broadcast", "stage"} <= kinds, kinds
    steps = [a["steps"] for a in fit.agents]  # 4 a cycle; in lock step up to a window more before the stop
    assert all(CYCLES * 4 <= n <= (CYCLES + 1) * 4 for n in steps), steps
    spark_joint = fit.driver_rule.joint_vectors()
    assert len(spark_joint) == len(sim_joint)
    for s, (a, b) in enumerate(zip(spark_joint, sim_joint)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), f"shard {s}: max |diff| {float((a - b).abs().max()):.3g}"
    assert all(not torch.equal(a, b) for a, b in zip(spark_joint, start)), \
        "the joint model never left its start: the comparison would hold for any run"


# --------------------------------------------------------------------------- agents that join late, are lost, come back
def scenario_model_fn():
    """Agent 2 comes up 12 s late (an elastic run of 2-3 agents starts without it); agent 1's executor is killed at
    its 26th forward pass (window 6 of 4 steps), and Spark's retry brings a replacement up."""
    from lab.faults import faulty

    return helpers.late_on_agent(faulty(mlp, "kill-executor", at_call=26), agent=2, seconds=12.0)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_late_join_a_loss_and_a_replacement_replayed_in_the_simulator_end_in_the_same_bits(spark, data, name):
    """The runtime's membership is Spark's (when the late agent and the replacement come up), so the simulator
    replays the cycles' record of it (mpca.sim.presence.replayed); with that, every event and every bit match."""
    df, holdout, px, py, hx, hy = data
    algorithm, lock_step = SCENARIOS[name]
    model_fn = scenario_model_fn()
    cluster = {"reduce": "ordered", "agent_wait_s": 2.0}
    if lock_step:  # the kill lands just after a cycle's broadcast, while its job ends: never abandon that cycle
        cluster["cycle_deadline_s"] = 0
    settings = {"training": {"agents": "2-3", "batch_size": BATCH, "lock_step": lock_step},
                "emulation": {"device_step_s": STEP_S, "device_speed": STRAGGLER},
                "algorithm": algorithm, "cluster": cluster,
                "stop": {"max_seconds": 70}, "eval": {"every_cycles": None}, "progress": "off", "seed": 3}
    # 70 s: the loss comes 10-15 s in, and the replacement answered 17-23 s after it here (35 s cut it off on a cold
    # machine).  A stop on the evaluations' count of agents (one every cycle) was tried and left: in 3 runs of 6 it
    # saw no drop and ran to its 120 s cap, why not known (a run that printed the count read 2, 1, 2 ... 3)
    fit = Trainer(model_fn, cross_entropy, sgd, settings, spark=spark).fit(df, holdout=holdout)
    cycles = fit.timeline.cycles
    # a cycle abandoned at its deadline counts nobody, and which agents held its broadcast when Spark cancelled it is
    # Spark's timing, which no replay carries (mpca's kill cycle was abandoned in 1 of 4 runs here); the round
    # algorithms keep the deadline, as when they passed CI
    assert not (lock_step and any(c.abandoned for c in cycles)), [c.cycle for c in cycles if c.abandoned]
    script = replayed([c.missing for c in cycles], [c.joined for c in cycles])
    joins = [(ch.agent, ch.cycle) for ch in script if ch.kind == "joined"]
    assert {a for a, _ in joins} == {1, 2}, [(c.cycle, c.missing, c.joined) for c in cycles]  # both came
    assert any(ch.kind == "lost" and ch.agent == 1 and ch.cycle > 0 for ch in script), script
    work = SampleWorkload(model_fn, cross_entropy, sgd, px, py, hx, hy, rows_per_agent=ROWS // AGENTS)
    cfg = SimConfig(algorithm=algorithm, agents=AGENTS, workload=work, batch_size=BATCH, seed=3, lock_step=lock_step,
                    reduce="ordered", max_cycles=fit.cycles, max_virtual_s=1e6, membership=script,
                    compute=ComputeModel(step_s=STEP_S, speeds=STRAGGLER))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sim = Simulator(cfg)
        result = sim.run()
    finally:
        torch.set_num_threads(threads)
    assert [(c.missing, c.joined) for c in result.cycles] == [(c.missing, c.joined) for c in cycles]
    assert events(fit.exchange_events) == events(result.exchange_events)
    for s, (a, b) in enumerate(zip(fit.driver_rule.joint_vectors(), sim.joint_vectors())):
        assert torch.equal(a, b), f"shard {s}: max |diff| {float((a - b).abs().max()):.3g}"
