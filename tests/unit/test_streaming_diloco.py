"""Streaming DiLoCo and delayed-outer-step DiLoCo against hand-computed values, without Spark: fragments, the sync
schedule, the overlap, the mix, the 4-bit outer gradients, the reduction to DiLoCo, the eager correction."""
import threading

import numpy as np
import pytest
import torch

from mpca.algorithm import AgentContext, ShardLayout, WeightedSum, build_algorithm, eager_outer_gradient, mix_
from mpca.algorithm.delayed_diloco import DelayedDiLoCoAgent
from mpca.algorithm.outer import OuterDriver
from mpca.algorithm.sharding import TensorSpec, fragment_groups
from mpca.algorithm.streaming_diloco import StreamingDiLoCoAgent, sync_offset
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.config import WireSection


def T(*v):
    return torch.tensor(v, dtype=torch.float64)


# --------------------------------------------------------------------------- fragments
def _layers(*sizes):
    """Specs of layers l0, l1, … with a weight of ``size`` values and a bias of 1 each."""
    return [TensorSpec(f"l{i}.{kind}", n if kind == "weight" else 1, torch.float32)
            for i, n in enumerate(sizes) for kind in ("weight", "bias")]


def test_strided_fragments_take_every_pth_layer_and_sequential_ones_consecutive_layers_by_bytes():
    specs = _layers(10, 10, 10, 10, 10)  # tensors 0..9: layer l is tensors 2l, 2l + 1
    assert fragment_groups(specs, 2, "strided") == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7]]
    assert fragment_groups(specs, 3, "strided") == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5]]
    # 55 values: the cuts move on once a fragment holds p/P of the bytes (18.3 and 36.7 values)
    assert fragment_groups(specs, 3, "sequential") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert fragment_groups(_layers(100, 1, 1, 1), 2, "sequential") == [[0, 1], [2, 3, 4, 5, 6, 7]]
    # a fragment keeps taking layers until it holds its share or every later fragment needs one of the rest
    assert fragment_groups(_layers(1, 1, 1, 100), 3, "sequential") == [[0, 1, 2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="fragment_layout: bytes"):
        fragment_groups(_layers(3, 3), 3, "strided")


def test_a_fragment_layout_holds_whole_layers_and_bytes_cuts_as_mpcas_shards():
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
    algo = build_algorithm({"name": "streaming_diloco", "fragments": 2})
    layout = algo.shard_layout(model)
    names = [[layout.specs[seg.tensor].name for seg in shard] for shard in layout.shards]
    assert names == [["0.weight", "0.bias", "2.weight", "2.bias"], ["1.weight", "1.bias", "3.weight", "3.bias"]]
    assert all(seg.start == 0 and seg.stop == layout.specs[seg.tensor].numel for s in layout.shards for seg in s)
    by_bytes = build_algorithm({"name": "streaming_diloco", "fragments": 2, "fragment_layout": "bytes"})
    assert by_bytes.shard_layout(model).shards == ShardLayout.from_module(model, 2).shards


# --------------------------------------------------------------------------- which fragment syncs when
def _agent(cls=StreamingDiLoCoAgent, model=None, shards=1, fragments=None, **kw):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(2, 1, bias=False).double()
    layout = ShardLayout.from_module(model, shards, fragments=fragments)
    ctx = AgentContext(agent_id=0, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                       shards=layout.bind_module(model), device=torch.device("cpu"), lock=threading.Lock())
    return cls(ctx, lr=0.7, momentum=0.9, **kw)


def test_each_fragment_syncs_every_h_steps_staggered_by_h_over_p():
    assert [sync_offset(k, 10, 3) for k in range(3)] == [3, 7, 10]
    assert [sync_offset(k, 4, 4) for k in range(4)] == [1, 2, 3, 4]
    model = torch.nn.Sequential(*[torch.nn.Linear(1, 1, bias=False).double() for _ in range(3)])
    a = _agent(model=model, shards=3, fragments="strided", every=10, overlap=0, mix=1.0)
    taken = []
    for step in range(1, 21):
        a.after_step()
        for p in range(3):
            if a.snapshots[p]:
                taken.append((step, p))
                a.contribution(p, {})
                a.receive(p, [torch.zeros(1, dtype=torch.float64)], {"versions": [step] * 3})  # τ = 0: at once
    assert taken == [(3, 0), (7, 1), (10, 2), (13, 0), (17, 1), (20, 2)]


def test_the_outer_step_is_applied_tau_steps_after_the_outer_gradient_and_waits_for_a_late_average():
    a = _agent(every=6, overlap=2, mix=1.0)  # one fragment: its outer gradient after step 6, applied at step 8
    w = a.ctx.model.weight
    with torch.no_grad():
        w.copy_(T(1.0, 2.0).reshape(1, 2))
    a.theta[0] = T(0.0, 0.0)
    for _ in range(6):
        a.after_step()
    vec, weight, _ = a.contribution(0, {})
    assert weight == 1.0 and torch.equal(vec, T(-1.0, -2.0))  # Δ = θ − x
    a.after_step()  # step 7: nothing due yet
    a.receive(0, [T(-1.0, -2.0)], {"versions": [1]})  # the average arrives during step 7
    assert torch.equal(w.detach().reshape(-1), T(1.0, 2.0)) and not a.waiting()
    a.after_step()  # step 8 = 6 + τ: θ ← θ − 0.7 (Δ̄ + 0.9 Δ̄) = 1.33 Δ̄ away, and x ← θ (α = 1)
    assert torch.allclose(w.detach().reshape(-1), T(1.33, 2.66), atol=1e-12)
    assert torch.equal(a.theta[0], w.detach().reshape(-1))
    # the next period: the average is late, so the agent waits at step 14 until it comes, then applies it
    for _ in range(6):
        a.after_step()
    assert a.waiting()
    blocked = threading.Thread(target=a.between_steps)
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()
    a.contribution(0, {})
    a.receive(0, [T(0.0, 0.0)], {"versions": [2]})
    blocked.join(2)
    assert not blocked.is_alive() and not a.waiting()


def test_the_mix_takes_alpha_of_the_outer_result_and_one_takes_it_bit_for_bit():
    local = [T(1.0, 2.0)]
    mix_(local, [T(3.0, 6.0)], 0.25)
    assert torch.equal(local[0], T(1.5, 3.0))  # 0.75 · local + 0.25 · outer
    odd = [T(0.1, 0.7)]
    mix_(odd, [T(1 / 3, 2 / 7)], 1.0)
    assert torch.equal(odd[0], T(1 / 3, 2 / 7))
    mix_(odd, [T(9.0, 9.0)], 0.0)
    assert torch.equal(odd[0], T(1 / 3, 2 / 7))
    with pytest.raises(ValueError, match="mixing factor"):
        mix_(odd, [T(0.0, 0.0)], 1.5)


def test_a_replacement_ignores_the_delivery_its_join_vectors_already_hold():
    a = _agent(every=4, overlap=1, mix=1.0)
    joint = T(5.0, 6.0)
    a.joined([[joint.reshape(1, 2)]], {"versions": [3], "fragment": 0})
    assert torch.equal(a.theta[0], joint)
    a.receive(0, [T(1.0, 1.0)], {"versions": [3]})  # the step its join held: ignored
    assert torch.equal(a.theta[0], joint) and a.pending[0] is None
    a.receive(0, [T(1.0, 1.0)], {"versions": [4]})  # a newer one: applied (it took no outer gradient: at once)
    assert torch.allclose(a.theta[0], joint - 0.7 * 1.9, atol=1e-12)  # θ − lr (Δ̄ + μ Δ̄), a fresh momentum


# --------------------------------------------------------------------------- the wire
def test_streaming_diloco_sends_four_bit_outer_gradients_with_error_feedback_unless_told_otherwise():
    streaming, diloco = build_algorithm("streaming_diloco"), build_algorithm("diloco")
    assert WireSection().resolved(streaming) == "int4" and WireSection().resolved(diloco) == "fp32"
    assert WireSection(format="fp32").resolved(streaming) == "fp32"
    codec = Codec.of(WireSection().resolved(streaming), 64, torch.float32)
    feedback = ErrorFeedback(codec)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(256).astype(np.float32) * 0.01 for _ in range(20)]
    sent = [codec.decode(feedback.encode(0, g), 256) for g in grads]
    assert len(feedback.encode(1, grads[0])) == codec.nbytes(256) == 4 * 4 + 128  # 4 bits a value, a scale a block
    step = max(np.abs(g).max() for g in grads) / 7
    one = np.abs(sent[0] - grads[0]).max()
    assert 0 < one <= step / 2 + 1e-9  # each message is off by up to half a step
    drift = np.abs(np.sum(sent, axis=0) - np.sum(grads, axis=0)).max()
    assert drift <= step  # their sum is not: what one loses the next carries


