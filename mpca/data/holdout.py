"""The holdout set aside by the agents as they load their rows: one pass over the data, not two.

The trainer scores the joint model on the holdout rows of smallest row hash (:func:`mpca.data.split.evaluation_rows`:
``xxhash64(seed, features, label)``, a row in the holdout when that hash modulo ``BUCKETS`` is below the cut).
Reading them with a Spark job of the driver's is a scan of every row (the holdout is a fraction of each
partition, so no partition can stop early) — measured on this 2-core machine for the benchmark's 1 M generated
rows: 3.5 s, before any agent started, and then the agents read every row again.

Instead, where every agent starts with the run (not an elastic one), the agents' job reads the rows with their
hash (:data:`HASH_COLUMN`, computed by Spark as the split's own), and each agent sets its holdout rows aside as
it loads (:class:`HoldoutKeeper`), training on the rest — the very rows the split's training side holds. The
driver then takes the ``max_rows`` smallest hashes over all agents in two light control jobs once every agent
has all of its rows (:func:`mpca.runtime.control.holdout`): each agent answers the first with its own
``max_rows`` smallest hashes (integers, no rows), and the second asks each agent only for its rows up to the
overall ``max_rows``-th hash (:func:`holdout_cut_off`). The rows moved are the holdout the driver scores on,
no more; the rows chosen are the ``max_rows`` of smallest hash of the whole holdout, in hash order — what
:func:`mpca.data.split.evaluation_subset` picks.
"""
from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from mpca.data.arrow import batch_arrays, label_dtype
from mpca.data.split import BUCKETS

HASH_COLUMN = "__mpca_row_hash"  # the row's xxhash64(seed, features, label), added for the agents' job only


def with_row_hash(df, features: str, label: str, seed: int):
    """``df``'s features and label with each row's hash (the split's own, :func:`mpca.data.split.hash_split`)."""
    from mpca.data.split import row_hash_column

    return df.select(features, label, row_hash_column(features, label, seed).alias(HASH_COLUMN))


class HoldoutKeeper:
    """An agent's holdout rows (bucket below ``cut``), set aside from its batches as they load; at most the
    ``max_rows`` of smallest hash are kept (memory: about twice that, whatever the partition's size)."""

    def __init__(self, cut: int, max_rows: int, features: str, label: str, input_shape: Sequence[int]):
        self.cut, self.max_rows = int(cut), int(max_rows)
        self.features, self.label, self.input_shape = features, label, tuple(input_shape)
        self._parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (hashes, x, y)
        self._held = 0

    def training_batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` without their holdout rows (and without the hash column); those rows are kept."""
        for b in batches:
            hashes = b.column(b.schema.get_field_index(HASH_COLUMN)).to_numpy(zero_copy_only=False)
            held = np.mod(hashes, BUCKETS) < self.cut  # Spark's pmod: never negative
            if held.any():
                self._keep(hashes[held], b.filter(pa.array(held)))
            yield b.filter(pa.array(~held)).select([self.features, self.label])

    def _keep(self, hashes: np.ndarray, rows: pa.RecordBatch) -> None:
        arrays = batch_arrays(rows, self.features, self.label, self.input_shape)
        if arrays is None:
            return
        self._parts.append((hashes.astype(np.int64), *arrays))
        self._held += len(hashes)
        if self._held > 2 * self.max_rows:
            self._parts = [self._smallest(self.max_rows)]
            self._held = len(self._parts[0][0])

    def _smallest(self, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``n`` rows of smallest hash, in hash order (all of them when fewer)."""
        if not self._parts:
            return np.zeros(0, np.int64), np.zeros((0, *self.input_shape), np.float32), np.zeros(0, np.int64)
        h = np.concatenate([p[0] for p in self._parts])
        x = np.concatenate([p[1] for p in self._parts])
        y = np.concatenate([p[2] for p in self._parts])
        order = np.argsort(h, kind="stable")[:n]
        return h[order], x[order], y[order]

    def hashes(self) -> np.ndarray:
        """Its ``max_rows`` smallest hashes, ascending, int64 (what it tells the driver first, as the payload:
        a header holds 64 KiB at most)."""
        return np.ascontiguousarray(self._smallest(self.max_rows)[0], dtype=np.int64)

    def rows_up_to(self, cut_off: int) -> Tuple[dict, bytes]:
        """Its rows of hash ≤ ``cut_off``, as a header (how many, the labels' dtype) and a payload (their int64
        hashes, the float32 features, then the labels)."""
        h, x, y = self._smallest(self.max_rows)
        keep = h <= cut_off
        h, x = np.ascontiguousarray(h[keep], dtype=np.int64), np.ascontiguousarray(x[keep], dtype=np.float32)
        y = np.ascontiguousarray(y[keep], dtype=label_dtype(y))
        header = {"rows": int(len(h)), "label_dtype": y.dtype.name, "label_shape": list(y.shape[1:])}
        return header, h.tobytes() + x.tobytes() + y.tobytes()


def holdout_cut_off(hashes: Iterable[int], max_rows: int) -> Optional[int]:
    """The ``max_rows``-th smallest of all agents' hashes (their largest where fewer): every row the driver
    scores on has a hash at most this; None when no agent holds a holdout row."""
    ordered = sorted(int(v) for v in hashes)
    return ordered[min(max_rows, len(ordered)) - 1] if ordered else None


def decode_rows(parts: Sequence[Tuple[dict, bytes]], max_rows: int, input_shape: Sequence[int]):
    """The agents' answers (:meth:`HoldoutKeeper.rows_up_to`) as (features, labels, hashes) numpy arrays: the
    ``max_rows`` rows of smallest hash, in hash order."""
    width = int(np.prod(input_shape)) if input_shape else 0
    hs, xs, ys = [], [], []
    for header, payload in parts:
        n = int(header["rows"])
        if n == 0:
            continue
        size = n * width * 4
        hs.append(np.frombuffer(payload[:8 * n], dtype=np.int64))
        xs.append(np.frombuffer(payload[8 * n:8 * n + size], dtype=np.float32).reshape(n, *input_shape))
        ys.append(np.frombuffer(payload[8 * n + size:], dtype=np.dtype(header["label_dtype"]))
                  .reshape(n, *header.get("label_shape", ())))  # a sequence's labels: one per position
    if not hs:
        return np.zeros((0, *input_shape), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64)
    h, x, y = np.concatenate(hs), np.concatenate(xs), np.concatenate(ys)
    order = np.argsort(h, kind="stable")[:max_rows]
    return x[order], y[order], h[order]
