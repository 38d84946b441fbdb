"""The driver's per-cycle record: when each phase of each shard started and ended, and what agents did.

Phases of cycle ``c`` (its Spark jobs: one, or a reduce job and a deliver job — the row's ``jobs``):

* ``stage``  — driver: Eqs. 9 → 8 → 4 → 5 for the shard reduced in the previous
  cycle and creation of its broadcast variable (runs while job ``c`` runs);
* ``broadcast`` — from the job's submission until the last agent received the
  broadcast shard and had it handed over;
* ``reduce`` — from the first agent's shard materialisation until the reduced
  result reached the driver.

Per agent, the deliver task's ``t_start`` is when its Python code began, i.e.
when Spark had finished fetching the broadcast for it (``t_bc_loaded`` just
after); the reduce task's ``t_start`` and ``t_yield`` need no broadcast.  A cycle's row has the first yield
(``reduce_start``), the last one (``yield_last``) and the last reduce task's start (``task_start_last``): how
long its reduce tasks waited for a slot, a launch or a download.

Overlap between phases is computed from these timestamps, not assumed.

The driver keeps only the last ``training.timeline_window`` records in memory: older ones go, as rows, to
a temporary file the :class:`Timeline` owns, and running totals cover the whole run, so that its memory
stays flat over days of cycles.
"""
from __future__ import annotations

import io
import itertools
import os
import pickle
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from mpca.runtime.reports import AgentReport

DEFAULT_WINDOW = 1000  # cycles kept in memory (~3 KB each); training.timeline_window
WARM_UP_MAX = 16  # overlap_fraction can skip at most this many first cycles


@dataclass
class CycleRecord:
    cycle: int
    reduce_shard: Optional[int]
    bcast_shard: Optional[int]
    t_submit: float
    t_end: float = 0.0
    jobs: int = 1  # Spark jobs of the cycle besides corrections: 2 where a reduce job and a deliver job ran
    scatter: bool = False  # its contributions were reduce-scattered over the executors (mpca.runtime.scatter)
    stage_shard: Optional[int] = None
    stage_start: Optional[float] = None
    stage_end: Optional[float] = None
    bcast_end: Optional[float] = None
    reduce_start: Optional[float] = None
    bytes_up: int = 0  # shard payloads that reached the reduction (agents → driver)
    bytes_down: int = 0  # broadcast payloads handed to agents (driver → agents)
    rejected: bool = False  # its reduction held NaN/Inf and was not applied
    abandoned: bool = False  # its exchange ran past the cycle deadline and was cancelled (nothing counted)
    corrections: int = 0
    misplaced: int = 0
    missing: List[int] = field(default_factory=list)  # agents that did not contribute (hung, lost, joining)
    joined: List[int] = field(default_factory=list)  # replacement agents handed the joint model after it
    left: List[int] = field(default_factory=list)  # agents that left the run after it (decommissioned executors)
    handed_in: List[int] = field(default_factory=list)  # leaving agents whose last contribution its stage took
    agents: Dict[int, AgentReport] = field(default_factory=dict)  # reduce tasks' reports (contributions)
    delivered: Dict[int, AgentReport] = field(default_factory=dict)  # deliver tasks' reports (broadcast hand-offs)

    def delivered_at(self) -> float:
        """When the last agent held this cycle's broadcast: ``bcast_end``, its deliver task's time after the
        agent's answer (the executors' clocks), kept within the job's submission and end (the driver's); the
        job's end where nothing was delivered."""
        return min(max(self.bcast_end if self.bcast_end is not None else self.t_end, self.t_submit), self.t_end)

    @property
    def broadcast_interval(self):
        return (self.t_submit, self.bcast_end) if self.bcast_end is not None else None

    @property
    def reduce_interval(self):
        return (self.reduce_start, self.t_end) if self.reduce_start is not None else None

    def broadcast_overlaps_reduce(self) -> bool:
        b, r = self.broadcast_interval, self.reduce_interval
        return bool(b and r and b[0] < r[1] and r[0] < b[1])

    def reduce_started_before_broadcast(self) -> bool:
        """Whether some agent's reduce task began while its broadcast was still being downloaded."""
        return any(r.t_start and d.t_start and r.t_start < d.t_start
                   for a, r in self.agents.items() for d in [self.delivered.get(a)] if d is not None)

    def reduce_before_broadcast(self) -> bool:
        """Whether some agent's shard was yielded before the task holding its broadcast had started, i.e.
        before Spark had finished downloading the broadcast: the reduce did not wait for it."""
        return any(r.t_yield and d.t_start and r.t_yield < d.t_start
                   for a, r in self.agents.items() for d in [self.delivered.get(a)] if d is not None)

    def stage_overlaps_job(self) -> bool:
        return self.stage_start is not None and self.stage_start < self.t_end and self.t_submit < self.stage_end