# --------------------------------------------------------------------------- DiLoCo as a special case
def test_with_one_fragment_no_overlap_alpha_one_and_fp32_it_is_diloco_bit_for_bit():
    from mpca.sim import NetworkConstants, SimConfig, Simulator
    from mpca.exchange.device import ComputeModel
    from mpca.sim.workload import TeacherWorkload

    work = TeacherWorkload(hidden=(16,), rows_per_agent=256, holdout=256, optimizer="adam", lr=0.01)

    def run(algorithm, wire=None):
        sim = Simulator(SimConfig(algorithm=algorithm, agents=2, workload=work, batch_size=16, wire=wire,
                                  compute=ComputeModel(step_s=1.0), eval_every_s=1000.0, max_virtual_s=40.0,
                                  network=NetworkConstants(link_bps=1e9)))
        sim.run()
        return sim

    diloco = run({"name": "diloco", "every": 4})
    same = run({"name": "streaming_diloco", "every": 4, "fragments": 1, "overlap": 0, "mix": 1.0}, "fp32")
    assert diloco.rule.rounds == same.rule.versions[0] >= 8
    assert torch.equal(diloco.rule.joint[0], same.rule.joint[0])
    assert all(torch.equal(a.shards.read(0), b.shards.read(0)) for a, b in zip(diloco.agents, same.agents))
    mixed = run({"name": "streaming_diloco", "every": 4, "fragments": 1, "overlap": 0, "mix": 0.5}, "fp32")
    assert not torch.equal(diloco.rule.joint[0], mixed.rule.joint[0])  # α < 1 is another algorithm


