"""Each algorithm's rules against hand-computed values, without Spark: driver rules, agent rules, registry."""
import math
import sys
import threading

import pytest
import torch

from mpca.algorithm import AgentContext, ShardLayout, WeightedSum, build_algorithm, nesterov_outer_step
from mpca.algorithm.diloco import DiLoCoDriver
from mpca.algorithm.easgd import EASGDDriver
from mpca.algorithm.mpca import MPCAAgent, MPCADriver
from mpca.algorithm.single import ObservingDriver
from mpca.algorithm.sync import SyncAgent, SyncDriver
from mpca.algorithm.diloco import DiLoCoAgent


def T(*v):
    return torch.tensor(v, dtype=torch.float64)


def _partial(*pairs):
    acc = WeightedSum(None, 0.0)
    for x, w in pairs:
        acc = acc.combine(WeightedSum.of(x, w))
    return acc


def test_nesterov_outer_step_by_hand_and_as_torch_computes_it():
    x, g1, g2 = T(1.0, 2.0), T(0.5, -1.0), T(0.1, 0.2)
    # step 1: b = g1 = (.5, -1); x ← x − 0.7 (g1 + 0.9 b) = (1, 2) − 0.7 (0.95, −1.9) = (0.335, 3.33)
    x1, b1 = nesterov_outer_step(x, g1, None, 0.7, 0.9)
    assert torch.allclose(x1, T(0.335, 3.33)) and torch.allclose(b1, T(0.5, -1.0))
    # step 2: b = 0.9 (.5, −1) + (.1, .2) = (.55, −.7); x ← x1 − 0.7 ((.1, .2) + 0.9 (.55, −.7)) = x1 − 0.7 (.595, −.43)
    x2, b2 = nesterov_outer_step(x1, g2, b1, 0.7, 0.9)
    assert torch.allclose(b2, T(0.55, -0.7)) and torch.allclose(x2, T(0.335 - 0.4165, 3.33 + 0.301))
    p = torch.nn.Parameter(x.clone())
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    for g in (g1, g2):
        p.grad = g.clone()
        opt.step()
    assert torch.allclose(p.detach(), x2)
    with pytest.raises(ValueError):
        nesterov_outer_step(x, g1, None, 0.7, 1.0)


def test_diloco_driver_steps_on_the_mean_pseudo_gradient():
    d = DiLoCoDriver([T(1.0, 2.0)], 2, lr=0.7, momentum=0.9)
    assert d.cycle_params(0) == {"round": 0}
    # pseudo-gradients (x̃ − x_i) of two agents: (0, −0.5) and (1, −1.5) → mean (0.5, −1)
    out = d.on_reduced(0, 0, _partial((T(0.0, -0.5), 1.0), (T(1.0, -1.5), 1.0)))
    assert torch.allclose(out, T(0.335, 3.33)) and torch.allclose(d.joint[0], out)
    assert d.cycle_params(1) == {"round": 1}
    state = d.state_dict()
    d2 = DiLoCoDriver([T(0.0, 0.0)], 2, 0.7, 0.9)
    d2.load_state_dict(state)
    assert torch.equal(d2.joint[0], out) and torch.equal(d2.momentum_buf, T(0.5, -1.0))


def test_sync_driver_replaces_the_joint_model_by_the_average():
    d = SyncDriver([T(9.0, 9.0)], 2)
    out = d.on_reduced(0, 0, _partial((T(1.0, 2.0), 1.0), (T(3.0, 6.0), 1.0)))
    assert torch.equal(out, T(2.0, 4.0)) and torch.equal(d.joint_vectors()[0], T(2.0, 4.0))


