"""A virtual-time simulator of the runtime (issue 26): K agents and the driver in one process, the library's own
agent and driver rules (:mod:`mpca.algorithm`) training real models on real data, with only time simulated
(:mod:`mpca.sim.clock`) from a compute model (:mod:`mpca.sim.compute`) and a network model
(:mod:`mpca.sim.network`, constants in :mod:`mpca.sim.constants`).  No Spark, no processes, no sockets.
"""
from mpca.sim.constants import NetworkConstants
from mpca.sim.simulator import SimConfig, Simulator, simulate
from mpca.sim.result import SimResult

__all__ = ["NetworkConstants", "SimConfig", "SimResult", "Simulator", "simulate"]
