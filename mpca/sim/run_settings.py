"""The run settings the simulator takes, one row each: where a job spells the setting (:class:`mpca.config.Settings`),
the :class:`~mpca.sim.simulator.SimConfig` field it sets, and ``mpca simulate``'s option for it with that
option's default when no ``--config`` is given.

One table serves both directions: :meth:`SimConfig.from_settings` copies each setting to its field (and refuses a
field the run spells when it is also given as the simulator's own), and ``mpca simulate`` refuses an option whose
setting a ``--config`` job spells already, naming the ``SECTION.KEY=VALUE`` to give instead.  Torch-free: the
command's parser is built from it before a simulation imports torch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class RunSetting:
    setting: str  # where a job spells it, SECTION.KEY
    field: str  # the SimConfig field it sets (several settings may build one: the compute model)
    option: Optional[str] = None  # mpca simulate's option without --config (its dest), None: none
    default: Any = None  # that option's default without --config

    def value(self, settings: Any) -> Any:
        """This setting's value in ``settings`` (a :class:`mpca.config.Settings`)."""
        return functools.reduce(getattr, self.setting.split("."), settings)


RUN_SETTINGS: Tuple[RunSetting, ...] = (
    RunSetting("algorithm.name", "algorithm", "algorithm", "mpca"),  # the field takes the whole section
    RunSetting("training.agents", "agents", "agents", 4),
    RunSetting("training.batch_size", "batch_size", "batch_size", 64),
    RunSetting("training.lock_step", "lock_step", "lock_step"),
    RunSetting("emulation.device_step_s", "compute", "device_step_s", 0.3),  # the compute model's T
    RunSetting("emulation.device_speed", "compute", "device_speed", ""),  # and its stragglers
    RunSetting("wire.format", "wire", "wire"),
    RunSetting("wire.block", "wire_block"),
    RunSetting("cluster.reduce", "reduce", "reduce", "tree"),
    RunSetting("cluster.agent_wait_s", "agent_wait_s", "agent_wait"),
    RunSetting("stop.max_cycles", "max_cycles", "max_cycles"),
    RunSetting("stop.max_seconds", "max_virtual_s", "max_seconds", 120.0),  # virtual seconds in the simulator
    RunSetting("eval.metric", "metric"),
    RunSetting("seed", "seed", "seed", 0),
)
# fields that take more than one setting's value as it is: built by SimConfig.from_settings itself
BUILT = ("algorithm", "compute")


def spelled_by_field() -> Dict[str, str]:
    """SimConfig field → the setting(s) that set it, e.g. ``compute`` → ``emulation.device_step_s and
    emulation.device_speed``."""
    out: Dict[str, str] = {}
    for row in RUN_SETTINGS:
        out[row.field] = f"{out[row.field]} and {row.setting}" if row.field in out else row.setting
    return out


def by_option() -> Dict[str, RunSetting]:
    """mpca simulate's option (its dest) → its row, for the options a job spells."""
    return {row.option: row for row in RUN_SETTINGS if row.option is not None}
