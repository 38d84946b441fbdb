"""Holdout evaluation of the joint model on the driver."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EvalResult:
    error: float  # classification error in [0, 1] (nan for regression)
    loss: float


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, batch_size: int = 1024) -> EvalResult:
    model.eval()
    if x.shape[0] == 0:
        return EvalResult(float("nan"), float("nan"))
    wrong, loss_sum = 0, 0.0
    classify = not y.is_floating_point()
    for lo in range(0, x.shape[0], batch_size):
        out = model(x[lo:lo + batch_size])
        yb = y[lo:lo + batch_size]
        loss_sum += float(loss_fn(out, yb)) * yb.shape[0]
        if classify:
            wrong += int((out.argmax(dim=1) != yb).sum())
    n = x.shape[0]
    return EvalResult(wrong / n if classify else float("nan"), loss_sum / n)
