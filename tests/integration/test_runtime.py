"""The MPCA runtime on a real local-cluster: real agents, real Spark jobs, real data."""
import statistics

import numpy as np
import pytest
import torch

from mpca.algorithm import AlphaSchedule, BetaSchedule, GammaSchedule, JointShard, MPCAHyper, ShardLayout, WeightedSum
from mpca.algorithm.mpca import MPCA
from mpca.data.datasets import dataset_dataframe, to_dataframe
from mpca.errors import ClusterTooSmallError
from mpca.runtime import layout
from mpca.trainer import Trainer
from tests import helpers
from tests.conftest import DEFAULT_SHAPE

pytestmark = pytest.mark.cluster()


@pytest.fixture(scope="module")
def digits_fit(_spark_sessions):
    spark = _spark_sessions(DEFAULT_SHAPE)
    df = dataset_dataframe(spark, "digits")
    trainer = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                      max_cycles=30, eval_every_cycles=10, spark=spark, seed=1)
    return spark, trainer.fit(df)


def test_digits_holdout_error_far_below_chance(digits_fit):
    _, fit = digits_fit
    assert fit.cycles == 30 and fit.stop_reason == "max_cycles"
    assert fit.final.error < 0.15, fit.history  # chance is 0.9
    h = fit.history
    assert h["cycle"].iloc[0] == 0 and h["holdout_error"].iloc[0] > 0.5  # the initial model: the curve's start
    early = h[(h["cycle"] > 0) & (h["cycle"] < 10)]["cycle"].tolist()
    assert len(early) >= 3, h  # the early descent (after cycles 1, 2, 4, 8), before every 10th cycle
    assert h["samples_per_s"].iloc[1:].notna().all(), h  # a rate from the first evaluation after the start on
    errors = h[h["cycle"] >= 10]["holdout_error"].tolist()
    assert len(errors) >= 3 and errors[-1] <= errors[0] + 0.02  # no drift away once learned


def test_one_reduce_job_per_cycle_and_a_deliver_job_per_broadcast(digits_fit):
    spark, fit = digits_fit
    jobs = fit.counters.jobs
    assert jobs["cycle"] == fit.cycles
    broadcasting = [c for c in fit.timeline.cycles if c.bcast_shard is not None]
    assert jobs["deliver"] == sum(c.jobs == 2 for c in broadcasting) > 0
    # 2-core executors, cluster.exchange_jobs auto: the layout guessed from the fill's reduce-only cycles (cycle
    # 0; with overlapped staging 0 for the first broadcasting cycle, then 0 and 2), the other one measured at the
    # recheck (broadcasting cycles 17-19 of every 20)
    reduce_only = [c.t_end - c.t_submit for c in fit.timeline.cycles[:3] if c.bcast_shard is None]
    first, guess = [2 if statistics.median(r) >= layout.GUESS_S else 1 for r in (reduce_only[:1], reduce_only)]
    used = [c.jobs for c in broadcasting]
    assert used[:17] == [first] + [guess] * 16 and used[17:20] == [3 - guess] * 3, (reduce_only, used)
    group_jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(fit.counters.job_group)
    assert len(group_jobs) == jobs["cycle"] + jobs["deliver"] + jobs["correction"] + jobs["control"]


def test_the_agents_rebuild_the_initial_model_from_the_seed(digits_fit):
    _, fit = digits_fit  # its weights stayed out of the agents' task (mpca.runtime.initial)
    assert [a["initial_model"] for a in fit.agents] == ["rebuilt", "rebuilt"], fit.agents


def _executor_leftovers(sc):
    """Files of mpca runs (agent sockets, slot locks) in every executor's working directory."""
    import glob
    import os

    n = 4 * sc.defaultParallelism
    found = sc.parallelize(range(n), n).map(lambda _: sorted(glob.glob(os.path.join(os.getcwd(), "mpca-*")))).collect()
    return sorted({f for files in found for f in files})


def test_a_finished_run_leaves_no_socket_or_lock_file_on_the_executors(digits_fit):
    spark, _ = digits_fit
    assert _executor_leftovers(spark.sparkContext) == []


def test_every_broadcast_is_destroyed(digits_fit):
    _, fit = digits_fit
    b = fit.counters.broadcasts
    assert b["created"] >= fit.cycles - 2 and b["destroyed"] == b["created"]


