"""A task that cannot be memorised: rows generated from their index, labelled by a fixed random teacher network.

Row ``i`` is a deterministic function of ``(seed, i)`` alone: rows come in blocks of :data:`BLOCK`, each block
drawn from its own generator (``numpy.random.default_rng([seed, TAG_ROWS, block])``), so any executor builds
any row without the others and the data set is the same whatever the partitioning.  Features are standard
normal; the label is the arg-max of a two-layer tanh teacher (weights from ``(seed, TAG_TEACHER)``) whose
class logits are centred on a calibration sample, so classes are roughly balanced.  With millions of rows
no run reads a row twice, so the time to a target error measures optimisation, not memorisation; a holdout
split of the same DataFrame comes from the same distribution.  Generated on the executors: no download,
any size.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Iterator, Tuple

import numpy as np

BLOCK = 4096  # rows drawn together from one generator
TAG_ROWS, TAG_TEACHER, TAG_CALIBRATION = 1, 2, 3  # distinct streams of one seed
CALIBRATION_ROWS = 16_384


@dataclass(frozen=True)
class TeacherTask:
    """``rows`` rows of ``features`` standard-normal values, ``classes`` labels from a tanh teacher with
    ``hidden`` units; everything follows from ``seed``."""

    rows: int = 2_000_000
    features: int = 64
    classes: int = 10
    hidden: int = 64
    seed: int = 0

    def __post_init__(self):
        if min(self.rows, self.features, self.hidden) < 1 or self.classes < 2:
            raise ValueError(f"a teacher task needs rows, features, hidden >= 1 and classes >= 2, got {self}")

    def teacher(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(w1, b1, w2, b2) of the teacher, float64; b2 centres the class logits on a calibration sample."""
        return _teacher(self)

    def label(self, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self.teacher()
        return (np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2).argmax(axis=1).astype(np.int64)

    def block(self, b: int) -> Tuple[np.ndarray, np.ndarray]:
        """Rows ``[b * BLOCK, (b + 1) * BLOCK)`` (fewer in the last block): float32 features, int64 labels."""
        n = min(BLOCK, self.rows - b * BLOCK)
        if b < 0 or n <= 0:
            raise IndexError(f"block {b} is outside the task's {self.rows} rows")
        x = np.random.default_rng([self.seed, TAG_ROWS, b]).standard_normal((BLOCK, self.features), np.float32)[:n]
        return x, self.label(x)

    def take(self, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The rows with these indices, in their order (any indices in ``[0, rows)``, any partitioning)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            raise IndexError(f"row indices must lie in [0, {self.rows})")
        x = np.empty((ids.size, self.features), np.float32)
        y = np.empty(ids.size, np.int64)
        blocks = ids // BLOCK
        for b in np.unique(blocks):
            where = blocks == b
            bx, by = self.block(int(b))
            x[where], y[where] = bx[ids[where] - b * BLOCK], by[ids[where] - b * BLOCK]
        return x, y

    def dataframe(self, spark, partitions: int = 4):
        """The task as a Spark DataFrame (``features: array<float>``, ``label: bigint``), generated on the
        executors from ``spark.range`` — no row crosses the driver."""
        return spark.range(0, self.rows, numPartitions=partitions).mapInArrow(
            partial(generate_rows, self), "features array<float>, label bigint")


def generate_rows(task: TeacherTask, batches: Iterator) -> Iterator:
    """The body of the task's ``mapInArrow``: the rows of each batch's ``id`` column.

    Once its rows are out it imports torch, so that its Python worker goes back to the executor's pool with
    torch loaded.  PySpark hands a task the pool's oldest idle worker, and the agents' next task (in a warm
    session: a benchmark's next run, a notebook's next ``fit``) often got one of these, then imported torch
    itself (~2 s of CPU per agent) before it started.  A table Spark reads itself (Parquet) has no Python
    worker before the agents, and a warm session reuses the agents' own (docs/notes/measurements.md, "Start-up").  After the last
    batch, the import delays no row."""
    from mpca.data.datasets import arrow_table

    for batch in batches:
        x, y = task.take(batch.column("id").to_numpy())
        yield from arrow_table(x, y).to_batches()
    import torch  # noqa: F401  (the worker's next task may be an agent)


@lru_cache(maxsize=8)
def _teacher(task: TeacherTask):
    rng = np.random.default_rng([task.seed, TAG_TEACHER])
    w1 = rng.standard_normal((task.features, task.hidden)) / np.sqrt(task.features)
    b1 = 0.1 * rng.standard_normal(task.hidden)
    w2 = rng.standard_normal((task.hidden, task.classes)) / np.sqrt(task.hidden)
    calib = np.random.default_rng([task.seed, TAG_CALIBRATION]).standard_normal((CALIBRATION_ROWS, task.features))
    b2 = -(np.tanh(calib @ w1 + b1) @ w2).mean(axis=0)
    return w1, b1, w2, b2
