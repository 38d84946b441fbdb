"""The agent's side of the protocol, without Spark: claim once per token; with MPCA's agent rule, pull (Eq. 7)
before each step, τ per shard, yield resets τ, deliver swaps the pull target."""
import os
import time

import numpy as np
import pytest
import torch

from mpca.algorithm import ShardLayout
from mpca.algorithm.mpca import MPCA
from mpca.config import DataSection, EmulationSection, TrainingSection, WireSection
from mpca.runtime.agent import Agent, AgentSpec
from mpca.runtime.initial import InitialModel

FP32 = WireSection(format="fp32")  # the paper's exchange, exact: these tests check the rules' arithmetic

_SMALL = {"data": DataSection(input_shape=[3]), "training": TrainingSection(batch_size=2)}


def _frozen_sgd(params):
    return torch.optim.SGD(params, lr=0.0)  # the step changes nothing: only the pull moves the model


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _agent():
    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 2), initial=InitialModel.shipping(m),
                     algorithm=MPCA(shards=2), **_SMALL, wire=FP32)
    return Agent(spec, 0, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))


def test_claim_once_per_token():
    a = _agent()
    assert a.handle({"op": "claim", "token": "c1"}, b"")[0]["ok"]
    assert not a.handle({"op": "claim", "token": "c1"}, b"")[0]["ok"]
    assert a.handle({"op": "claim", "token": "c2"}, b"")[0]["ok"]


def test_pull_before_each_step_and_tau_per_shard():
    a = _agent()
    before = a.shards.read(0).clone()
    target = torch.zeros_like(before)
    a.handle({"op": "deliver", "shard": 0, "params": {"alpha": 0.5}}, bytearray(target.numpy().tobytes()))
    x, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    a.step(x, y)
    a.step(x, y)
    # two pulls with α = 0.5 toward 0: x · 0.25; shard 1 has no target and stays put
    assert torch.allclose(a.shards.read(0), before * 0.25)
    header, payload = a.handle({"op": "yield", "shard": 0}, b"")
    assert header["weight"] == 2 and header["extra"]["tau"] == 2 and header["steps"] == 2
    assert np.allclose(np.frombuffer(payload, dtype=np.float32), (before * 0.25).numpy())
    assert a.handle({"op": "yield", "shard": 0}, b"")[0]["weight"] == 0  # reset by the yield
    assert a.handle({"op": "yield", "shard": 1}, b"")[0]["weight"] == 2  # counted per shard


def test_bad_request_is_answered_not_fatal():
    a = _agent()
    reply, _ = a.handle({"op": "dance"}, b"")
    assert "unknown op" in reply["error"]


