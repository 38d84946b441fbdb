"""An agent's partition larger than its memory budget: streamed once from Spark's Arrow batches into two flat
files on the executor's local disk and memory-mapped for training (``data.agent_memory_mb``).

The batches are converted exactly as in memory (:func:`mpca.data.arrow.batch_arrays`) and kept in memory
until they exceed the budget; from then on everything goes to ``features.f32`` (rows of
``input_shape`` float32 values) and ``labels.<dtype>``, appended batch by batch, so the agent's own
(anonymous) memory stays at about one Arrow batch plus the budget, whatever the partition's size.  Training
indexes the memory-mapped tensors; the operating system keeps the pages it can in its page cache and drops
them under pressure (they are clean file pages, not the process's memory).

Flat files rather than Arrow IPC: a row is one contiguous slice, so a random mini-batch is B slices read
with no decoding.  The files live under ``SPARK_LOCAL_DIRS`` (the executor's local directories, the first
one) or the system's temporary directory, and are removed when the agent ends.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import torch

from mpca.data.arrow import batch_arrays, concat_arrays, label_dtype


def local_dir() -> str:
    """The first of Spark's local directories on this executor, else the system's temporary directory."""
    dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d and os.path.isdir(d)]
    return dirs[0] if dirs else tempfile.gettempdir()


class Partition:
    """An agent's rows as tensors: in memory, or memory-mapped from local disk (``spilled``)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, directory: Optional[str] = None):
        self.features, self.labels, self.directory = features, labels, directory

    @property
    def spilled(self) -> bool:
        return self.directory is not None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])

    def close(self) -> None:
        """Remove the spill files (the tensors must not be used after this)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


class _Spill:
    def __init__(self, directory: str):
        self.directory = tempfile.mkdtemp(prefix="mpca-spill-", dir=directory)
        self.rows = 0
        self.shape: Optional[tuple] = None
        self.label_shape: tuple = ()
        self.label_dtype: Optional[np.dtype] = None
        self._x = open(os.path.join(self.directory, "features.f32"), "wb")
        self._y = None

    def write(self, x: np.ndarray, y: np.ndarray) -> None:
        if self._y is None:  # labels as training reads them (label_dtype): no copy then
            self.shape, self.label_shape = x.shape[1:], y.shape[1:]  # labels: one per row, or per position
            self.label_dtype = label_dtype(y)
            self._y = open(os.path.join(self.directory, f"labels.{self.label_dtype.name}"), "wb")
        self._x.write(np.ascontiguousarray(x, dtype=np.float32).data)
        self._y.write(np.ascontiguousarray(y, dtype=self.label_dtype).data)
        self.rows += x.shape[0]

    def finish(self) -> Partition:
        self._x.close()
        if self._y is not None:
            self._y.close()
        if self.rows == 0:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise ValueError("nothing to spill")
        x = np.memmap(os.path.join(self.directory, "features.f32"), dtype=np.float32, mode="r+",
                      shape=(self.rows, *self.shape))
        y = np.memmap(os.path.join(self.directory, f"labels.{self.label_dtype.name}"), dtype=self.label_dtype,
                      mode="r+", shape=(self.rows, *self.label_shape))
        return Partition(torch.from_numpy(x), torch.from_numpy(y), self.directory)

    def abort(self) -> None:
        for f in (self._x, self._y):
            if f is not None:
                f.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def load_partition(batches: Iterable[pa.RecordBatch], features: str, label: str, input_shape: Sequence[int],
                   budget_mb: Optional[float] = None, directory: Optional[str] = None) -> Partition:
    """The rows of ``batches`` as a :class:`Partition`: in memory while they take at most ``budget_mb`` MB
    (None: no limit), else spilled to ``directory`` (default :func:`local_dir`) and memory-mapped."""
    held: List[Tuple[np.ndarray, np.ndarray]] = []
    size = 0
    spill: Optional[_Spill] = None
    budget = None if budget_mb is None else budget_mb * 1e6
    try:
        for b in batches:
            arrays = batch_arrays(b, features, label, input_shape)
            if arrays is None:
                continue
            if spill is not None:
                spill.write(*arrays)
                continue
            held.append(arrays)
            size += arrays[0].nbytes + arrays[1].nbytes
            if budget is not None and size > budget:
                spill = _Spill(directory or local_dir())
                for x, y in held:
                    spill.write(x, y)
                held = []
        if spill is not None:
            return spill.finish()
    except BaseException:
        if spill is not None:
            spill.abort()
        raise
    x, y = concat_arrays(held, input_shape)
    return Partition(x, y)