class TimelineTotals:
    """Running sums over every cycle of a run that its readers need (``bench compare``: traffic, shards; the
    overlap fraction), kept up as cycles are added so that nothing has to keep every record."""

    def __init__(self):
        self.bytes_up = 0
        self.bytes_down = 0
        self.exchanged = 0  # cycles that both broadcast and reduced a shard
        self.overlapped = 0  # ... and whose broadcast and reduction overlapped
        self.shards: Set[int] = set()  # the shards reduced (at most S)

    def add(self, rec: CycleRecord) -> None:
        self.add_row(_row(rec))

    def add_row(self, row: dict) -> None:
        """A cycle's row (:func:`_row`): its traffic, whether it overlapped, its shard."""
        self.bytes_up += row["bytes_up"]
        self.bytes_down += row["bytes_down"]
        exchanged, overlapped = _row_flags(row)
        self.exchanged += exchanged
        self.overlapped += overlapped
        if row["reduce_shard"] is not None:
            self.shards.add(row["reduce_shard"])


def _overlap_flags(rec: CycleRecord) -> Tuple[bool, bool]:
    """Whether the cycle both broadcast and reduced a shard, and whether those two overlapped."""
    exchanged = rec.bcast_shard is not None and rec.reduce_shard is not None
    return exchanged, exchanged and rec.broadcast_overlaps_reduce()


def _row_flags(row: dict) -> Tuple[bool, bool]:
    """:func:`_overlap_flags` of a cycle's row."""
    exchanged = row["bcast_shard"] is not None and row["reduce_shard"] is not None
    return exchanged, exchanged and bool(row["overlap"])


def _latest(times: Iterable[Optional[float]]) -> Optional[float]:
    known = [t for t in times if t]
    return max(known) if known else None


def _row(c: CycleRecord) -> dict:
    """One cycle as a flat row (``timeline.csv``, :meth:`Timeline.to_pandas`)."""
    return {
        "cycle": c.cycle, "reduce_shard": c.reduce_shard, "bcast_shard": c.bcast_shard,
        "stage_shard": c.stage_shard, "jobs": c.jobs, "t_submit": c.t_submit, "t_end": c.t_end,
        "stage_start": c.stage_start, "stage_end": c.stage_end, "bcast_end": c.bcast_end,
        "reduce_start": c.reduce_start, "yield_last": _latest(e.t_yield for e in c.agents.values()),
        "task_start_last": _latest(e.t_start for e in c.agents.values()), "overlap": c.broadcast_overlaps_reduce(),
        "rejected": c.rejected, "resets": sum(e.resets for e in c.agents.values()), "bytes_up": c.bytes_up,
        "bytes_down": c.bytes_down, "corrections": c.corrections, "misplaced": c.misplaced,
        "missing": list(c.missing), "joined": list(c.joined), "left": list(c.left),
        "handed_in": list(c.handed_in),
        "weight": {a: e.weight for a, e in sorted(c.agents.items())},
        "steps_per_s": {a: e.steps_per_s for a, e in sorted(c.agents.items())},
        "scatter": c.scatter,  # last ones: the columns before them keep their places
        "abandoned": c.abandoned,
    }


COLUMNS = list(_row(CycleRecord(0, None, None, 0.0)))
SHARD_COLUMNS = ("reduce_shard", "bcast_shard", "stage_shard")