def test_a_non_finite_shard_is_never_yielded_and_the_agent_goes_back_to_the_joint_model():
    a = _agent()
    joint = torch.full((a.shards.layout.shard_numel(0),), 0.5)
    a.handle({"op": "deliver", "shard": 0, "params": {"alpha": 0.0}}, bytearray(joint.numpy().tobytes()))
    a.step(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with torch.no_grad():
        a.model.weight.fill_(float("nan"))  # a numerical fault between two yields
    header, payload = a.handle({"op": "yield", "shard": 0}, b"")
    assert header["weight"] == 0 and header["resets"] == 1
    assert np.all(np.frombuffer(payload, dtype=np.float32) == 0)  # nothing of the NaN goes up
    assert torch.equal(a.shards.read(0), joint)  # reset to the latest joint shard it received
    assert a.rule.tau == [0, 0] and a.rule.ctx.optimizer is a.optimizer  # counting starts over, fresh optimizer


def test_a_yield_that_read_a_non_finite_shard_does_not_reset_again_after_the_step_loop_did(monkeypatch):
    """The shard is read under the step lock and checked after it; if the training loop's own check reset the
    agent in between, the yield must not reset it a second time (seen as 3 resets for one fault on 2 cores)."""
    a = _agent()
    with torch.no_grad():
        a.model.weight.fill_(float("nan"))
    real = torch.isfinite

    def loop_resets_first(t):
        with a.lock:
            if a.resets == 0:
                a._reset("loss nan at step 50")  # the step loop, between the read and the check
        return real(t)

    import mpca.runtime.agent as agent_module

    monkeypatch.setattr(agent_module.torch, "isfinite", loop_resets_first)
    header, payload = a.handle({"op": "yield", "shard": 0}, b"")
    assert header["weight"] == 0 and a.resets == 1  # nothing of the NaN goes up, one reset for one fault


class _AffinityProbe(torch.nn.Linear):
    seen = []

    def forward(self, x):
        _AffinityProbe.seen.append(os.sched_getaffinity(0))  # the calling (training) thread's CPUs
        return super().forward(x)


def test_agent_cpus_pin_the_training_thread_only():
    import threading

    m = _AffinityProbe(3, 2)
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=lambda: _AffinityProbe(3, 2), loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 1), initial=InitialModel.shipping(m),
                     data=DataSection(input_shape=[3]), training=TrainingSection(batch_size=2, agent_cpus=[0]),
                     wire=FP32)
    a = Agent(spec, 0, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    before = os.sched_getaffinity(0)
    t = threading.Thread(target=a.train_forever)
    t.start()
    import time

    deadline = time.time() + 10
    while len(_AffinityProbe.seen) < 3 and time.time() < deadline:
        time.sleep(0.01)
    a.stop_requested = True
    t.join(5)
    assert _AffinityProbe.seen[-1] == {0} and os.sched_getaffinity(0) == before  # this thread untouched


def test_agent_channel_refuses_out_of_range_shards_and_oversized_payloads_and_keeps_serving(tmp_path):
    """An authenticated peer cannot crash the agent or make it allocate: a payload is accepted only up to the
    size the model's layout needs, and a shard number out of range gets an error reply."""
    import socket
    import threading

    from mpca.runtime.channel import PREFIX, Channel, ChannelError, listen

    a = _agent()
    a.spec.max_payload = a.spec.layout.shard_nbytes(0) + a.spec.layout.shard_nbytes(1) + 4096  # as AgentRun sets it
    path = str(tmp_path / "agent.sock")
    srv = listen(path)
    threading.Thread(target=a.serve, args=(srv,), daemon=True).start()
    try:
        ch = Channel.connect(path, b"s")
        reply, _ = ch.request({"op": "deliver", "shard": 99, "params": {}}, b"\0" * 8)
        assert "bad request" in reply["error"]
        reply, _ = ch.request({"op": "yield", "shard": -1})
        assert "bad request" in reply["error"]
        assert ch.request({"op": "hello"})[0]["agent"] == 0  # the same connection still works
        ch.close()
        big = Channel.connect(path, b"s")
        big.sock.sendall(PREFIX.pack(2, 1 << 30) + b"{}")  # announces 1 GiB: refused before any allocation
        big.sock.settimeout(5)
        with pytest.raises((ChannelError, ConnectionError, socket.timeout, OSError)):
            big.recv(timeout=5)
        big.close()
        with pytest.raises(ChannelError):
            Channel.connect(path, b"wrong secret")
        ok = Channel.connect(path, b"s")
        assert ok.request({"op": "hello"})[0]["agent"] == 0  # and the agent serves on
        ok.close()
    finally:
        a.stop_requested = True
        srv.close()


def _xy():
    return torch.ones(2, 3), torch.zeros(2, dtype=torch.long)


def test_pull_comes_before_the_gradient_step_with_a_real_learning_rate():
    """Eq. 7 then the gradient at the pulled point: x1 = x0 - α(x0 - x*); x2 = x1 - lr ∇f(x1).  With
    f = Σ out², ∇ depends on x, so pulling after the step instead gives a different x2."""
    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: (out ** 2).sum(),
                     optimizer_fn=lambda p: torch.optim.SGD(p, lr=0.1), layout=ShardLayout.from_module(m, 1),
                     initial=InitialModel.shipping(m), algorithm=MPCA(shards=1), **_SMALL, wire=FP32)
    a = Agent(spec, 0, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    x0 = [p.detach().clone() for p in a.model.parameters()]
    target = torch.zeros(a.spec.layout.shard_numel(0))
    a.handle({"op": "deliver", "shard": 0, "params": {"alpha": 0.5}}, bytearray(target.numpy().tobytes()))
    x, y = _xy()
    a.step(x, y)
    w1, b1 = (0.5 * t for t in x0)  # pulled halfway toward 0
    with torch.enable_grad():
        w, b = w1.clone().requires_grad_(), b1.clone().requires_grad_()
        ((x @ w.T + b) ** 2).sum().backward()
    expected = [w1 - 0.1 * w.grad, b1 - 0.1 * b.grad]
    for got, want in zip(a.model.parameters(), expected):
        assert torch.allclose(got, want, atol=1e-6), (got, want)


def _stepped(a, n):
    x, y = _xy()
    for _ in range(n):
        a.step(x, y)


def test_a_contribution_the_driver_did_not_count_carries_its_weight_over():
    a = _agent()
    _stepped(a, 3)
    assert a.handle({"op": "yield", "shard": 0, "cycle": 1, "counted": []}, b"")[0]["weight"] == 3
    _stepped(a, 2)
    # cycle 1's contribution was lost on the way (not in the driver's counted cycles): 3 + 2 steps now
    header, _ = a.handle({"op": "yield", "shard": 0, "cycle": 2, "counted": []}, b"")
    assert header["weight"] == 5 and header["lost"] == 1
    _stepped(a, 1)
    header, _ = a.handle({"op": "yield", "shard": 0, "cycle": 3, "counted": [2]}, b"")
    assert header["weight"] == 1 and header["lost"] == 1  # cycle 2 was counted: nothing carried over


def test_an_older_delivery_is_ignored():
    a = _agent()
    n = a.spec.layout.shard_numel(0)
    new, old = torch.full((n,), 2.0), torch.full((n,), -7.0)
    assert a.handle({"op": "deliver", "shard": 0, "cycle": 5, "params": {"alpha": 1.0}},
                    bytearray(new.numpy().tobytes()))[0] == {"ok": True}
    late = a.handle({"op": "deliver", "shard": 0, "cycle": 4, "params": {"alpha": 1.0}},
                    bytearray(old.numpy().tobytes()))[0]
    assert late.get("stale")
    _stepped(a, 1)  # α = 1 pulls shard 0 onto its target; the frozen optimizer leaves it there
    assert torch.allclose(a.shards.read(0), new)


def test_a_delivered_shard_that_is_not_finite_is_refused_and_changes_nothing():
    """The driver broadcasts finite joint models only: a shard with NaN or Inf was corrupted on the way; taking it
    would make the agent's pull target (and its reset anchor) NaN."""
    a = _agent()
    n = a.spec.layout.shard_numel(0)
    good, bad = torch.full((n,), 2.0), torch.full((n,), 2.0)
    bad[1] = float("inf")
    a.handle({"op": "deliver", "shard": 0, "cycle": 1, "params": {"alpha": 1.0}}, bytearray(good.numpy().tobytes()))
    with pytest.raises(ValueError, match="non-finite"):  # the channel server answers it as an error
        a.handle({"op": "deliver", "shard": 0, "cycle": 2, "params": {"alpha": 1.0}}, bytearray(bad.numpy().tobytes()))
    _stepped(a, 1)  # α = 1: onto the last good target
    assert torch.allclose(a.shards.read(0), good)
    assert a.handle({"op": "deliver", "shard": 0, "cycle": 2, "params": {"alpha": 1.0}},
                    bytearray(good.numpy().tobytes()))[0] == {"ok": True}  # cycle 2 was not taken: not stale


def test_a_replacement_contributes_nothing_until_it_starts_from_the_joint_model():
    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 2), initial=InitialModel.shipping(m),
                     algorithm=MPCA(shards=2), **_SMALL, wire=FP32)
    a = Agent(spec, 1, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), attempt=1)
    assert a.joining
    header, payload = a.handle({"op": "yield", "shard": 0, "cycle": 9}, b"")
    assert header["weight"] == 0 and header["joining"] and not np.frombuffer(payload, np.float32).any()
    joint = torch.arange(spec.layout.total_numel, dtype=torch.float32)
    a.handle({"op": "join", "shard": None, "cycle": 9, "params": {"alpha": 0.1}}, bytearray(joint.numpy().tobytes()))
    assert not a.joining
    got = torch.cat([a.shards.read(s) for s in range(2)])
    assert torch.equal(got, joint)  # every shard is the driver's joint model
    _stepped(a, 2)
    assert a.handle({"op": "yield", "shard": 1, "cycle": 10}, b"")[0]["weight"] == 2  # fresh τ, counted from the join