def test_easgd_centre_moves_by_alpha_times_the_difference():
    d = EASGDDriver([T(1.0, 1.0)], 2, alpha=0.25)
    reply, diff = d.serve(1, {"op": "easgd"}, T(5.0, -3.0))
    assert reply["ok"] and torch.allclose(diff, T(1.0, -1.0))  # α (x_i − x̃)
    assert torch.allclose(d.joint[0], T(2.0, 0.0))  # Eq. 3
    assert list(d.history) == [1] and d.exchanges == 1
    with pytest.raises(ValueError):
        d.serve(0, {"op": "easgd"}, T(1.0))
    assert build_algorithm({"name": "easgd"}).driver_rule([T(0.0)], 4).alpha == pytest.approx(0.225)  # 0.9 / K


def _one_weight_agent(pull):
    model = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(2.0)
    ctx = AgentContext(agent_id=0, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                       shards=ShardLayout.from_module(model, 1).bind_module(model), device=torch.device("cpu"))
    return MPCAAgent(ctx, pull=pull), model.weight


@pytest.mark.parametrize("pull, after", [("elastic", (3.0, 2.0)), ("compensated", (4.5, 4.25))])
def test_mpca_agent_pulls_toward_x_star_or_toward_x_star_plus_its_own_steps_since_it_contributed(pull, after):
    agent, w = _one_weight_agent(pull)
    vec, weight, extra = agent.contribution(0, {"alpha": 0.5})  # y = 2 goes up
    assert vec.tolist() == [2.0]
    with torch.no_grad():
        w.fill_(5.0)  # the agent trains on while the exchange is in flight: +3
    agent.receive(0, [T(1.0)], {"alpha": 0.5})  # x* = 1 comes back
    # elastic: 5 − 0.5 (5 − 1) = 3, then 3 − 0.5 (3 − 1) = 2;  compensated: r = y − x* = 1: 5 − 0.5 = 4.5, 4.5 − 0.25
    agent.before_step()
    first = w.item()
    agent.before_step()
    assert (first, w.item()) == after


def test_compensated_pull_without_a_contribution_behind_the_delivery_uses_the_model_as_it_is():
    agent, w = _one_weight_agent("compensated")
    agent.contribution(0, {})
    agent.receive(0, [T(1.0)], {"alpha": 1.0})  # r = y − x* = 1
    agent.before_step()
    assert w.item() == 1.0
    with torch.no_grad():
        w.fill_(3.0)
    agent.receive(0, [T(0.0)], {"alpha": 1.0})  # no new contribution: r = x − x* = 3, never the old y again
    agent.before_step()
    assert w.item() == 0.0
    agent.on_reset()  # a reset puts the model on a joint model: nothing left to pull by
    with torch.no_grad():
        w.fill_(7.0)
    agent.before_step()
    assert w.item() == 7.0
    with pytest.raises(ValueError):
        MPCAAgent(agent.ctx, pull="nearest")


def test_mpca_driver_is_eqs_9_8_4_5_and_sends_alpha():
    algo = build_algorithm({"name": "mpca", "shards": 1, "delta": 0.5, "beta": {"start": 0.5, "target": 0.5},
                            "gamma": {"start": 1.0, "target": 1.0}, "alpha": {"hold_cycles": 0, "peak": 0.3,
                                                                                "target": 0.3}})
    d = algo.driver_rule([T(0.0, 0.0)], 2)
    assert isinstance(d, MPCADriver) and d.cycle_params(0) == {"alpha": 0.3}
    # R = (1·(2,0) + 3·(2,4)) / 4 = (2, 3); x̃ = ½·0 + ½·R = (1, 1.5); ṽ = ½·(1, 1.5); x* = x̃ + ṽ
    star = d.on_reduced(0, 0, _partial((T(2.0, 0.0), 1.0), (T(2.0, 4.0), 3.0)))
    assert torch.allclose(d.joint[0], T(1.0, 1.5)) and torch.allclose(star, T(1.5, 2.25))


