"""The network and runtime constants of the simulator, in one frozen dataclass printed with every result.

Provenance (docs/notes/measurements.md; the emulated cluster of ``lab/netcluster.py``: every host,
the driver's included, behind its own full-duplex ``tc tbf`` port):

* ``link_bps`` = 100 Mbit/s: the emulated cluster's ports in ``bench compare --regime resnet110-gbe`` and in
  the wire figures.
* ``job_overhead_s`` = 0.25 s: "per-job overhead (~0.2–0.3 s before the fetch starts and after the hand-off:
  job submission, task launch and the driver's reduction)", measured by ``lab.overlap`` at K = 2.
* ``block_bytes`` = 4 MiB: Spark's ``spark.broadcast.blockSize`` default (torrent broadcast blocks).
* ``driver_copies_per_doubling`` = 1.0: how many extra copies of each broadcast block the driver's uplink
  sends per doubling of the executors, copies = min(K, 1 + a·log2 K).  Executors fetch the blocks at the same
  moment in random order, so the driver is often the only holder and sends a block more than once.  Fit to
  two figures: at K = 2 a broadcast alone took 1.85–1.91 s for a 10 MB shard (0.25 + 2 × 0.8 s: 2 copies);
  at K = 4 the driver's link sent 29.7 MB per cycle for a 10 MB shard (≈ 3 copies).  a = 0 is the idealised
  torrent (the driver sends each block once, then peers).
* ``latency_s`` = 0.5 ms per hop: a LAN message; not measured (this kernel has no netem, the emulated links
  add none).
* ``service_overhead_s`` = 3 ms per parameter-service request: "a pull does wait for the driver's Python
  process ... round trips of a few ms" (docs/paper.md, "Where the runtime changes a rule").
* ``exchange_cpu_s_per_mb`` = 0 (default: no CPU modelled), ``host_cores`` = None: the CPU an exchange takes
  besides the wire — an agent's shard materialised, encoded and pickled as a task result, the partial sums
  of treeReduce, the broadcast read and decoded — as seconds per MB (10^6 bytes) an agent moves in a cycle,
  up and down, on the cycle's critical path (a Spark task result is serialised whole before it is sent and
  read whole after).  With ``host_cores`` = N every host's exchange shares N cores (the emulated cluster on
  one machine: K agents' work takes max(1, K / N) times as long); None: each host has its own.  Calibrated
  on this 2-core machine at K = 2 from ``bench compare``'s mpca cycles (0.67 s measured against 0.49 s
  modelled without CPU, 3.0 MB per agent: 0.06 s/MB, ``host_cores`` 2) and checked at K = 4 (docs/simulator/simulate.md, "How far
  to trust it").  The parameter service's round trips are charged the same seconds per MB, on the caller.
* ``split_tasks`` = True: executors with two free task slots per agent (the emulated cluster's ``--cores 3``):
  reduce tasks yield without waiting for the broadcast's download.  False: one slot; MPCA's reduce task takes
  it before the deliver task and still does not wait, but a rule whose agents need the delivery before they
  yield (``deliver_before_yield``: rounds) runs one task per agent that yields after the download.
* ``absent_claim_s`` = 0.5 s: the runtime's ``ABSENT_CLAIM_S`` (``mpca/runtime/exchange.py``; a unit test holds
  the two equal) — every job tries an absent agent's socket with this handshake wait, so while an agent is
  stopped (a hang: its socket still accepts) every cycle lasts at least this long after its tasks start; a
  lost agent's socket refuses at once.  Measured (``python -m lab.faults -c conf/teacher_mlp.yaml --algorithms
  mpca --faults none,hang --at-call 35 --hang-s 20 training.agents=4 emulation.device_step_s=0.3``): 17 cycles
  without the hung agent over its 20 s (1.2 s a cycle) where an unfaulted cycle takes about 0.5 s.

Checked against the measured cycle times (10 MB shards, 100 Mbit, :func:`mpca.sim.network.cycle_time`):
K = 2: broadcast alone 1.85 s (measured 1.85–1.91), reduce alone 1.85 s (1.96–2.05), cycle 1.85 s
(2.40–2.58: the model is 23–28% short, it overlaps B and R perfectly).  K = 4 (fp32 / bf16 / int8): 3.45 /
1.85 / 1.05 s against 7.71 / 6.22 / 3.92 s measured — the model is 2–4× short there: those runs put 4
emulated hosts, their JVMs and the exchange's encoding on this machine's 2 cores (the int8 runs were marked
INVALID for it), which no network constant captures.  Validation against the runtime is issue 26, part 2.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class NetworkConstants:
    link_bps: float = 100e6  # every host's port, each direction (full duplex)
    latency_s: float = 0.0005  # per transfer hop
    block_bytes: int = 4 * 1024 * 1024  # torrent broadcast block
    job_overhead_s: float = 0.25  # per Spark job: submission, task launch, result handling
    service_overhead_s: float = 0.003  # per parameter-service request, on the driver
    driver_copies_per_doubling: float = 1.0  # broadcast: driver copies of each block = min(K, 1 + a log2 K)
    split_tasks: bool = True  # reduce tasks do not wait for the broadcast's download
    exchange_cpu_s_per_mb: float = 0.0  # CPU seconds per MB an agent moves in an exchange (0: no CPU modelled)
    host_cores: Optional[int] = None  # every host's exchange shares this many cores (None: each host its own)
    absent_claim_s: float = 0.5  # a job's handshake wait for an absent agent (the runtime's ABSENT_CLAIM_S)

    def __post_init__(self):
        if not (self.link_bps > 0):
            raise ValueError(f"link_bps must be > 0 (inf: no wire time), got {self.link_bps}")
        if self.host_cores is not None and (isinstance(self.host_cores, bool) or int(self.host_cores) != self.host_cores
                                            or self.host_cores < 1):
            raise ValueError(f"host_cores must be a whole number >= 1 or None, got {self.host_cores}")
        for name in ("latency_s", "job_overhead_s", "service_overhead_s", "driver_copies_per_doubling",
                     "exchange_cpu_s_per_mb", "absent_claim_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if self.block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {self.block_bytes}")

    @staticmethod
    def free() -> "NetworkConstants":
        """A network that costs nothing: infinite rate, no latency, no overheads."""
        return NetworkConstants(link_bps=math.inf, latency_s=0.0, job_overhead_s=0.0, service_overhead_s=0.0,
                                absent_claim_s=0.0)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        rate = "unlimited" if math.isinf(self.link_bps) else f"{self.link_bps / 1e6:g} Mbit/s"
        return (f"link {rate} per port (full duplex), latency {self.latency_s * 1e3:g} ms/hop, "
                f"job overhead {self.job_overhead_s:g} s, broadcast blocks {self.block_bytes / 2**20:g} MiB, "
                f"driver copies per block 1 + {self.driver_copies_per_doubling:g}·log2 K, "
                f"service overhead {self.service_overhead_s * 1e3:g} ms/request, "
                f"{'split' if self.split_tasks else 'one'} task(s) per agent, exchange CPU "
                + (f"{self.exchange_cpu_s_per_mb:g} s/MB"
                   + (f" on {self.host_cores} shared core(s)" if self.host_cores else " on each host's own cores")
                   if self.exchange_cpu_s_per_mb else "not modelled"))