def _serving(tmp_path):
    import threading

    from mpca.runtime.channel import listen

    a = _agent()
    path = str(tmp_path / "agent.sock")
    srv = listen(path)
    threading.Thread(target=a.serve, args=(srv,), daemon=True).start()
    return a, path, srv


def test_a_replayed_handshake_is_refused(tmp_path):
    import socket

    from mpca.runtime.channel import Channel
    from tests.helpers import assert_replayed_handshake_refused

    a, path, srv = _serving(tmp_path)
    try:
        def raw():
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            return s

        assert_replayed_handshake_refused(raw, b"s")
        ok = Channel.connect(path, b"s")
        assert ok.request({"op": "hello"})[0]["agent"] == 0
        ok.close()
    finally:
        a.stop_requested = True
        srv.close()


def test_hundreds_of_idle_connections_hold_at_most_a_bounded_number_of_threads(tmp_path):
    import socket
    import threading
    import time

    from mpca.runtime.agent_server import MAX_CONNECTIONS
    from mpca.runtime.channel import Channel

    a, path, srv = _serving(tmp_path)
    before = threading.active_count()
    idle = []
    try:
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            idle.append(s)
        deadline = time.time() + 10
        while a.refused < 300 - MAX_CONNECTIONS and time.time() < deadline:
            time.sleep(0.05)
        assert a.refused == 300 - MAX_CONNECTIONS  # the rest closed at once
        assert threading.active_count() - before <= MAX_CONNECTIONS
        for s in idle:
            s.close()
        deadline = time.time() + 10
        while threading.active_count() - before > 0 and time.time() < deadline:
            time.sleep(0.05)
        ok = Channel.connect(path, b"s")
        assert ok.request({"op": "hello"})[0]["agent"] == 0  # served again once the idle peers are gone
        ok.close()
    finally:
        for s in idle:
            s.close()
        a.stop_requested = True
        srv.close()


