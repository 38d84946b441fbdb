"""Hermans' parameter-server rules (DOWNPOUR, AGN, ADAG, DynSGD, AEASGD) against hand-computed values."""
import threading

import pytest
import torch

from mpca.algorithm import AgentContext, ShardLayout, build_algorithm
from mpca.algorithm.hermans import CommitAgent, server_update
from tests.helpers import InProcessService


def T(*v):
    return torch.tensor(v, dtype=torch.float32)


def test_each_variant_by_hand():
    c, d = T(1.0, 2.0), T(4.0, -2.0)  # centre, a commit accumulated over 2 steps
    assert torch.equal(server_update("downpour", c, d, 2, 3), T(5.0, 0.0))  # x̃ + Δ
    assert torch.equal(server_update("agn", c, d, 2, 3), T(3.0, 1.0))  # x̃ + Δ/λ
    assert torch.equal(server_update("dynsgd", c, d, 2, 3), T(2.0, 1.5))  # x̃ + Δ/(τ+1), τ = 3
    # adag: Δ/λ = (2, -1); the centre moved (0.01, 0) since the pull: scales 1/(0.01²/1e-4 + 1) = 1/2 and 1
    pulled = T(0.99, 2.0)
    got = server_update("adag", c, d, 2, 3, pulled, gamma=1e-4)
    assert torch.allclose(got, T(2.0, 1.0), atol=1e-6)
    with pytest.raises(ValueError):
        server_update("sgd", c, d, 1, 0)


def test_the_server_measures_staleness_per_worker_and_keeps_adag_pull_snapshots():
    server = build_algorithm({"name": "dynsgd"}).driver_rule([T(0.0, 0.0)], 2)
    _, c1 = server.serve(0, {"op": "commit", "accumulated": 1}, T(2.0, 2.0))  # τ = 0: + (2, 2)
    reply, c2 = server.serve(1, {"op": "commit", "accumulated": 1}, T(4.0, 0.0))  # worker 1 pulled before: τ = 1
    assert reply["staleness"] == 1 and torch.equal(c2, T(4.0, 2.0))  # + (4, 0) / 2
    _, c3 = server.serve(0, {"op": "commit", "accumulated": 1}, T(1.0, 1.0))  # worker 0 pulled c1: τ = 1
    assert torch.equal(c3, T(4.5, 2.5)) and list(server.history) == [(0, 0), (1, 1), (0, 1)]
    adag = build_algorithm({"name": "adag", "every": 1}).driver_rule([T(0.0)], 2)
    adag.serve(0, {"op": "commit", "accumulated": 1}, T(1.0))
    assert torch.equal(adag.pulled[0], T(1.0)) and torch.equal(adag.pulled[1], T(0.0))  # what each worker holds
    with pytest.raises(ValueError):
        server.serve(0, {"op": "commit"}, T(1.0))  # wrong size


def test_a_worker_commits_its_accumulated_update_every_lambda_steps_and_pulls_the_centre():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    layout = ShardLayout.from_module(model, 1)
    server = build_algorithm({"name": "agn", "every": 2}).driver_rule([layout.bind_module(model).read(0)], 2)
    ctx = AgentContext(agent_id=0, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                       shards=layout.bind_module(model), device=torch.device("cpu"), lock=threading.Lock(),
                       service=InProcessService(server), stats=lambda: {"steps": 99, "loss": 0.5})  # the agent's counters
    a = CommitAgent(ctx, every=2)
    start = ctx.shards.read(0)
    with torch.no_grad():
        model.weight += 1.0  # "two local steps" moved the weights by (1, 1)
    a.after_step()
    a.between_steps()
    assert a.commits == 0  # 1 of λ = 2 steps
    a.after_step()
    a.between_steps()
    expected = start + torch.tensor([1.0, 1.0, 0.0]) / 2  # AGN: Δ / λ
    assert a.commits == 1 and torch.allclose(server.joint[0], expected)
    assert torch.allclose(ctx.shards.read(0), expected)  # pulled


def test_aeasgd_is_easgd_with_alpha_rho_eta_and_names_follow_the_thesis():
    rule = build_algorithm({"name": "aeasgd", "rho": 5.0, "eta": 0.02}).driver_rule([T(0.0)], 2)
    assert rule.alpha == pytest.approx(0.1)
    with pytest.raises(ValueError):
        build_algorithm({"name": "aeasgd", "rho": 50.0, "eta": 0.1}).driver_rule([T(0.0)], 2)
    for name in ("downpour", "agn", "adag", "dynsgd", "aeasgd"):
        assert build_algorithm({"name": name}).exchange == "service"


def _round_robin(name: str, workers: int = 16, every: int = 10, lr: float = 0.1, commits: int = 480) -> float:
    """Thesis Fig. 3.2 / 4.4 on f(x) = ½‖x‖², deterministically: ``workers`` workers take turns; each runs
    λ = ``every`` SGD steps from the centre it pulled and commits Δ = x_λ − x_pull (staleness workers − 1)."""
    server = build_algorithm({"name": name, "every": every}).driver_rule([torch.ones(4, dtype=torch.float64)],
                                                                         workers)
    pulled = {a: server.joint[0].clone() for a in range(workers)}
    for i in range(commits):
        a = i % workers
        delta = pulled[a] * ((1 - lr) ** every - 1)  # λ steps of x ← x − η x, minus where it started
        _, pulled[a] = server.serve(a, {"op": "commit", "accumulated": every}, delta)
    return float(server.joint[0].norm())


def test_with_many_workers_accumulated_downpour_diverges_where_agn_and_adag_stay_bounded():
    start = 2.0  # ‖(1, 1, 1, 1)‖
    assert _round_robin("downpour") > 1e3 * start  # 16 stale commits of −0.65·x each: unstable
    assert _round_robin("agn") < start and _round_robin("adag") < start  # Δ/λ: bounded, converging
    assert _round_robin("downpour", workers=1) < start  # one worker: DOWNPOUR is fine


def test_agn_with_lambda_one_is_downpour_and_adag_with_no_staleness_is_plain_sgd():
    deltas = [T(0.5, -1.0), T(-0.25, 0.75), T(1.0, 1.0)]
    for staleness in (0, 2):
        c_agn = c_down = T(1.0, 2.0)
        for d in deltas:
            c_agn, c_down = server_update("agn", c_agn, d, 1, staleness), server_update("downpour", c_down, d, 1, staleness)
            assert torch.equal(c_agn, c_down)
    c = T(1.0, 2.0)
    for d in deltas:  # τ = 0: the centre has not moved since the pull, the scale is 1: x̃ + Δ/λ, SGD's step
        assert torch.equal(server_update("adag", c, d, 2, 0, pulled=c.clone()), c + d / 2)
        c = c + d / 2
