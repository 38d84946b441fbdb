"""The user's model as ``mpca plan`` sees it: built from an import path, or the teacher MLP sized to a parameter
count; the number of values it exchanges; and its step time on this host (forward, backward and an Adam step
on random input).  Errors are ValueErrors with one line (the command turns them into a UserError)."""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence, Tuple

import torch

from mpca.algorithm.sharding import ShardLayout
from mpca.models import MLP, build_model

FEATURES, CLASSES = 64, 10  # the teacher task's (conf/teacher_mlp.yaml)


def load_model(path: str) -> torch.nn.Module:
    """``package.module:factory`` called with no arguments; it must return a torch.nn.Module."""
    if path.count(":") != 1 or not all(path.partition(":")[::2]):
        raise ValueError(f"--model {path!r}: give an import path package.module:factory")
    try:
        model = build_model(path, {})
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--model {path!r} cannot be imported: {str(e).splitlines()[0]}") from None
    except TypeError as e:
        raise ValueError(f"--model {path!r}: the factory must take no arguments: {str(e).splitlines()[0]}") from None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"--model {path!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def exchanged_values(model: torch.nn.Module) -> int:
    """Values the algorithms exchange for this model: its parameters and floating-point buffers."""
    return ShardLayout.from_module(model, 1, "average").total_numel


def teacher_hidden_for(parameters: int) -> int:
    """The width h of the teacher MLP 64-h-h-10 with about ``parameters`` parameters:
    h² + (64 + 1 + 1 + 10)·h + 10 = N, rounded, at least 1."""
    if parameters < 1:
        raise ValueError(f"--parameters must be >= 1, got {parameters}")
    b = FEATURES + 2 + CLASSES
    return max(1, round((-b + math.sqrt(b * b + 4 * max(parameters - CLASSES, 0))) / 2))


def teacher_mlp_for(parameters: int) -> MLP:
    h = teacher_hidden_for(parameters)
    return MLP(FEATURES, (h, h), CLASSES)


def input_shape_of(model: torch.nn.Module) -> Tuple[int, ...]:
    """A sample's shape from the model's first layer: a Linear's in_features, or a Conv's channels with a
    32-pixel side (give ``--input-shape`` for anything else)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            return (m.in_features,)
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            return (m.in_channels,) + (32,) * (m.weight.dim() - 2)
    raise ValueError("cannot tell the model's input shape from its first layer: give --input-shape, e.g. 3,32,32")


def measure_step_s(model: torch.nn.Module, input_shape: Optional[Sequence[int]], batch_size: int,
                   steps: int = 10, warmup: int = 2) -> float:
    """One training step's CPU seconds on one core of this host, the fastest of ``steps`` (``warmup`` first): a
    forward on a random batch of ``input_shape``, a backward of the output's mean square, an Adam step.  On one
    thread and in CPU time (``time.process_time``), so that other processes on a busy host do not count (with
    two threads and a loaded host the wall time of a step came out 5-40x too long)."""
    shape = tuple(input_shape) if input_shape else input_shape_of(model)
    x = torch.randn((batch_size,) + shape)
    model.train()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = [_one_step(model, opt, x) for _ in range(warmup + steps)]
    finally:
        torch.set_num_threads(threads)
    return min(times[warmup:])


def _one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    """CPU seconds of one forward, backward and optimizer step."""
    t = time.process_time()
    opt.zero_grad(set_to_none=True)
    try:
        out = model(x)
    except Exception as e:  # noqa: BLE001 - the user's model: any error is a wrong shape or a broken model
        raise ValueError(f"the model's forward failed on a random batch of shape {tuple(x.shape)}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__} (give --input-shape)") from None
    out = out[0] if isinstance(out, (tuple, list)) else out
    out.float().pow(2).mean().backward()
    opt.step()
    return time.process_time() - t


__all__ = ["exchanged_values", "input_shape_of", "load_model", "measure_step_s", "teacher_hidden_for",
           "teacher_mlp_for"]