def test_the_run_secret_never_shows_in_a_repr():
    from mpca.runtime.exchange import ExchangePlan

    a = _agent()
    secret = b"\x8f" * 32
    for obj in (ExchangePlan("r", secret, "t", "reduce"), a.spec.__class__(**{**a.spec.__dict__, "secret": secret})):
        assert repr(secret) not in repr(obj) and "secret" not in repr(obj)


def test_an_agent_the_driver_knows_as_another_process_stops_and_waits_for_the_joint_model():
    """A replacement Spark started at attempt 0 (a resubmitted stage): the driver sees a new process for the
    agent and says so in the yield; the agent contributes nothing and trains no more until it joins."""
    a = _agent()
    _stepped(a, 2)
    header, _ = a.handle({"op": "yield", "shard": 0, "cycle": 4, "rejoin": True}, b"")
    assert header["weight"] == 0 and header["joining"] and a.joining
    joint = torch.zeros(a.spec.layout.total_numel)
    a.handle({"op": "join", "shard": None, "cycle": 4, "params": {"alpha": 0.1}}, bytearray(joint.numpy().tobytes()))
    assert not a.joining and torch.equal(torch.cat([a.shards.read(s) for s in range(2)]), joint)



def test_a_batch_drawn_before_a_join_is_not_stepped_on_after_it_and_a_step_counts_in_its_own_window():
    """The training loop draws a batch, then may wait (the lock-step window closed): a join meanwhile starts the
    batch order afresh, so the old draw is dropped, not stepped on in the fresh window.  The window counts a step
    under the step lock, so a join that lands right after the step cannot count it in the fresh window."""
    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 2), initial=InitialModel.shipping(m),
                     algorithm=MPCA(shards=2), data=DataSection(input_shape=[3]),
                     training=TrainingSection(batch_size=2, lock_step=2), wire=FP32)
    a = Agent(spec, 0, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    x, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    assert a.step(x, y, a.joins) and a.steps == 1 and a.pace.gate.taken == 1  # counted by the step itself
    drawn = a.joins
    a.handle({"op": "yield", "shard": 0, "cycle": 3, "rejoin": True}, b"")  # the driver knew another process
    assert a.joining and not a.step(x, y, drawn) and a.steps == 1  # no steps until it holds the joint model
    joint = torch.zeros(spec.layout.total_numel)
    a.handle({"op": "join", "shard": None, "cycle": 3, "params": {"alpha": 0.1}}, bytearray(joint.numpy().tobytes()))
    assert a.joins == drawn + 1 and a.pace.gate.taken == 0
    assert not a.step(x, y, drawn) and a.steps == 1 and a.pace.gate.taken == 0  # drawn before the join: dropped
    assert a.step(x, y, a.joins) and a.steps == 2 and a.pace.gate.taken == 1

def _emulated_agent(step_s, device_speed=None):
    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 2), initial=InitialModel.shipping(m),
                     algorithm=MPCA(shards=2), data=DataSection(input_shape=[3]),
                     training=TrainingSection(batch_size=2),
                     emulation=EmulationSection(device_step_s=step_s, device_speed=device_speed or {}), wire=FP32)
    return Agent(spec, 0, torch.zeros(64, 3), torch.zeros(64, dtype=torch.long))


