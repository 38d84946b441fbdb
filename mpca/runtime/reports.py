"""What the running agents report: one agent's answer (:class:`AgentReport`, sent as a JSON header, never
pickled) and the run's own counters (:class:`RunCounters`, on the driver)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class AgentReport:
    """One agent's answer in a cycle (or to a control job, or with a parameter-service request).

    ``weight`` is its weight in the reduction (MPCA: τ, the steps since the shard was last yielded);
    ``extra`` is whatever its algorithm's agent rule adds.  The ``t_*`` fields are wall-clock times set
    by the exchange task: start, shard materialised, broadcast loaded, broadcast handed over, end.
    """

    agent: int
    executor: Optional[str] = None
    pid: Optional[int] = None
    device: Optional[str] = None
    gpu: List[str] = field(default_factory=list)
    rows: Optional[int] = None
    labels: Optional[Dict[str, int]] = None  # rows per class label in its data (sent with "hello" only)
    startup: Optional[Dict[str, float]] = None  # its start-up phases (Agent.startup; with "hello" only)
    initial_model: Optional[str] = None  # rebuilt, shipped or joined (mpca.runtime.initial; with "hello" only)
    loading: Optional[bool] = None  # its rows are still arriving (mpca.data.stream); ``rows`` counts those there
    steps: Optional[int] = None
    samples: Optional[int] = None
    steps_per_s: Optional[float] = None
    loss: Optional[float] = None
    exchange_s: Optional[float] = None  # time its training loop spent waiting in exchange hooks
    alive_s: Optional[float] = None  # time since it started training
    compute_s: Optional[float] = None  # wall time of its real training steps (exchange.device.DeviceClock)
    cpu_s: Optional[float] = None  # its process's CPU time during them
    device_idle_s: Optional[float] = None  # waited out by an emulated device (emulation.device_step_s)
    late_steps: Optional[int] = None  # steps whose real compute took longer than the emulated device step
    weight: Optional[float] = None
    resets: int = 0  # numerical faults (NaN/Inf) after which the agent went back to the joint model
    attempt: int = 0  # Spark's attempt number of the agent's task (> 0: a replacement)
    joining: bool = False  # a replacement waiting for the joint model: contributes nothing yet
    lost: int = 0  # contributions it yielded that never reached the reduction (their weight carried over)
    extra: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    user_error: bool = False  # ``error`` is one line for the user (e.g. its rows' labels), not a failure
    exchange_cpu_s: Optional[float] = None  # CPU seconds of the exchange task's Python thread
    bytes_up: Optional[int] = None  # bytes of the shard it yielded, as sent (in the run's wire format)
    bytes_down: Optional[int] = None  # bytes of the broadcast it was handed, as sent
    t_start: Optional[float] = None
    t_yield: Optional[float] = None
    t_bc_loaded: Optional[float] = None
    t_bc: Optional[float] = None
    t_end: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "AgentReport":
        """Build from a received header, ignoring keys this version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def update(self, d: Dict[str, Any]) -> "AgentReport":
        """Take the known, non-None values of ``d`` (another report's dict)."""
        for f in dataclasses.fields(self):
            v = d.get(f.name)
            if v is not None and f.name != "agent":
                setattr(self, f.name, v)
        return self


@dataclass(frozen=True)
class RunCounters:
    """What a run used of Spark and the parameter service, counted on the driver."""

    jobs: Dict[str, int]  # Spark jobs submitted, by purpose: cycle, correction, control
    broadcasts: Dict[str, int]  # broadcast variables created and destroyed
    job_group: str  # the Spark job group of the run's exchange jobs
    service_bytes: int = 0  # payload bytes through the parameter service, both directions
