"""Weak synchronization (PSP-SGD) against hand-computed values and the seed's claims that are deterministic."""
import threading
import time

import pytest
import torch
from pydantic import ValidationError

from mpca.algorithm import AgentContext, ShardLayout, build_algorithm
from mpca.algorithm.weaksync import WeakSyncWorker, block_bounds
from tests.helpers import InProcessService


def T(*v):
    return torch.tensor(v, dtype=torch.float32)


def _server(agents=2, start=(0.0, 0.0), **settings):
    return build_algorithm({"name": "weaksync", "lr": 0.5, "blocks": 2, **settings}).driver_rule([T(*start)], agents)


def _in_thread(fn, *args):
    out = {}
    th = threading.Thread(target=lambda: out.update(r=fn(*args)), daemon=True)
    th.start()
    return th, out


class _Script:
    """A stand-in for the server's random draws: which block updates the emulated slow server delays."""

    def __init__(self, *draws):
        self.draws = list(draws)

    def random(self):
        return self.draws.pop(0)


def test_blocks_cover_the_vector_contiguously():
    assert block_bounds(10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert block_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError):
        block_bounds(3, 4)


def test_an_iteration_waits_for_every_worker_and_steps_by_d_times_eta_times_the_mean():
    s = _server()  # c = k = 2, b = 100%, τ1 = τ2 = 0
    first, got = _in_thread(s.serve, 0, {"op": "push", "ts": [0, 0]}, T(1.0, 2.0))
    time.sleep(0.2)
    assert first.is_alive() and torch.equal(s.joint[0], T(0.0, 0.0))  # one of two gradients: no update yet
    reply, w = s.serve(1, {"op": "push", "ts": [0, 0]}, T(3.0, -2.0))
    first.join(5)
    # line 13 with d = 2: w − 2·η·(g0 + g1)/2 = −0.5·(4, 0)
    assert torch.equal(w, T(-2.0, 0.0)) and reply == {"ok": True, "blocks": [0, 1], "ts": [1, 1], "base": [0, 0]}
    assert got["r"][0]["ts"] == [1, 1] and list(s.history) == [(0, 1, 2), (1, 1, 2)]
    assert s.metrics() == {"block_updates": 2, "mean_d": 2.0, "dropped": 0}
    assert s.metrics()["block_updates"] == 0  # figures since the last call


def test_stale_gradient_blocks_are_dropped_and_counted_per_block():
    s = _server(agents=2, c=1)  # an iteration per gradient (τ1 = 0)
    s.serve(0, {"op": "push", "ts": [0, 0]}, T(1.0, 1.0))  # both blocks → ts 1
    assert s.ts == [1, 1] and torch.equal(s.joint[0], T(-0.5, -0.5))
    reply, w = s.serve(1, {"op": "push", "ts": [0, 1]}, T(8.0, 2.0))  # block 0 used ts 0 < 1: dropped
    assert s.dropped == 1 and torch.equal(w, T(-0.5, -1.5)) and s.ts == [1, 2]
    assert reply["blocks"] == [0, 1]  # both newer than what worker 1 used
    assert s.metrics()["dropped"] == 1
    with pytest.raises(ValueError, match="ahead"):
        s.serve(0, {"op": "push", "ts": [5, 0]}, T(1.0, 1.0))
    with pytest.raises(ValueError, match="block timestamps"):
        s.serve(0, {"op": "push", "ts": [0]}, T(1.0, 1.0))


def test_partial_push_waits_tau1_after_the_c_th_gradient_for_more():
    s = _server(agents=3, c=1, push_timeout_s=0.6)
    first, got = _in_thread(s.serve, 0, {"op": "push", "ts": [0, 0]}, T(1.0, 0.0))
    time.sleep(0.1)
    s_reply, w = s.serve(1, {"op": "push", "ts": [0, 0]}, T(1.0, 0.0))  # within τ1: aggregated too (d = 2)
    first.join(5)
    assert torch.equal(w, T(-1.0, 0.0)) and s.history[-1][2] == 2
    t0 = time.monotonic()
    s.serve(2, {"op": "push", "ts": [1, 1]}, T(2.0, 0.0))  # alone: the iteration ends τ1 after it, d = 1
    assert time.monotonic() - t0 >= 0.55 and torch.equal(s.joint[0], T(-2.0, 0.0)) and s.history[-1][2] == 1


def test_partial_pull_takes_b_of_the_blocks_and_the_worker_keeps_its_last_values_for_the_rest():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)  # two values: weight (block 0), bias (block 1)
    layout = ShardLayout.from_module(model, 1)
    shards = layout.bind_module(model)
    start = shards.read(0)
    server = build_algorithm({"name": "weaksync", "lr": 0.5, "blocks": 2, "pull_fraction": 0.5,
                              "emulate_delay_fraction": 0.5, "emulate_delay_s": 20.0}).driver_rule([start], 1)
    server.rng = _Script(0.9, 0.1)  # block 0's update is visible at once, block 1's after 20 s (a slow server)
    ctx = AgentContext(agent_id=0, agents=1, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=5.0),
                       shards=shards, device=torch.device("cpu"), lock=threading.Lock(),
                       service=InProcessService(server))
    worker = WeakSyncWorker(ctx, blocks=2)
    model(torch.tensor([[2.0]])).sum().backward()  # ∂/∂w = 2, ∂/∂b = 1
    t0 = time.monotonic()
    worker.after_backward()
    assert time.monotonic() - t0 < 5  # b = 50%: one newer block is enough, the slow one is not waited for
    ctx.optimizer.step()  # the local step (lr 5) is overwritten by what the worker holds
    worker.after_step()
    assert worker.have == [1, 0]
    assert torch.allclose(shards.read(0), start - T(0.5 * 2.0, 0.0))  # new weight, the bias kept as it was
    assert torch.allclose(server.joint[0], start - T(1.0, 0.5))  # the server did update block 1
    # the next push uses block 1 of timestamp 0 < 1: dropped, as the paper's servers do
    server.rng = _Script(0.9, 0.9)
    worker.after_backward()
    assert server.dropped == 1 and worker.have[0] == 2