def test_the_driver_takes_the_outer_step_and_broadcasts_the_average_with_its_version():
    driver = OuterDriver([T(1.0, 1.0), T(2.0)], agents=2, lr=0.5, momentum=0.0)
    assert driver.cycle_params(4) == {"fragment": 0, "versions": [0, 0], "workers": 2.0}
    partial = WeightedSum(T(0.2, 0.4), 1.0).combine(WeightedSum(T(0.6, 0.0), 1.0))
    sent = driver.on_reduced(4, 0, partial)
    assert torch.allclose(sent, T(0.4, 0.2)) and torch.allclose(driver.joint[0], T(0.8, 0.9))
    assert driver.cycle_params(5) == {"fragment": 1, "versions": [1, 0], "workers": 2.0}
    resumed = OuterDriver([T(1.0, 1.0), T(2.0)], agents=2, lr=0.5, momentum=0.0)  # a checkpoint's cycle 7 first:
    assert [resumed.reduce_shard(c) for c in (7, 8, 9)] == [0, 1, 0]  # its fresh agents sync fragment 0 first


# --------------------------------------------------------------------------- eager updates
def test_the_eager_outer_gradient_by_hand():
    grad, term = eager_outer_gradient(T(2.0), None, None, 2.0)  # round 0: Δ_0 / M
    assert torch.equal(grad, T(1.0)) and torch.equal(term, T(1.0))
    # Δ_r / M + Δ̄_{r−1} − e_{r−1} = 1 + 3 − 0.5 (e_{r−1} = Δ_{r−1} / M = 1 / 2)
    grad, term = eager_outer_gradient(T(2.0), T(0.5), T(3.0), 2.0)
    assert torch.equal(grad, T(3.5)) and torch.equal(term, T(1.0))
    # after a join: an average but no earlier term of its own
    assert torch.equal(eager_outer_gradient(T(2.0), None, T(3.0), 2.0)[0], T(4.0))


