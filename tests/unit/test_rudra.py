"""Rudra's parameter server (hardsync, n-softsync, async) against hand-computed values."""
import threading

import numpy as np
import pytest
import torch

from mpca.algorithm import AgentContext, ShardLayout, build_algorithm
from mpca.algorithm.rudra import RudraLearner
from tests.helpers import InProcessService


def T(*v):
    return torch.tensor(v, dtype=torch.float32)


def _server(spec, agents=2, start=(0.0,)):
    return build_algorithm(spec).driver_rule([T(*start)], agents)


def test_async_applies_every_gradient_and_measures_its_staleness():
    s = _server({"name": "rudra-async", "lr": 0.5})
    reply, w = s.serve(0, {"op": "push", "ts": 0}, T(2.0))  # σ = 0: θ = 0 − 0.5·2
    assert reply["ts"] == 1 and torch.equal(w, T(-1.0))
    reply, w = s.serve(1, {"op": "push", "ts": 0}, T(4.0))  # computed on ts 0, applied at ts 1: σ = 1
    assert reply["ts"] == 2 and torch.equal(w, T(-3.0))
    assert list(s.history) == [(1, 0.0, 0.5), (2, 1.0, 0.5)]
    with pytest.raises(ValueError, match="ahead"):
        s.serve(0, {"op": "push", "ts": 9}, T(1.0))


def test_softsync_updates_after_lambda_over_n_gradients_with_the_rate_divided_by_mean_staleness():
    s = _server({"name": "rudra-softsync", "n": 1, "lr": 0.5}, agents=2)  # c = ⌊2/1⌋ = 2 gradients per update
    reply, w = s.serve(0, {"op": "push", "ts": 0}, T(2.0))
    assert reply["ts"] == 0 and torch.equal(w, T(0.0))  # not enough gradients yet: the learner goes on
    reply, w = s.serve(1, {"op": "push", "ts": 0}, T(4.0))  # mean 3, ⟨σ⟩ = 0 → α = 0.5
    assert reply["ts"] == 1 and torch.equal(w, T(-1.5))
    s.serve(0, {"op": "push", "ts": 0}, T(2.0))  # σ = 1
    reply, w = s.serve(1, {"op": "push", "ts": 1}, T(2.0))  # σ = 0 → ⟨σ⟩ = 0.5 → α = 0.5 / max(1, 0.5)
    assert torch.equal(w, T(-2.5)) and s.history[-1] == (2, 0.5, 0.5)
    s4 = _server({"name": "rudra-softsync", "n": 2, "lr": 1.0}, agents=4)
    s4.serve(0, {"op": "push", "ts": 0}, T(1.0))
    s4.serve(1, {"op": "push", "ts": 0}, T(3.0))  # c = 2: update now
    s4.serve(2, {"op": "push", "ts": 0}, T(2.0))
    reply, w = s4.serve(3, {"op": "push", "ts": 0}, T(2.0))  # both σ = 1 → ⟨σ⟩ = 1 → α = 1
    assert torch.equal(w, T(-4.0)) and [h[1] for h in s4.history] == [0.0, 1.0]


def test_n_equal_to_lambda_is_exactly_async():
    pushes = [(0, 0, 2.0), (1, 0, 4.0), (0, 1, -1.0), (1, 1, 3.0), (0, 3, 0.5)]
    soft = _server({"name": "rudra-softsync", "n": 2, "modulate": False, "lr": 0.3})
    asyn = _server({"name": "rudra-async", "lr": 0.3})
    for a, ts, g in pushes:
        assert torch.equal(soft.serve(a, {"op": "push", "ts": ts}, T(g))[1], asyn.serve(a, {"op": "push", "ts": ts}, T(g))[1])
    assert list(soft.history) == list(asyn.history)


