"""Each update rule against values computed by hand, plus property tests."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpca.algorithm import (
    JointShard,
    WeightedSum,
    blend,
    easgd_exchange_,
    compensated_pull_,
    elastic_pull_,
    extrapolate,
    model_average,
    reduction_weights,
    tau_weighted_reduce,
    trajectory,
)

T = lambda *v: torch.tensor(v, dtype=torch.float32)  # noqa: E731

floats = st.floats(-1e3, 1e3, allow_nan=False, width=32)


def test_tau_weighted_reduce_by_hand():
    # (1*[1,2] + 3*[5,6]) / 4 = [16/4, 20/4] = [4, 5]
    r = tau_weighted_reduce([T(1, 2), T(5, 6)], [1, 3], joint=T(0, 0))
    assert torch.equal(r, T(4, 5))


def test_tau_zero_agent_has_no_weight():
    r = tau_weighted_reduce([T(1, 2), T(100, 100), T(3, 4)], [2, 0, 2], joint=T(0, 0))
    assert torch.equal(r, T(2, 3))


def test_all_tau_zero_keeps_joint():
    r = tau_weighted_reduce([T(1, 2), T(3, 4)], [0, 0], joint=T(7, 8))
    assert torch.equal(r, T(7, 8))


def test_negative_tau_rejected():
    with pytest.raises(ValueError):
        WeightedSum.of(T(1), -1)


def test_partials_combine_like_the_whole():
    xs, taus = [T(1, 0), T(0, 1), T(2, 2)], [1, 2, 5]
    left = WeightedSum.of(xs[0], taus[0]).combine(WeightedSum.of(xs[1], taus[1]))
    tree = left.combine(WeightedSum.of(xs[2], taus[2]))
    assert tree.weight == 8
    assert torch.allclose(tree.total.float(), T(11, 12))


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=20))
def test_reduction_weights_sum_to_one(taus):
    w = reduction_weights(taus)
    if sum(taus) == 0:
        assert w == [0.0] * len(taus)
    else:
        assert math.isclose(sum(w), 1.0, rel_tol=1e-9)
        assert all(x >= 0 for x in w)


def test_blend_by_hand():
    # 0.25 * [4, 8] + 0.75 * [0, 4] = [1, 5]
    assert torch.allclose(blend(T(4, 8), T(0, 4), 0.75), T(1, 5))


@given(st.lists(floats, min_size=1, max_size=8), st.lists(floats, min_size=1, max_size=8))
def test_beta_one_replaces_joint_by_reduction(a, b):
    n = min(len(a), len(b))
    joint, red = torch.tensor(a[:n]), torch.tensor(b[:n])
    assert torch.equal(blend(joint, red, 1.0), red)
    assert torch.equal(blend(joint, red, 0.0), joint)


def test_trajectory_by_hand():
    # 0.8 * [1, 1] + 0.2 * ([3, 5] - [1, 1]) = [0.8 + 0.4, 0.8 + 0.8] = [1.2, 1.6]
    v = trajectory(T(1, 1), T(3, 5), T(1, 1), 0.8)
    assert torch.allclose(v, T(1.2, 1.6))


def test_extrapolate_by_hand():
    assert torch.allclose(extrapolate(T(1, 2), T(10, -10), 0.7), T(8, -5))


@given(st.lists(floats, min_size=1, max_size=8))
def test_gamma_zero_disables_extrapolation(a):
    x = torch.tensor(a)
    assert torch.equal(extrapolate(x, torch.full_like(x, 3.0), 0.0), x)


@given(st.floats(-10, 10), st.floats(-10, 10), st.floats(0, 2), st.integers(1, 60))
@settings(max_examples=60)
def test_extrapolation_of_constant_trajectory(x0, step, gamma, cycles):
    """Joint moves by ``step`` every cycle; ṽ converges to step·(1 - δ^n); x* = x̃ + γ ṽ."""
    delta = 0.8
    shard = JointShard(torch.tensor([x0], dtype=torch.float64))
    for n in range(1, cycles + 1):
        target = x0 + n * step
        # with beta = 1 the joint becomes exactly the reduced value
        star = shard.update(WeightedSum.of(torch.tensor([target], dtype=torch.float64), 1.0), 1.0, gamma, delta)
        v_expected = step * (1 - delta ** n)
        assert shard.joint.item() == pytest.approx(target, abs=1e-9)
        assert shard.velocity.item() == pytest.approx(v_expected, abs=1e-9)
        assert star.item() == pytest.approx(target + gamma * v_expected, abs=1e-9)


def test_joint_shard_uses_real_states_only():
    """ṽ must be built from x̃_t - x̃_{t-1}, never from the extrapolated x*."""
    s = JointShard(T(0))
    s.update(WeightedSum.of(T(10), 1), beta=1.0, gamma=1.0, delta=0.5)  # x̃=10, ṽ=5, x*=15
    assert s.joint.item() == 10 and s.velocity.item() == 5
    s.update(WeightedSum.of(T(10), 1), beta=1.0, gamma=1.0, delta=0.5)  # x̃=10, ṽ=0.5*5+0.5*0=2.5
    assert s.joint.item() == 10 and s.velocity.item() == 2.5


def test_joint_shard_with_beta_below_one_by_hand():
    """β = 0.5: x̃ ≠ R, so computing ṽ or x* from R (instead of x̃) gives other numbers.
    x̃0 = 2, ṽ0 = 1; R = (1·4 + 3·8)/4 = 7; x̃1 = 0.5·2 + 0.5·7 = 4.5 (Eq. 8);
    ṽ1 = 0.5·1 + 0.5·(4.5 − 2) = 1.75 (Eq. 4); x* = 4.5 + 2·1.75 = 8 (Eq. 5)."""
    s = JointShard(T(2), velocity=T(1))
    partial = WeightedSum.of(T(4), 1).combine(WeightedSum.of(T(8), 3))
    star = s.update(partial, beta=0.5, gamma=2.0, delta=0.5)
    assert s.joint.item() == 4.5 and s.velocity.item() == 1.75 and star.item() == 8.0


def test_the_driver_broadcasts_the_projection_and_a_replacement_starts_there():
    """MPCADriver.on_reduced returns x* (not x̃) for the broadcast; join_vectors gives x* of every shard
    (γ ≤ 1 in the schedules: the numbers of the test above with γ = 1)."""
    from mpca.algorithm.mpca import MPCA

    algo = MPCA(shards=2, delta=0.5, beta={"start": 0.5, "target": 0.5}, gamma={"start": 1.0, "target": 1.0})
    drv = algo.driver_rule([T(2), T(0)], agents=2)
    drv.shards[0].velocity = T(1)
    star = drv.on_reduced(0, 0, WeightedSum.of(T(4), 1).combine(WeightedSum.of(T(8), 3)))
    assert star.item() == 6.25 and drv.joint_vectors()[0].item() == 4.5  # broadcast x* = 4.5 + 1·1.75, keep x̃
    assert [v.item() for v in drv.join_vectors()] == [6.25, 0.0]


def test_joint_shard_no_contributions_keeps_joint():
    s = JointShard(T(3, 4), velocity=T(2, 2))
    star = s.update(WeightedSum(None, 0.0), beta=0.9, gamma=1.0, delta=0.5)
    assert torch.equal(s.joint, T(3, 4))
    assert torch.equal(s.velocity, T(1, 1))
    assert torch.equal(star, T(4, 5))


def test_elastic_pull_by_hand():
    # x - 0.25 (x - x*) with x = [4, 0], x* = [0, 8] → [3, 2]
    a, b = T(4), T(0)
    elastic_pull_([a, b], [T(0), T(8)], 0.25)
    assert a.item() == 3 and b.item() == 2


@given(st.lists(floats, min_size=1, max_size=8))
def test_alpha_zero_leaves_model_unchanged(a):
    x = torch.tensor(a)
    before = x.clone()
    elastic_pull_([x], [torch.zeros_like(x)], 0.0)
    assert torch.equal(x, before)


def test_alpha_one_moves_to_target_and_is_in_place():
    x = T(1, 2, 3)
    view = x[1:]
    elastic_pull_([view], [T(7, 9)], 1.0)
    assert torch.equal(x, T(1, 7, 9))


def test_pull_rejects_bad_alpha():
    with pytest.raises(ValueError):
        elastic_pull_([T(1)], [T(1)], 1.5)
    with pytest.raises(ValueError):
        compensated_pull_([T(1)], [T(1)], -0.1)


def test_compensated_pull_by_hand_is_eq_7_toward_a_target_that_keeps_the_agents_steps():
    # x = [5, 0], residual r = x − x̂* = [1, −4] → x̂* = [4, 4]; α = 0.25: x − 0.25 r = [4.75, 1], r = [0.75, −3]
    x, y = T(5), T(0)
    r = [T(1), T(-4)]
    compensated_pull_([x, y], r, 0.25)
    assert (x.item(), y.item()) == (4.75, 1.0) and (r[0].item(), r[1].item()) == (0.75, -3.0)
    # the same as Eq. 7 toward x̂* = [4, 4]
    a, b = T(5), T(0)
    elastic_pull_([a, b], [T(4), T(4)], 0.25)
    assert (a.item(), b.item()) == (x.item(), y.item())
    # a gradient step moves x (and x̂* with it): the next pull still closes a quarter of the residual only
    x -= 2.0
    compensated_pull_([x], r[:1], 0.25)
    assert x.item() == 2.75 - 0.1875 and r[0].item() == 0.5625
    compensated_pull_([x], r[:1], 0.0)  # α = 0: nothing moves
    assert x.item() == 2.5625 and r[0].item() == 0.5625


def test_model_average_by_hand():
    assert torch.equal(model_average([T(1, 2), T(3, 6)]), T(2, 4))


def test_easgd_by_hand():
    # alpha=0.5, x=[4], c=[0]: d=4*0.5=2 → x=2, c=2 (elastic symmetry: the sum is preserved)
    x, c = T(4.0), T(0.0)
    easgd_exchange_([x], [c], 0.5)
    assert x.item() == 2 and c.item() == 2
    x, c = T(10.0), T(2.0)
    easgd_exchange_([x], [c], 0.25)  # d = 0.25 * 8 = 2
    assert x.item() == 8 and c.item() == 4


def test_stage_lag_is_two_cycles_with_three_shards_but_one_for_the_first_reduction():
    """§4.2: with S ≥ 3 a reduction is broadcast two cycles later (staged while the next job runs), with S ≤ 2
    one cycle later; the pipeline's first reduction, with no job to overlap its staging, one cycle later."""
    from mpca.algorithm.base import DriverRule

    def rule(shards):
        return DriverRule([torch.zeros(2) for _ in range(shards)], agents=2)

    assert [rule(s).stage_lag() for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert [rule(s).stage_lag(first=True) for s in (1, 2, 3, 4)] == [1, 1, 1, 1]


def test_mpca_staged_between_jobs_broadcasts_every_reduction_one_cycle_later():
    """algorithm.mpca.stage: "between" (the default) stages each reduction as its job ends, whatever S (lag 1);
    "overlapped" is Fig. 8's pipeline (lag 2 with S ≥ 3, the first reduction staged at once)."""
    from mpca.algorithm.mpca import MPCA

    def rule(shards, **stage):
        return MPCA(shards=shards, **stage).driver_rule([torch.zeros(2) for _ in range(shards)], agents=2)

    assert [rule(s).stage_lag() for s in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert [rule(s, stage="overlapped").stage_lag() for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert rule(3, stage="overlapped").stage_lag(first=True) == 1
    with pytest.raises(ValueError, match="stage"):
        MPCA(stage="later")