def test_observing_driver_keeps_the_model_and_broadcasts_nothing():
    d = ObservingDriver([T(0.0)], 1)
    assert d.on_reduced(0, 0, _partial((T(4.0), 1.0))) is None and torch.equal(d.joint[0], T(4.0))
    assert build_algorithm({"name": "single", "min_cycle_interval_s": 2.0}).cycle_interval_s == 2.0


def _ctx(model):
    layout = ShardLayout.from_module(model, 1)
    return AgentContext(agent_id=0, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                        shards=layout.bind_module(model), device=torch.device("cpu"), lock=threading.Lock())


def test_round_agent_pauses_after_every_steps_and_restarts_from_the_delivery():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    a = SyncAgent(_ctx(model), every=2)
    a.after_step()
    a.between_steps()  # 1 of 2 steps: returns at once
    with pytest.raises(TimeoutError):
        a.yield_ready(0, {"round": 0}, 0.05)  # round 0 not finished
    a.after_step()
    a.yield_ready(0, {"round": 0}, 0.05)
    blocked = threading.Thread(target=a.between_steps)
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # the training loop waits for the average
    avg = torch.arange(3, dtype=torch.float32)
    a.receive(0, a.ctx.shards.split(0, avg), {"round": 1})
    blocked.join(2)
    assert not blocked.is_alive() and torch.equal(a.ctx.shards.read(0), avg)
    vec, weight, extra = a.contribution(0, {"round": 1})
    assert weight == 1.0 and extra["round"] == 1 and extra["round_steps"] == 0


def test_diloco_agent_sends_start_of_round_minus_local_model():
    model = torch.nn.Linear(2, 1)
    a = DiLoCoAgent(_ctx(model), every=1)
    start = a.ctx.shards.read(0)
    with torch.no_grad():
        model.weight += 1.0
    vec, weight, _ = a.contribution(0, {"round": 0})
    assert torch.allclose(vec, torch.tensor([-1.0, -1.0, 0.0])) and weight == 1.0
    new = start + 5
    a.receive(0, a.ctx.shards.split(0, new), {"round": 1})
    assert torch.equal(a.round_start, new)  # the next pseudo-gradient is measured from the delivered model


@pytest.mark.parametrize("cls", [SyncAgent, DiLoCoAgent])
def test_a_replacement_enters_the_drivers_current_round_and_keeps_its_steps(cls):
    """A replacement agent (round 0) joins in the driver's round 7: it yields round 7, not 1; the cycle's
    delivery of round 7 (the model its join handed it) does not restart the round under it."""
    a = cls(_ctx(torch.nn.Linear(2, 1)), every=2)
    joint = torch.arange(3, dtype=torch.float32)
    a.receive(0, a.ctx.shards.split(0, joint), {"round": 7})  # the join
    with torch.no_grad():
        a.ctx.model.bias += 1.0  # a step
    a.after_step()
    a.receive(0, a.ctx.shards.split(0, joint), {"round": 7})  # the same model again, with the cycle
    assert a.round == 7 and a.round_steps == 1 and a.ctx.shards.read(0)[2] == 3.0
    a.after_step()
    a.yield_ready(0, {"round": 7}, 0.05)  # round 7 done: it yields at once


def test_a_leaving_round_agent_hands_in_its_round_so_far_once_and_the_driver_takes_it_only_in_that_round():
    """Decommissioning (driver-initiated rounds): nothing before a step of the round; the round so far after one;
    nothing once the round's contribution was yielded; the driver takes it only into the round it was made in."""
    a = DiLoCoAgent(_ctx(torch.nn.Linear(2, 1)), every=2)
    assert a.handed_in(0, {}) is None  # no step in round 0 yet
    with torch.no_grad():
        a.ctx.model.bias += 1.0
    a.after_step()
    vec, weight, extra = a.handed_in(0, {})
    assert vec.tolist() == [0.0, 0.0, -1.0] and weight == 1.0 and extra["round"] == 0 and extra["round_steps"] == 1
    a.after_step()
    a.yield_ready(0, {"round": 0}, 0.05)  # an exchange takes round 0
    assert a.handed_in(0, {}) is None
    driver = build_algorithm({"name": "diloco", "every": 2}).driver_rule([T(0.0)], 2)
    assert driver.takes_hand_in(0, {"round": 0}) and not driver.takes_hand_in(0, {"round": 1})
    driver.on_reduced(0, 0, _partial((T(1.0), 1.0)))  # round 0 reduced: a round-0 hand-in is late now
    assert not driver.takes_hand_in(0, {"round": 0}) and driver.takes_hand_in(0, {"round": 1})
    assert build_algorithm("mpca").driver_rule([T(0.0)], 2).takes_hand_in(0, {})  # τ weighs it, any cycle