def test_a_full_pull_waits_for_the_slow_block_and_tau2_bounds_the_wait_for_the_rest():
    s = _server(agents=1, emulate_delay_fraction=0.5, emulate_delay_s=0.5)
    s.rng = _Script(0.9, 0.1)
    t0 = time.monotonic()
    reply, _ = s.serve(0, {"op": "push", "ts": [0, 0]}, T(1.0, 1.0))  # b = 100%: waits for the delayed block
    assert reply["blocks"] == [0, 1] and time.monotonic() - t0 >= 0.45
    s2 = _server(agents=1, pull_fraction=0.5, pull_timeout_s=0.3, emulate_delay_fraction=0.5, emulate_delay_s=10.0)
    s2.rng = _Script(0.9, 0.1)
    t0 = time.monotonic()
    reply, values = s2.serve(0, {"op": "push", "ts": [0, 0]}, T(1.0, 1.0))  # b met at once, then τ2 for the rest
    assert reply["blocks"] == [0] and reply["ts"] == [1] and 0.25 <= time.monotonic() - t0 < 5
    assert torch.equal(values, T(-0.5))  # only the blocks sent


def test_with_c_k_b_full_and_no_timeouts_the_trajectory_is_synchronous_sgd():
    """The seed's claim: with c = k, b = 100%, τ = 0 PSP-SGD is synchronous SGD (w ← w − η·Σⱼ ∇ⱼ)."""
    torch.manual_seed(3)
    init = torch.nn.Linear(3, 1)
    batches = [[(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(6)] for _ in range(2)]
    ref = torch.nn.Linear(3, 1)
    ref.load_state_dict(init.state_dict())
    for t in range(6):  # the synchronous reference: both workers' gradients at the same weights, summed
        grads = []
        for j in range(2):
            ref.zero_grad()
            torch.nn.functional.mse_loss(ref(batches[j][t][0]), batches[j][t][1]).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for p, g0, g1 in zip(ref.parameters(), *grads):
                p -= 0.1 * (g0 + g1)
    layout = ShardLayout.from_module(init, 1)
    server = build_algorithm({"name": "weaksync", "lr": 0.1, "blocks": 2}).driver_rule(
        [layout.bind_module(init).read(0)], 2)

    def work(j):
        model = torch.nn.Linear(3, 1)
        model.load_state_dict(init.state_dict())
        ctx = AgentContext(agent_id=j, agents=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                           shards=layout.bind_module(model), device=torch.device("cpu"), lock=threading.Lock(),
                           service=InProcessService(server))
        w = WeakSyncWorker(ctx, blocks=2)
        for x, y in batches[j]:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            w.after_backward()
            ctx.optimizer.step()
            w.after_step()
        return ctx.shards.read(0)

    threads = [_in_thread(work, j) for j in range(2)]
    for th, _ in threads:
        th.join(30)
    expected = ShardLayout.from_module(ref, 1).bind_module(ref).read(0)
    assert torch.allclose(server.joint[0], expected, atol=1e-6)
    assert all(torch.allclose(out["r"], expected, atol=1e-6) for _, out in threads)  # the workers hold it too
    assert server.ts == [6, 6] and server.dropped == 0


def test_the_run_ending_releases_a_waiting_pull_and_a_lost_worker_times_out():
    s = _server()
    th, got = _in_thread(s.serve, 0, {"op": "push", "ts": [0, 0]}, T(1.0, 1.0))
    time.sleep(0.1)
    s.on_stop()
    th.join(5)
    assert not th.is_alive() and got["r"][0]["blocks"] == []
    s2 = _server()
    s2.timeout_s = 0.2
    with pytest.raises(TimeoutError, match="gone"):
        s2.serve(0, {"op": "push", "ts": [0, 0]}, T(1.0, 1.0))


def test_settings_are_checked_eagerly():
    with pytest.raises(ValueError, match="exceeds"):
        build_algorithm({"name": "weaksync", "c": 3}).driver_rule([T(0.0, 0.0, 0.0, 0.0)], 2)
    with pytest.raises(ValidationError):
        build_algorithm({"name": "weaksync", "pull_fraction": 0.0})
    with pytest.raises(ValidationError, match="go together"):
        build_algorithm({"name": "weaksync", "emulate_delay_fraction": 0.1})
    with pytest.raises(ValueError, match="blocks"):
        build_algorithm({"name": "weaksync", "blocks": 8}).driver_rule([T(0.0, 0.0)], 1)


def test_a_worker_started_after_a_resume_pushes_on_the_servers_timestamps_not_zero():
    s = _server(agents=1)
    s.load_state_dict({"joint": [T(1.0, 1.0)], "ts": [5, 7]})  # a checkpoint's server
    reply, w = s.serve(0, {"op": "push", "ts": None}, T(2.0, 2.0))  # a fresh worker: "the model I was given"
    assert s.dropped == 0 and reply["base"] == [5, 7] and reply["ts"] == [6, 8] and torch.equal(w, T(0.0, 0.0))
