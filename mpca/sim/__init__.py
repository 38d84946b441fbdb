"""A virtual-time simulator of the runtime (issue 26): K agents and the driver in one process, the library's own
agent and driver rules (:mod:`mpca.algorithm`) training real models on real data, with only time simulated
(:mod:`mpca.sim.clock`) from a compute model (:mod:`mpca.exchange.device`) and a network model
(:mod:`mpca.sim.network`, constants in :mod:`mpca.sim.constants`).  No Spark, no processes, no sockets.

The names below are imported on first use: the simulator pulls in torch, and the command line's parser (``mpca
--version``, ``mpca train`` with a bad config) builds ``mpca simulate``'s and ``mpca plan``'s options without it.
"""
from importlib import import_module

_HOMES = {"NetworkConstants": "mpca.sim.constants", "SimConfig": "mpca.sim.simulator",
          "Simulator": "mpca.sim.simulator", "simulate": "mpca.sim.simulator", "SimResult": "mpca.sim.result"}

__all__ = ["NetworkConstants", "SimConfig", "SimResult", "Simulator", "simulate"]


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