def test_broadcast_and_reduce_of_different_shards_overlap(digits_fit):
    """MPCA's default stage: between: each cycle broadcasts the shard the previous one reduced, staged after
    that job ended and before this one was submitted (Fig. 8's overlapped staging: the deterministic test)."""
    _, fit = digits_fit
    tl = fit.timeline
    steady = tl.cycles[3:]
    assert all(c.reduce_shard != c.bcast_shard for c in steady)
    assert tl.overlap_fraction(skip=3) >= 0.5, tl.to_pandas()[["cycle", "t_submit", "bcast_end", "reduce_start", "t_end"]]
    for before, c in zip(tl.cycles[2:], steady):
        assert c.bcast_shard == before.reduce_shard == before.stage_shard and not before.stage_overlaps_job()
        assert before.t_end <= before.stage_start <= before.stage_end <= c.t_submit


def test_every_agent_contributes_once_per_cycle_with_measured_tau(digits_fit):
    _, fit = digits_fit
    for c in fit.timeline.cycles:
        assert sorted(c.agents) == [0, 1] and not c.missing
        assert all(e.extra["tau"] >= 0 and e.weight == e.extra["tau"] for e in c.agents.values())
    total_tau = {a: sum(c.agents[a].extra["tau"] for c in fit.timeline.cycles if c.reduce_shard == 0) for a in (0, 1)}
    steps = {s["agent"]: s["steps"] for s in fit.agents}
    for a in (0, 1):
        assert 0 < total_tau[a] <= steps[a]


def _replay(timeline, hyper, layout, agents):
    """What the core's rules predict for the driver's joint model, from the recorded τ."""
    targets = {a: helpers.agent_target(a) for a in agents}
    bounds = []
    off = 0
    for s in range(layout.num_shards):
        n = layout.shard_numel(s)
        bounds.append((off, off + n))
        off += n
    shards = [JointShard(torch.zeros(hi - lo, dtype=torch.float64)) for lo, hi in bounds]
    for c in timeline.cycles:
        lo, hi = bounds[c.reduce_shard]
        partial = WeightedSum(None, 0.0)
        for a, e in c.agents.items():
            partial = partial.combine(WeightedSum.of(targets[a][lo:hi], e.extra["tau"]))
        shards[c.reduce_shard].update(partial, hyper.beta(c.cycle), hyper.gamma(c.cycle), hyper.delta)
    return torch.cat([s.joint for s in shards])


@pytest.mark.parametrize("shards,cycles,stage", [(3, 12, "overlapped"), (3, 8, "between"), (2, 7, "overlapped"),
                                                 (1, 5, "overlapped")])
def test_deterministic_joint_model_matches_core_rules(spark, shards, cycles, stage):
    """S = 3 (Fig. 8), S = 2 (Fig. 7) and S = 1 (Fig. 6), and S = 3 staged between jobs: the driver's joint
    model equals the replay, and each cycle broadcasts the shard its stage lag says."""
    hyper = MPCAHyper(alpha=AlphaSchedule(hold_cycles=1, peak=0.5, decay_cycles=3, target=0.2),
                      beta=BetaSchedule(1.0, 0.5, 4), gamma=GammaSchedule(0.0, 0.5, 3), delta=0.8)
    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.normal(size=(64, 1)).astype(np.float32), np.zeros(64, dtype=np.int64), 2)
    algorithm = MPCA(shards=shards, stage=stage, alpha=hyper.alpha, beta=hyper.beta, gamma=hyper.gamma,
                     delta=hyper.delta)
    fit = Trainer(helpers.fixed_point_model, helpers.half_squared_norm, helpers.sgd_one, agents=2,
                  algorithm=algorithm, input_shape=(1,), batch_size=8, holdout=0.0, max_cycles=cycles,
                  eval_every_cycles=100, wire="fp32", spark=spark).fit(df)  # the paper's exact exchange: a replay
    layout = ShardLayout.from_module(helpers.fixed_point_model(), shards)
    lag = 2 if shards >= 3 and stage == "overlapped" else 1
    # the shard broadcast in cycle c is the one reduced in cycle c - lag; the first reduction is broadcast by
    # cycle 1 whatever S (the pipeline's fill), so with S = 3 cycle 2 broadcasts nothing
    broadcast = [None, 0] + [None if lag == 2 and c == 2 else (c - lag) % shards for c in range(2, cycles)]
    assert [c.bcast_shard for c in fit.timeline.cycles] == broadcast
    staged = [c for c in fit.timeline.cycles[1:] if c.stage_shard is not None]  # cycle 0's: between jobs, always
    assert staged and all(c.stage_overlaps_job() == (lag == 2) for c in staged)  # Fig. 8: while the job ran
    expected = _replay(fit.timeline, hyper, layout, [0, 1])
    taus = [[e.extra["tau"] for e in c.agents.values()] for c in fit.timeline.cycles]
    assert all(sum(t) > 0 for t in taus[1:])
    assert torch.allclose(fit.model.w.detach(), expected, rtol=0, atol=1e-9), (fit.model.w, expected)
    # every broadcast reached both agents
    assert all(sorted(c.delivered) == [0, 1] for c in fit.timeline.cycles if c.bcast_shard is not None), \
        [c.delivered for c in fit.timeline.cycles]


