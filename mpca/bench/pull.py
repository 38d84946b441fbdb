"""Micro-benchmark: cost of the Eq. 7 elastic pull relative to a training step.

    python -m mpca.bench.pull [--model resnet110] [--batch 64] [--repeats 15]

Measures, in one run and on the same replica, the median time of (a) what an
MPCA agent does before every step — its agent rule's ``before_step``, one fused
Eq. 7 pull over all S shards' targets, as delivered through ``receive`` — and
(b) a forward + backward + optimizer step, on CPU and (when present) on CUDA,
and prints the pull's share of a step.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import threading

from mpca.algorithm import AgentContext, ShardLayout
from mpca.algorithm.mpca import MPCAAgent
from mpca.models import SmallCNN, resnet110

MODELS = {
    "resnet110": (resnet110, (3, 32, 32)),
    "smallcnn": (lambda: SmallCNN(8), (1, 8, 8)),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def agent_with_targets(model: torch.nn.Module, optimizer, device: torch.device, shards: int, offset: float,
                       alpha: float) -> MPCAAgent:
    """An MPCA agent rule on ``model`` holding, for every shard, the target ``offset`` away from the model,
    delivered as the runtime delivers them (``receive``): its ``before_step`` is the fused Eq. 7 pull."""
    bound = ShardLayout.from_module(model, shards).bind_module(model)
    ctx = AgentContext(agent_id=0, agents=2, model=model, optimizer=optimizer, shards=bound, device=device,
                       lock=threading.Lock())
    agent = MPCAAgent(ctx)
    for s in range(shards):
        agent.receive(s, bound.split(s, bound.read(s, device=device) + offset), {"alpha": alpha})
    return agent


def measure(model_name: str, device: torch.device, batch: int, repeats: int, shards: int = 3) -> dict:
    build, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = build().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    pull = agent_with_targets(model, opt, device, shards, offset=0.01, alpha=0.05).before_step

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    t_pull = _median_time(pull, device, repeats * 4)
    t_step = _median_time(step, device, repeats)
    return {
        "model": model_name, "device": str(device), "params": sum(p.numel() for p in model.parameters()),
        "batch": batch, "pull_ms": t_pull * 1e3, "step_ms": t_step * 1e3, "share": t_pull / t_step,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="resnet110")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"{'model':<10} {'device':<6} {'params':>10} {'batch':>5} {'pull ms':>9} {'step ms':>9} {'pull/step':>9}")
    for d in devices:
        r = measure(args.model, d, args.batch, args.repeats)
        print(f"{r['model']:<10} {r['device']:<6} {r['params']:>10,} {r['batch']:>5} {r['pull_ms']:>9.3f} "
              f"{r['step_ms']:>9.1f} {100 * r['share']:>8.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
