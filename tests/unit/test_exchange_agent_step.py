"""An agent's step and its contribution on the wire (mpca.exchange.agent_step), as both drivers run them."""
from __future__ import annotations

import numpy as np
import torch

from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.agent_step import finite, forward_backward, optimizer_step, wire_bytes


class _Recorder:
    def __init__(self, calls):
        self.calls = calls

    def before_step(self):
        self.calls.append("before_step")

    def after_step(self):
        self.calls.append("after_step")


def test_the_hooks_come_in_the_runtimes_order():
    calls = []
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)

    class Opt(torch.optim.SGD):
        def zero_grad(self, set_to_none=True):
            calls.append("zero_grad")
            super().zero_grad(set_to_none)

        def step(self, closure=None):
            calls.append("optimizer.step")
            return super().step(closure)

    opt = Opt(model.parameters(), lr=0.5)
    rule = _Recorder(calls)

    def loss_fn(out, y):
        calls.append("forward")
        return ((out - y) ** 2).mean()

    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0]])
    loss = forward_backward(rule, model, opt, loss_fn, x, y)
    assert float(loss.detach()) == 4.0  # (1 + 2 - 1)^2
    assert model.weight.grad.tolist() == [[4.0, 8.0]]  # 2 (w.x - y) x
    optimizer_step(rule, opt)
    assert model.weight.tolist() == [[-1.0, -3.0]]  # 1 - 0.5 * grad
    assert calls == ["before_step", "zero_grad", "forward", "optimizer.step", "after_step"]


def test_a_non_finite_contribution_goes_up_as_zeros_with_no_weight():
    vec, weight, ok = finite(torch.tensor([1.0, float("nan")]), 3.0)
    assert not ok and weight == 0.0 and vec.tolist() == [0.0, 0.0]
    vec, weight, ok = finite(torch.tensor([1.0, 2.0]), 3)
    assert ok and weight == 3.0 and vec.tolist() == [1.0, 2.0]


def test_only_a_weighted_contribution_is_encoded_and_spends_the_residual():
    codec = Codec("int8", block=2)
    fb = ErrorFeedback(codec)
    v = torch.tensor([0.3, -1.0])
    raw = wire_bytes(fb, 0, v, 0.0)
    assert raw == np.array([0.3, -1.0], np.float32).tobytes() and not fb.residual  # no weight: raw, no residual
    enc = wire_bytes(fb, 0, v, 2.0)
    assert len(enc) == codec.nbytes(2) and 0 in fb.residual
    np.testing.assert_allclose(codec.decode(enc, 2) + fb.residual[0], v.numpy(), atol=1e-6)  # feedback keeps the rest
