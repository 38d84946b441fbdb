"""How a cycle that broadcasts reaches agents that have one exchange task slot each.

Either one task per agent delivers and yields — Spark starts its Python code only once the broadcast is on the
executor, so the yield waits for the download — or a reduce job and then a deliver job share the slot: the
reduce task yields at once and the deliver task follows, its download while the shards go up
(:meth:`mpca.runtime.pipeline.ExchangePipeline.cycle`).  Neither wins everywhere.  Measured on the emulated
cluster (16-core host, 30 Mbit links, K = 4, regime ≈ 100): with 1.5 MB shards two jobs took 2.1–2.5 s a cycle
against 3.0 s for one task; with int8's 0.38 MB shards one task took 0.9 s against 1.5 s — the deliver task's
launch on the freed slot costs about half a second, the download it hides grows with the shard and falls with
the link's rate; and where deliver tasks end sooner than other executors' reduce tasks, an executor can get a
second one, which finds no agent left to serve there and costs a corrective job.

``auto`` starts from a guess and then measures.  The guess: two jobs when the pipeline's fill cycles, which
reduce and broadcast nothing (cycle 0, and cycle 2 where a reduction is broadcast two cycles later:
``DriverRule.stage_lag``), took :data:`GUESS_S` or
more (the reduce alone: K shards into the driver's port; the
download two jobs hide is about (copies / K) of it, and pays for the deliver task's launch, ~0.5 s, from about
1 s on).  Then every :data:`RECHECK` broadcasting cycles the other layout runs :data:`PROBE` cycles, and the
one of lower median cycle time is kept (the load, the agents and the link change during a run).
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, Dict, List, Optional

PROBE = 3  # broadcasting cycles per layout for a measurement
RECHECK = 20  # broadcasting cycles from one measurement of the layout not in use to the next
GUESS_S = 1.0  # a reduce-only cycle at least this long: start with two jobs
LAYOUTS = ("auto", "one", "two")


class ExchangeLayout:
    """Which layout the next broadcasting cycle uses (:meth:`two_jobs`) and what cycles took (:meth:`observe`);
    ``choice`` ``one`` or ``two`` fixes it (``cluster.exchange_jobs``)."""

    def __init__(self, choice: str = "auto", probe: int = PROBE, recheck: int = RECHECK, guess_s: float = GUESS_S):
        if choice not in LAYOUTS:
            raise ValueError(f"exchange layout is one of {', '.join(LAYOUTS)} (got {choice!r})")
        if probe < 1 or recheck <= probe:
            raise ValueError(f"need probe >= 1 and recheck > probe (got {probe}, {recheck})")
        self.choice, self.probe, self.recheck, self.guess_s = choice, probe, recheck, guess_s
        self.seen = 0  # broadcasting cycles observed
        self.reduce_only: List[float] = []  # the first cycles, which broadcast nothing
        self.times: Dict[bool, Deque[float]] = {True: deque(maxlen=probe), False: deque(maxlen=probe)}
        self.kept: Optional[bool] = None  # the layout in use between rechecks

    def guess(self) -> bool:
        """Two jobs where the reduce alone took ``guess_s`` or more (and where nothing was seen yet)."""
        return not self.reduce_only or statistics.median(self.reduce_only) >= self.guess_s

    def best(self) -> bool:
        """The layout of lower median cycle time, the guess while one of them has not been measured (until the
        first recheck only the guessed one has)."""
        if not (self.times[True] and self.times[False]):
            return self.guess()
        return statistics.median(self.times[True]) <= statistics.median(self.times[False])

    def two_jobs(self) -> bool:
        if self.choice != "auto":
            return self.choice == "two"
        if self.kept is not None and self.seen % self.recheck >= self.recheck - self.probe:
            return not self.kept  # the recheck: the other layout, for the whole window
        self.kept = self.best()
        return self.kept

    def observe(self, two_jobs: Optional[bool], seconds: float) -> None:
        """A cycle took ``seconds`` from submission to its end: a broadcasting one with ``two_jobs`` or not, or
        (``None``) one of the first, which only reduce (the guess's evidence)."""
        if two_jobs is None:
            if self.seen <= 1:  # the fill's: before the first broadcasting cycle and right after it
                self.reduce_only.append(float(seconds))
            return
        self.times[bool(two_jobs)].append(float(seconds))
        self.seen += 1