def test_the_eager_sum_stays_exact_when_the_number_of_workers_changes():
    """lr 1, no momentum: θ_a = θ₀ − (Σ applied averages + its latest own term e_r), whatever M did.  A worker is
    lost after round 1 (M: 2 → 1) and the survivor's round-1 term must be taken back as it was added (Δ_1 / 2),
    not as Δ_1 / 1: the paper's Δ_{r−1} / M with the new M would leave Δ_1 / 2 in θ for good."""
    a = _agent(DelayedDiLoCoAgent, every=1, eager=True)
    a.lr, a.momentum = 1.0, 0.0
    a.theta[0] = T(0.0, 0.0)

    def end_round(t):
        with torch.no_grad():
            a.ctx.model.weight.fill_(t)
        a.after_step()

    end_round(4.0)  # Δ_0 = −4, e_0 = −2 (M = ctx.agents = 2): θ = 2
    assert torch.equal(a.theta[0], T(2.0, 2.0))
    own0 = a.contribution(0, {})[0]
    end_round(6.0)  # Δ_1 = 2 − 6 = −4, e_1 = −2; it waits for Δ̄_0
    a.receive(0, [(own0 + T(-6.0, -6.0)) / 2], {"versions": [1], "workers": 2.0})  # Δ̄_0 = −5
    assert torch.equal(a.theta[0], T(7.0, 7.0))  # Δ̂ = −2 − 5 + 2 = −5; θ₀ − (Δ̄_0 + e_1) = 0 − (−5 − 2)
    a.contribution(0, {})
    end_round(10.0)  # Δ_2 = 7 − 10 = −3; round 1's average holds the survivor alone: Δ̄_1 = Δ_1 = −4, M = 1
    a.receive(0, [T(-4.0, -4.0)], {"versions": [2], "workers": 1.0})
    # Δ̂ = −3 / 1 + (−4) − (−2) = −5 → θ = 12 = θ₀ − (Δ̄_0 + Δ̄_1 + e_2) = 0 − (−5 − 4 − 3); the paper's form with
    # the new M would take back −4 / 1 and leave θ at 10
    assert torch.equal(a.theta[0], T(12.0, 12.0))


def test_a_replacement_takes_the_drivers_outer_momentum_and_then_moves_as_the_agents_already_there():
    """The driver takes three outer steps (momentum 0.9); a replacement joins with its join payload; then both it
    and an agent that was there all along apply the same next averages (the outer step of Streaming DiLoCo and
    delayed DiLoCo alike, :class:`~mpca.algorithm.outer.OuterAgent`).  Their θ must be equal, bit for bit, and
    equal to the driver's joint model: without the momentum the replacement's θ stays lr μ b / (1 − μ) apart."""
    driver = OuterDriver([T(0.0, 0.0)], agents=2, lr=0.7, momentum=0.9)
    old = _agent(every=4, overlap=0, mix=1.0)  # one fragment: an average is applied as it arrives
    old.theta[0] = T(0.0, 0.0)
    means = [T(1.0, -2.0), T(0.5, 0.5), T(-1.0, 3.0), T(2.0, 1.0), T(0.25, -0.5)]
    for c, m in enumerate(means[:3]):
        driver.on_reduced(c, 0, WeightedSum(m * 2, 2.0))
        old.receive(0, [m], {"versions": [c + 1]})
    assert torch.equal(old.theta[0], driver.joint[0])
    vectors, state = old.ctx.shards.layout.split_join(driver.join_payload())
    assert torch.equal(vectors[0], driver.joint[0]) and torch.equal(state, driver.momentum_bufs[0])
    new = _agent(every=4, overlap=0, mix=1.0)
    new.joined([[vectors[0].reshape(1, 2)]], driver.cycle_params(3), state)
    assert torch.equal(new.theta[0], driver.joint[0])
    for c, m in enumerate(means[3:], start=3):
        driver.on_reduced(c, 0, WeightedSum(m * 2, 2.0))
        for a in (old, new):
            a.receive(0, [m], {"versions": [c + 1]})
    assert torch.equal(new.theta[0], old.theta[0]) and torch.equal(new.theta[0], driver.joint[0])
    unsent = _agent(every=4, overlap=0, mix=1.0)  # the same join without the driver's momentum
    unsent.joined([[vectors[0].reshape(1, 2)]], {"versions": [3], "fragment": 0})
    for m in means[3:]:
        unsent.receive(0, [m], {"versions": [5]} if m is means[-1] else {"versions": [4]})
    assert not torch.allclose(unsent.theta[0], driver.joint[0], atol=0.1)
    fresh = OuterDriver([T(0.0, 0.0)], agents=2, lr=0.7, momentum=0.9)  # before its first step: zeros, the same
    assert torch.equal(fresh.join_payload(), T(0.0, 0.0, 0.0, 0.0))