def test_an_emulated_device_pads_each_step_and_never_holds_an_exchange_request_for_the_padding():
    """device_step_s = 0.1: steps take 0.1 s (±10%), the real compute is measured, and a yield asked for
    meanwhile is answered within a few ms (the wait is outside the step lock), not after the padding."""
    import threading

    a = _emulated_agent(0.1)
    trainer = threading.Thread(target=a.train_forever, daemon=True)
    t0 = time.perf_counter()
    trainer.start()
    waits = []
    for i in range(12):
        time.sleep(0.037)
        t = time.perf_counter()
        a.handle({"op": "yield", "shard": i % 2}, b"")
        waits.append(time.perf_counter() - t)
    a.stop_requested = True
    trainer.join(5)
    per_step = (time.perf_counter() - t0) / a.steps
    assert 0.09 <= per_step <= 0.11 * (a.steps + 1) / a.steps, (per_step, a.steps)
    c = a.device_clock.counters()
    assert c["late_steps"] == 0 and 0 < c["compute_s"] < 0.02 * a.steps  # a Linear(3, 2) step: well under 20 ms
    assert c["device_idle_s"] > 0.08 * a.steps
    assert max(waits) < 0.03, waits  # never the 0.1 s padding (nor most of it)


def test_a_straggler_on_an_emulated_device_takes_t_over_speed_per_step():
    """--device-speed 1:0.5 with T = 0.1 s: the slowed agent's device takes 0.2 s per step and the optimizer does
    not sleep itself (its sleep would count as compute, make every step late, and not slow the agent)."""
    import threading

    a = _emulated_agent(0.1, device_speed={0: 0.5})
    assert a.device_clock.step_s == pytest.approx(0.2)
    trainer = threading.Thread(target=a.train_forever, daemon=True)
    t0 = time.perf_counter()
    trainer.start()
    time.sleep(1.0)
    a.stop_requested = True
    trainer.join(5)
    per_step = (time.perf_counter() - t0) / a.steps
    assert 0.18 <= per_step <= 0.22 * (a.steps + 1) / a.steps, (per_step, a.steps)
    assert a.device_clock.late_steps == 0
    assert _emulated_agent(0.1).device_clock.step_s == 0.1  # everyone else: T