class _Spill:
    """Rows of the cycles that left the window, appended (a pickle stream) to an unnamed temporary file the
    timeline owns: created at the first row, gone when closed — or when the process ends, however it ends."""

    def __init__(self, directory: Optional[str]):
        self.directory = directory
        self.rows = 0
        self.closed = False
        self._file = None

    def write(self, row: dict) -> None:
        if self.closed:
            raise RuntimeError("the timeline was closed: its spill file is gone")
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="mpca-timeline-", dir=self.directory)
        pickle.dump(row, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self.rows += 1

    def read(self, rows: int) -> Iterator[dict]:
        """The first ``rows`` rows, oldest first, read at an offset of their own (the writer's stays)."""
        if rows == 0:
            return
        if self.closed:
            raise RuntimeError(f"the timeline was closed: the {self.rows} rows it had spilled are gone")
        self._file.flush()
        reader = io.BufferedReader(_ReadAt(self._file.fileno()))
        for _ in range(rows):
            yield pickle.load(reader)

    def close(self) -> None:
        self.closed = True
        if self._file is not None:
            self._file.close()


class _ReadAt(io.RawIOBase):
    """A file descriptor read from its own offset (``os.pread``), without moving the descriptor's."""

    def __init__(self, fd: int):
        self.fd, self.offset = fd, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = os.pread(self.fd, len(buffer), self.offset)
        buffer[:len(data)] = data
        self.offset += len(data)
        return len(data)


class Timeline:
    """The run's cycles: the last ``window`` records in memory (:attr:`cycles`), running totals over all of
    them (:attr:`totals`), and the older ones as rows in a temporary spill file, so that the driver's memory
    stays flat however long the run; :meth:`to_pandas` and :meth:`write_csv` give the whole run.

    The spill file is unnamed (in ``spill_dir``, default the system's temporary directory, ~400 bytes a
    cycle): it lives as long as the timeline, until :meth:`close`, the end of a ``with`` block or the
    timeline's garbage collection, and never outlives the process (not even one killed)."""

    def __init__(self, window: int = DEFAULT_WINDOW, spill_dir: Optional[str] = None):
        if window < 1:
            raise ValueError(f"window must be >= 1 cycle, got {window}")
        self.window = window
        self.cycles: List[CycleRecord] = []  # the last `window` cycles, oldest first
        self.totals = TimelineTotals()
        self._head: List[Tuple[bool, bool]] = []  # overlap flags of the first WARM_UP_MAX cycles
        self._spill = _Spill(spill_dir)
        self._finalizer = weakref.finalize(self, self._spill.close)

    @classmethod
    def of_rows(cls, rows: Iterable[dict], spill_dir: Optional[str] = None) -> "Timeline":
        """A run's timeline from its cycles' rows (a Spark Connect run's, which its coordinator wrote as JSON):
        read, totalled and written as a run of this process's, with no :class:`CycleRecord` in memory."""
        timeline = cls(1, spill_dir)
        for row in rows:
            timeline.totals.add_row(row)
            if len(timeline._head) < WARM_UP_MAX:
                timeline._head.append(_row_flags(row))
            timeline._spill.write(row)
        return timeline

    def add(self, rec: CycleRecord) -> None:
        self.totals.add(rec)
        if len(self._head) < WARM_UP_MAX:
            self._head.append(_overlap_flags(rec))
        self.cycles.append(rec)
        while len(self.cycles) > self.window:
            self._spill.write(_row(self.cycles.pop(0)))

    @property
    def spilled(self) -> int:
        """Cycles that left the in-memory window (their rows are in the spill file)."""
        return self._spill.rows

    def overlap_fraction(self, skip: int = 3) -> float:
        """Fraction of the run's cycles (after ``skip`` ≤ 16 warm-up cycles) whose broadcast and reduction
        overlapped, among those that did both."""
        if not 0 <= skip <= WARM_UP_MAX:
            raise ValueError(f"skip must be within 0-{WARM_UP_MAX}, got {skip}")
        head = self._head[:skip]
        exchanged = self.totals.exchanged - sum(e for e, _ in head)
        overlapped = self.totals.overlapped - sum(o for _, o in head)
        return overlapped / exchanged if exchanged else 0.0

    def iter_rows(self) -> Iterator[dict]:
        """Every cycle of the run so far as a row, oldest first: the spilled ones, then the window (cycles
        added while it is read are not in it)."""
        return itertools.chain(self._spill.read(self._spill.rows), map(_row, list(self.cycles)))

    def rows(self) -> List[dict]:
        return list(self.iter_rows())

    def to_pandas(self):
        """The whole run, one row per cycle (it is all in memory at once: for very long runs,
        :meth:`write_csv` streams it instead)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def write_csv(self, path: str, chunk: int = 5_000) -> None:
        """The whole run as CSV (``timeline.csv``), ``chunk`` rows in memory at a time; the shard columns are
        integers with empty cells where a cycle had none."""
        with open(path, "w", newline="", encoding="utf-8") as f:
            header = True
            for rows in _batches(self.iter_rows(), chunk):
                _frame(rows).to_csv(f, header=header, index=False)
                header = False
            if header:
                _frame([]).to_csv(f, index=False)

    def close(self) -> None:
        """Remove the spill file; the window and totals stay, the spilled rows are gone."""
        self._finalizer()

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _batches(rows: Iterable[dict], n: int) -> Iterator[List[dict]]:
    it = iter(rows)
    while True:
        batch = list(itertools.islice(it, n))
        if not batch:
            return
        yield batch


def _frame(rows: List[dict]):
    import pandas as pd

    return pd.DataFrame(rows, columns=COLUMNS).astype({k: "Int64" for k in SHARD_COLUMNS})