def test_unknown_and_misconfigured_algorithms_fail_eagerly():
    with pytest.raises(ValueError, match="unknown algorithm 'adam'"):
        build_algorithm("adam")
    with pytest.raises(ValueError):
        build_algorithm({"name": "diloco", "outer_momentum": 1.0})
    with pytest.raises(ValueError, match="trains one agent"):
        build_algorithm("single").check_agents(2)


def test_settings_that_follow_k_follow_the_agents_present():
    """EASGD's default α = 0.9/K and Rudra's λ follow the membership; an explicit α does not; a hardsync update
    waiting for a learner that left is made as soon as the gradients in hand suffice."""
    easgd = build_algorithm("easgd").driver_rule([T(0.0)], 4)
    assert easgd.alpha == pytest.approx(0.225)
    easgd.on_membership(2)
    assert easgd.alpha == pytest.approx(0.45) and easgd.metrics() == {"alpha": pytest.approx(0.45)}
    fixed = build_algorithm({"name": "easgd", "alpha": 0.3}).driver_rule([T(0.0)], 4)
    fixed.on_membership(2)
    assert fixed.alpha == 0.3
    hard = build_algorithm({"name": "rudra-hardsync", "lr": 0.1, "batch_size": 32,
                            "reference_batch": 128}).driver_rule([T(1.0)], 4)
    assert hard.c == 4 and hard.lr == pytest.approx(0.1)  # α0 √(4·32/128)
    hard.pending = [(T(2.0), 0), (T(4.0), 0)]  # two of four gradients in hand, one more learner waits…
    hard.on_membership(2)  # …and two learners left: λ = 2
    assert hard.c == 2 and hard.lr == pytest.approx(0.1 * math.sqrt(0.5)) and hard.ts == 1
    assert hard.joint[0].tolist() == pytest.approx([1.0 - 0.1 * math.sqrt(0.5) * 3.0])  # θ − α·mean(g)
    soft = build_algorithm({"name": "rudra-softsync", "n": 2}).driver_rule([T(0.0)], 4)
    assert soft.c == 2
    soft.on_membership(3)
    assert soft.c == 1


def test_the_algorithm_package_exports_every_name_it_lists_and_the_registry_has_every_built_in():
    import mpca.algorithm as package
    from mpca.algorithm.registry import BUILT_IN_MODULES, names

    for name in package.__all__:
        assert getattr(package, name) is not None
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018
    assert {"mpca", "single", "sync", "easgd", "diloco", "ddp", "weaksync", "downpour"} <= set(names())
    assert all(f"mpca.algorithm.{m}" in sys.modules for m in BUILT_IN_MODULES)


def test_the_agent_initiated_algorithms_share_one_base_and_their_cycles_only_observe():
    from mpca.algorithm import ServiceAlgorithm, algorithm_names

    service = sorted(n for n in algorithm_names() if isinstance(build_algorithm(n), ServiceAlgorithm))
    assert service == sorted(n for n in algorithm_names() if build_algorithm(n).exchange == "service")
    assert {"easgd", "rudra-async", "downpour", "weaksync"} <= set(service) and "mpca" not in service
    assert all(build_algorithm(n).cycle_interval_s == 1.0 for n in service)