def test_two_eager_agents_take_their_own_outer_gradient_at_once_and_the_average_a_round_late():
    """Two agents, a model of one weight whose every local step sets it to t_a (t = 1, 3): by hand, with lr 1 and
    no momentum.  Round 0: Δ_a = 0 − t_a, θ_a = 0 − Δ_a / 2 = t_a / 2, so (0.5, 1.5).  Round 1: Δ_a = θ_a − t_a =
    (−0.5, −1.5); Δ̄_0 = −2; Δ̂_a = Δ_a / 2 + Δ̄_0 − Δ_{0,a} / 2 = (−0.25 − 2 + 0.5, −0.75 − 2 + 1.5) = (−1.75, −1.25);
    θ_a − Δ̂_a = (2.25, 2.75)."""
    agents = [_agent(DelayedDiLoCoAgent, every=1, eager=True) for _ in range(2)]
    for a in agents:
        a.lr, a.momentum = 1.0, 0.0
        a.theta[0] = T(0.0, 0.0)

    def step(a, t):
        with torch.no_grad():
            a.ctx.model.weight.fill_(t)
        a.after_step()

    for a, t in zip(agents, (1.0, 3.0)):
        step(a, t)
    assert [float(a.theta[0][0]) for a in agents] == [0.5, 1.5]
    own0 = [a.contribution(0, {})[0] for a in agents]
    mean0 = (own0[0] + own0[1]) / 2
    assert torch.equal(mean0, T(-2.0, -2.0))
    for a, t in zip(agents, (1.0, 3.0)):
        step(a, t)  # round 1 ends before Δ̄_0 arrives: the agent waits for it
        assert a.waiting()
        a.receive(0, [mean0], {"versions": [1], "workers": 2.0})
        assert not a.waiting()
    assert [float(a.theta[0][0]) for a in agents] == [2.25, 2.75]
    assert [float(a.ctx.model.weight.detach()[0, 0]) for a in agents] == [2.25, 2.75]  # x ← θ
    naive = _agent(DelayedDiLoCoAgent, every=1, eager=False)
    naive.theta[0] = T(0.0, 0.0)
    step(naive, 1.0)
    assert torch.equal(naive.theta[0], T(0.0, 0.0))  # without eager updates round 0 takes no step


def test_every_new_algorithm_is_registered_with_its_settings_checked():
    assert build_algorithm({"name": "streaming_diloco", "every": 30}).num_shards == 3
    with pytest.raises(ValueError, match="overlap"):
        build_algorithm({"name": "streaming_diloco", "every": 30, "overlap": 10})  # τ must stay below H / P
    with pytest.raises(ValueError, match="at least the number of fragments"):
        build_algorithm({"name": "streaming_diloco", "every": 2, "overlap": 0})
    assert build_algorithm("delayed_diloco").num_shards == 1
