"""The benchmark's named regimes: how expensive one full-model exchange is against one training step.

The paper's Table 1 gives the communication/computation ratio of one model exchange on Gigabit Ethernet:
≈ 12 for ResNet-110 and ≈ 100 for VGG-A.  On this machine a regime is set by two knobs of the emulation:
the emulated link rate of every host (the repository's lab/netcluster.py, :mod:`mpca.bench.emulated_cluster`)
and the emulated device's step time T (:mod:`mpca.bench.emulation`).  The ratio a run really had is measured
(``compare.json``: ``comm_comp_ratio``, the median cycle × S × steps/s) and printed beside the regime's nominal
one: the link and T below were calibrated with 4 agents on the default task (``conf/teacher_mlp.yaml``, 1.13 M
parameters), and another model, K or machine moves the measured ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Regime:
    name: str
    link: str  # every emulated host's port (netcluster)
    device_step_s: float  # T: every agent's training step, waited out to this wall time
    ratio: float  # the paper's communication/computation ratio of one model exchange
    paper: str

    def describe(self) -> str:
        return (f"{self.name}: {self.paper}, comm/comp ≈ {self.ratio:g}, emulated by a {self.link} link and "
                f"T = {1000 * self.device_step_s:g} ms per step")


REGIMES: Dict[str, Regime] = {r.name: r for r in (
    # 100 Mbit, 4 agents: a cycle of ~1.2 s moves a third of the model, 3.6 s for all of it ≈ 12 steps of 300 ms
    Regime("resnet110-gbe", "100mbit", 0.3, 12.0, "ResNet-110 on GbE (Table 1)"),
    # 30 Mbit: ~3.3× the cycle at a third of T ≈ 100 steps of 100 ms per model exchange (from the 100 Mbit
    # calibration by arithmetic; the measured ratio of a run says how close it came)
    Regime("vgga-gbe", "30mbit", 0.1, 100.0, "VGG-A on GbE (Table 1)"),
)}


def regime(name: str) -> Regime:
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown regime {name!r}; choose from {', '.join(REGIMES)}") from None


def off_by(measured, nominal: float) -> float:
    """How far a measured ratio lies from the nominal one, as a factor ≥ 1 (inf when nothing was measured)."""
    if not measured or measured <= 0:
        return float("inf")
    return max(measured / nominal, nominal / measured)