def test_hardsync_waits_for_every_learner_and_scales_the_rate_by_sqrt_lambda_mu_over_b():
    s = _server({"name": "rudra-hardsync", "lr": 0.5, "batch_size": 32, "reference_batch": 128})
    assert s.lr == pytest.approx(0.5 * np.sqrt(2 * 32 / 128))
    got = {}
    t = threading.Thread(target=lambda: got.setdefault(0, s.serve(0, {"op": "push", "ts": 0}, T(2.0))))
    t.start()
    t.join(0.3)
    assert t.is_alive()  # learner 0 waits for learner 1's gradient of the same timestamp
    reply, w = s.serve(1, {"op": "push", "ts": 0}, T(4.0))
    t.join(2)
    assert torch.allclose(w, T(-3.0 * s.lr)) and torch.equal(got[0][1], w) and got[0][0]["ts"] == 1
    assert s.history[-1][1] == 0.0  # σ ≡ 0
    waiting = threading.Thread(target=lambda: got.setdefault(2, s.serve(0, {"op": "push", "ts": 1}, T(1.0))))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()
    s.on_stop()  # the run ends: a learner waiting for the others takes the current weights
    waiting.join(2)
    assert not waiting.is_alive() and got[2][0]["ts"] == 1


def test_a_learner_pushes_its_gradient_and_takes_the_servers_weights_instead_of_its_own_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    layout = ShardLayout.from_module(model, 1)
    shards = layout.bind_module(model)
    server = build_algorithm({"name": "rudra-async", "lr": 0.1}).driver_rule([shards.read(0)], 2)
    ctx = AgentContext(agent_id=0, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=5.0),
                       shards=shards, device=torch.device("cpu"), lock=threading.Lock(), service=InProcessService(server))
    learner = RudraLearner(ctx)
    start = shards.read(0)
    x = torch.tensor([[1.0, 2.0]])
    loss = model(x).sum()
    loss.backward()
    grad = torch.cat([model.weight.grad.view(-1), model.bias.grad.view(-1)])
    learner.after_backward()
    ctx.optimizer.step()  # the local optimizer's step (lr 5) is overwritten by the server's weights
    learner.after_step()
    assert torch.allclose(shards.read(0), start - 0.1 * grad) and learner.ts == 1


def _mean_staleness(n: int, learners: int = 8, rounds: int = 50, seed=None) -> float:
    """λ homogeneous learners push in turn (a shuffled turn order per round when ``seed`` is given), each with
    the timestamp of the weights it pulled at its last push; the mean of ⟨σ⟩ over the updates."""
    s = _server({"name": "rudra-softsync", "n": n, "lr": 0.01}, agents=learners)
    held = {a: 0 for a in range(learners)}
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        order = rng.permutation(learners) if seed is not None else range(learners)
        for a in order:
            reply, _ = s.serve(int(a), {"op": "push", "ts": held[a]}, T(1.0))
            held[a] = reply["ts"]
    return float(np.mean([sigma for _, sigma, _ in s.history]))


def test_with_lambda_homogeneous_learners_the_mean_staleness_is_about_n():
    """Rudra's Fig. 3: ⟨σ⟩ ≈ 1 for 1-softsync, ≈ 2 for 2-softsync, ≈ λ for λ-softsync (= async).  Here, with
    λ = 8: 0.86, 1.73, 3.46, 6.93 — between n − 1 and n (an async learner misses the λ − 1 others' updates)."""
    for n in (1, 2, 4, 8):
        for seed in (None, 7):
            sigma = _mean_staleness(n, seed=seed)
            assert n - 1.1 <= sigma <= n, (n, seed, sigma)
    assert _mean_staleness(8) > _mean_staleness(4) > _mean_staleness(2) > _mean_staleness(1)


def test_a_learner_started_after_a_resume_is_not_counted_stale():
    s = _server({"name": "rudra-async", "lr": 1.0})
    s.load_state_dict({"joint": [T(0.0)], "ts": 40})
    reply, _ = s.serve(0, {"op": "push", "ts": None}, T(1.0))  # its first push, on the model it was given
    assert reply["ts"] == 41 and s.history[-1][1] == 0.0
