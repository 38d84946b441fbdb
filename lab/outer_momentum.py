"""Outer momentum on MPCA's joint model, in the simulator: the experiment behind README's "Nor does outer momentum".

    python -m lab.outer_momentum --mu 0.3 -k 4 --link 30mbit --device-step-s 0.1 ...   (any ``mpca simulate`` arguments)

DiLoCo's outer step is Nesterov momentum on the move of the joint model.  Here it is applied to Eq. 8's move of
each shard, Δ = β (R − x̃): m ← μ m + Δ, x̃ ← x̃ + Δ + μ m (μ = 0 is Eq. 8 exactly); Eqs. 4 and 5 then follow
from the moved x̃ as usual.  It is not part of the library: in the ≈ 100 regime it was no lever (24% falls after
one or two reductions per shard, so the momentum has nothing to accumulate), and a high μ hurt later targets.
This script swaps :meth:`mpca.algorithm.joint.JointShard.update` for :func:`update_with_momentum` in this
process only (the simulator runs the driver rule in-process) and runs ``mpca simulate`` with the other arguments.
"""
from __future__ import annotations

import argparse
import sys

import torch

from mpca.algorithm.joint import JointShard
from mpca.algorithm.rules import blend, extrapolate, finish_reduction, trajectory

MU = 0.0  # set by main(); the patched update reads it


def update_with_momentum(shard: JointShard, partial, beta: float, gamma: float, delta: float) -> torch.Tensor:
    """JointShard.update (Eqs. 9, 8, 4, 5) with Nesterov momentum ``MU`` on Eq. 8's move; the buffer lives on
    the shard (``shard.outer_momentum``, zeros at first)."""
    reduced = finish_reduction(partial, shard.joint)  # Eq. 9
    step = blend(shard.joint, reduced, beta) - shard.joint  # Eq. 8's move
    m = getattr(shard, "outer_momentum", None)
    shard.outer_momentum = step.clone() if m is None else m * MU + step
    new_joint = shard.joint + step + shard.outer_momentum * MU
    shard.velocity = trajectory(shard.velocity, new_joint, shard.joint, delta)  # Eq. 4
    shard.joint = new_joint
    shard.reductions += 1
    return extrapolate(shard.joint, shard.velocity, gamma)  # Eq. 5


def main(argv=None) -> int:
    global MU
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    p.add_argument("--mu", type=float, required=True, help="the outer momentum, in [0, 1)")
    a, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not 0.0 <= a.mu < 1.0:
        raise SystemExit(f"--mu must lie in [0, 1), got {a.mu}")
    MU = a.mu
    JointShard.update = update_with_momentum
    from mpca.sim.command import main as simulate

    print(f"outer momentum μ = {MU:g} on every shard's joint model (lab.outer_momentum)")
    return simulate(rest)


if __name__ == "__main__":
    raise SystemExit(main())