def test_device_clock_counts_late_steps_and_leaves_hook_time_out_of_compute():
    from mpca.exchange.device import DeviceClock

    slept = []
    clock = DeviceClock(0.05, sleep=slept.append)
    t0 = time.perf_counter()
    started = clock.start(exchange_s=1.0)
    time.sleep(0.02)
    clock.finish(started, exchange_s=1.015)  # 15 ms of the 20+ ms were an all-reduce in a hook
    elapsed = time.perf_counter() - t0  # the sleep may overshoot on a busy machine
    assert 0.004 <= clock.compute_s <= elapsed - 0.015 and abs(slept[0] - (0.05 - clock.compute_s)) < 1e-9
    late = DeviceClock(0.001, sleep=slept.append)
    started = late.start(0.0)
    time.sleep(0.005)
    late.finish(started, 0.0)
    assert late.late_steps == 1 and len(slept) == 1 and late.device_idle_s == 0.0
    free = DeviceClock(None, sleep=slept.append)
    free.finish(free.start(0.0), 0.0)
    assert free.late_steps == 0 and len(slept) == 1  # no emulation: measured, never padded


def test_a_lossy_wire_yields_its_shard_encoded_with_error_feedback_and_decodes_deliveries():
    """wire int4: the agent's contribution goes up as int4 (block scales + nibbles), what it lost is added to
    its next contribution of that shard, and a delivered int4 projection is decoded into its anchor."""
    from mpca.algorithm.wire import Codec

    m = _model()
    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=lambda out, y: out.sum(),
                     optimizer_fn=_frozen_sgd, layout=ShardLayout.from_module(m, 1), initial=InitialModel.shipping(m),
                     algorithm=MPCA(shards=1, pull="elastic"), wire=WireSection(format="int4", block=64), **_SMALL)
    a = Agent(spec, 0, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    codec, n = Codec("int4", 64), spec.layout.shard_numel(0)
    _stepped(a, 1)
    x = a.shards.read(0).numpy()
    header, payload = a.handle({"op": "yield", "shard": 0, "cycle": 0}, b"")
    assert header["weight"] == 1 and len(payload) == codec.nbytes(n) == 4 + 4  # 8 values: one scale, 4 bytes
    lost = x - codec.decode(payload, n)
    np.testing.assert_allclose(a.feedback.residual[0], lost, atol=1e-7)
    _stepped(a, 1)
    _, again = a.handle({"op": "yield", "shard": 0, "cycle": 1}, b"")
    assert again == codec.encode(x + lost)  # the frozen step changed nothing: the same shard plus what was lost
    target = np.linspace(-1, 1, n).astype(np.float32)
    a.handle({"op": "deliver", "shard": 0, "cycle": 2, "params": {"alpha": 0.0}}, bytearray(codec.encode(target)))
    received = torch.cat([p.reshape(-1) for p in a.rule.targets[0]])  # the elastic pull's target x*
    assert torch.equal(received, torch.from_numpy(codec.decode(codec.encode(target), n)))


def _ramp_agent(rows, seen):
    m = _model()

    def loss(out, y):
        seen.append(y.clone())
        return out.sum()

    spec = AgentSpec(run_id="t", secret=b"s", model_fn=_model, loss_fn=loss, optimizer_fn=_frozen_sgd,
                     layout=ShardLayout.from_module(m, 2), initial=InitialModel.shipping(m), algorithm=MPCA(shards=2),
                     data=DataSection(input_shape=[3]), training=TrainingSection(batch_size=4), classes=None, wire=FP32)
    there = rows.ready()
    x, y = rows.view()
    return Agent(spec, 0, x[:there], y[:there], loading=rows)


def _rows_numbered(lo, hi):  # features and label: the row's number
    return np.repeat(np.arange(lo, hi, dtype=np.float32)[:, None], 3, axis=1), np.arange(lo, hi)


def _drawn_while_rows_arrive(pause_s):
    """The labels (row numbers) an agent's first 24 steps draw, its rows arriving in three chunks: the second
    ``pause_s`` after its start, the last once its steps have stopped for 0.5 s (waiting for rows)."""
    import threading

    from mpca.data.stream import LoadingRows

    rows, seen, gate = LoadingRows((3,)), [], threading.Event()

    def chunks():
        yield _rows_numbered(0, 1100)
        time.sleep(pause_s)
        yield _rows_numbered(1100, 1500)
        gate.wait(10)
        yield _rows_numbered(1500, 3000)

    rows.start(chunks(), lambda c: c)
    rows.wait(1024, timeout=5)
    a = _ramp_agent(rows, seen)
    trainer = threading.Thread(target=a.train_forever, daemon=True)
    trainer.start()
    deadline, last, still = time.time() + 20, -1, time.time()
    while time.time() - still < 0.5 and time.time() < deadline:  # until its steps stop
        time.sleep(0.01)
        if a.steps != last:
            last, still = a.steps, time.time()
    at_gate = a.steps
    report = a.report()
    gate.set()
    while a.steps < 40 and time.time() < deadline:
        time.sleep(0.01)
    a.stop_requested = True
    trainer.join(5)
    return [int(v) for y in seen[:24] for v in y], at_gate, report, a


def test_an_agent_trains_on_its_first_rows_while_the_rest_arrive_drawing_the_same_rows_whatever_their_pace():
    """Ramp step r draws from the first ramp_rows(r) rows (1,024 for steps 0-7, 2,048 for 8-15, then all
    3,000 rows in epochs once they are there); a step whose rows are not there yet waits for them."""
    drawn, at_gate, report, a = _drawn_while_rows_arrive(0.0)
    assert at_gate == 8  # ramp step 8 wants 2,048 rows; 1,500 are there until the last chunk comes
    assert report.loading is True and report.rows == 1500
    assert max(drawn[:8 * 4]) < 1024 and max(drawn[8 * 4:16 * 4]) < 2048  # the ramp's rule (batch 4)
    assert a.features.shape[0] == 3000 and a.report().loading is False and a.report().rows == 3000
    slow = _drawn_while_rows_arrive(0.3)[0]  # the second chunk later: the same rows drawn, step for step
    assert slow == drawn


def test_what_an_agent_holds_alone_on_its_executor():
    """Its GPUs or its agent slot; else, in a classic run, the executor's CPUs (one agent per executor), and in a
    Spark Connect run only its own id: a replacement that Spark placed beside another agent is not refused."""
    from mpca.runtime.agent import exclusive_slot

    assert exclusive_slot(1, ["0", "1"], None, relayed=True) == "gpu0-1"
    assert exclusive_slot(1, [], "2", relayed=False) == "cpu2"
    assert exclusive_slot(0, [], None, relayed=False) == exclusive_slot(1, [], None, relayed=False) == "cpu"
    assert exclusive_slot(0, [], None, relayed=True) != exclusive_slot(1, [], None, relayed=True)
    assert exclusive_slot(1, None, None, relayed=True) == exclusive_slot(1, None, None, relayed=True)
