"""The model every agent starts from: rebuilt on the executor from the user's ``model_fn`` and the run's seed, or
shipped inside the agents' task where it cannot be.

The agents' task closure travels to every executor in Spark's task binary; with the initial weights in it, a
model of M bytes costs K · M bytes through the driver's port before any agent starts (4.5 MB × 4 executors at
30 Mbit: about 4 s of the benchmark's start-up).  The driver builds its model as ``torch.manual_seed(seed);
model_fn()`` unless a checkpoint or ``init_from`` replaced its weights, so an executor with the same torch builds
the same weights itself.  The driver checks this by building the model once more and comparing digests
(:func:`for_agents`); each agent rebuilds it and checks the digest again (:func:`rebuild`).  An agent whose
rebuild differs (another torch version or CPU kind on the executor, a ``model_fn`` that draws from another
random source) does not train from it: it takes the driver's model at run time instead, as a replacement agent
does (a join; :mod:`mpca.runtime.agent`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch


def state_digest(state: Dict[str, np.ndarray]) -> str:
    """SHA-256 over every entry's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        value = np.ascontiguousarray(state[name])
        h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def model_state(model: torch.nn.Module) -> Dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def seeded_model(model_fn: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """``model_fn()`` right after ``torch.manual_seed(seed)``, as the trainer builds it; the caller's torch random
    state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_fn()


@dataclass(frozen=True)
class InitialModel:
    """What the agents' task carries of the initial model: its digest and seed, and its weights only where the
    executors cannot rebuild them (``state`` not None)."""

    seed: int
    digest: str
    state: Optional[Dict[str, np.ndarray]] = None

    @classmethod
    def shipping(cls, model: torch.nn.Module, seed: int = 0) -> "InitialModel":
        """The weights of ``model`` themselves, whatever the seed builds."""
        state = model_state(model)
        return cls(seed, state_digest(state), state)

    @property
    def shipped(self) -> bool:
        return self.state is not None


def for_agents(model: torch.nn.Module, model_fn: Callable[[], torch.nn.Module], seed: int,
               rebuildable: bool = True) -> InitialModel:
    """The driver's side: the weights travel only when ``model`` is not what ``seed`` and ``model_fn`` build
    here (a checkpoint or ``init_from`` replaced them, or ``model_fn`` is not reproducible) or when the
    algorithm's agents cannot take the driver's model at run time (``rebuildable`` False)."""
    shipped = InitialModel.shipping(model, seed)
    if rebuildable and state_digest(model_state(seeded_model(model_fn, seed))) == shipped.digest:
        return InitialModel(seed, shipped.digest)
    return shipped


def rebuild(initial: InitialModel, model_fn: Callable[[], torch.nn.Module]) -> Tuple[torch.nn.Module, bool]:
    """The agent's side: its model, and whether it holds the driver's initial weights (False: the rebuild
    differed, and the agent must take the driver's model before it trains)."""
    if initial.shipped:
        model = model_fn()
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in initial.state.items()}, strict=True)
        return model, True
    model = seeded_model(model_fn, initial.seed)
    return model, state_digest(model_state(model)) == initial.digest