def test_too_many_agents_fail_fast(spark):
    df = dataset_dataframe(spark, "digits")
    with pytest.raises(ClusterTooSmallError, match="cluster too small"):
        Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=3, input_shape=(1, 8, 8),
                max_cycles=1, spark=spark, executor_wait_s=1).fit(df)


def test_uneven_and_empty_partitions(spark):
    """One row for two agents: one agent has an empty partition, trains nothing, weighs 0 in Eq. 9."""
    from pyspark.ml.linalg import Vectors

    df = spark.createDataFrame([(Vectors.dense([0.5] * 64), 3)], ["features", "label"])  # an ML vector column
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  holdout=0.0, max_cycles=6, eval_every_cycles=100, spark=spark).fit(df)
    rows = sorted(s["rows"] for s in fit.agents)
    assert rows == [0, 1]
    empty = next(s["agent"] for s in fit.agents if s["rows"] == 0)
    assert all(c.agents[empty].extra["tau"] == 0 for c in fit.timeline.cycles)
    assert fit.cycles == 6


@pytest.mark.parametrize("resumed_stage", ["overlapped", "between"])
def test_checkpoint_holds_the_reduction_waiting_to_be_staged(spark, tmp_path, resumed_stage):
    """S = 3 staged overlapped (Fig. 8): a checkpoint taken after cycle c holds cycle c's reduction, not yet
    staged.  Resuming from it, with either staging, and replaying the recorded τ of cycles 0..c (first run) and
    c+1.. (second run) gives the final model."""
    import os

    from mpca.runtime.timeline import Timeline

    hyper = MPCAHyper(alpha=AlphaSchedule(hold_cycles=1, peak=0.5, decay_cycles=3, target=0.2),
                      beta=BetaSchedule(1.0, 0.5, 4), gamma=GammaSchedule(0.0, 0.5, 3), delta=0.8)
    algorithm = MPCA(shards=3, stage="overlapped", alpha=hyper.alpha, beta=hyper.beta, gamma=hyper.gamma,
                     delta=hyper.delta)
    rng = np.random.default_rng(0)
    df = to_dataframe(spark, rng.normal(size=(64, 1)).astype(np.float32), np.zeros(64, dtype=np.int64), 2)
    common = dict(agents=2, algorithm=algorithm, input_shape=(1,), batch_size=8, holdout=0.0, eval_every_cycles=100,
                  spark=spark, checkpoint_dir=str(tmp_path), checkpoint_every=5, wire="fp32")  # exact: a replay
    first = Trainer(helpers.fixed_point_model, helpers.half_squared_norm, helpers.sgd_one, max_cycles=7,
                    **common).fit(df)
    for ext in ("json", "pt"):  # resume from the mid-run checkpoint (cycle 5), not from the final one
        os.remove(tmp_path / f"ckpt-00000007.{ext}")
    from mpca import checkpoint

    assert checkpoint.latest(str(tmp_path)).pending["cycle"] == 4
    common["algorithm"] = algorithm.model_copy(update={"stage": resumed_stage})  # between: applied on resuming
    second = Trainer(helpers.fixed_point_model, helpers.half_squared_norm, helpers.sgd_one, max_cycles=10,
                     resume=True, **common).fit(df)
    assert second.first_cycle == 5 and [c.cycle for c in second.timeline.cycles] == [5, 6, 7, 8, 9]
    both = Timeline()
    for c in first.timeline.cycles[:5] + second.timeline.cycles:
        both.add(c)
    expected = _replay(both, hyper, ShardLayout.from_module(helpers.fixed_point_model(), 3), [0, 1])
    assert torch.allclose(second.model.w.detach(), expected, rtol=0, atol=1e-6), (second.model.w, expected)
