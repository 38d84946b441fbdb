"""Spark's ``xxhash64`` of a row (``features: array<float>``, ``label: bigint``) in numpy, one row per lane.

:func:`mpca.data.split.hash_split` puts a row in the holdout by ``pmod(xxhash64(lit(seed), features, label),
BUCKETS)``.  The simulator (``mpca simulate``, ``lab/sim_validation.py``) evaluates on that very holdout, so it
needs the same value without a JVM.  Spark's XXH64 (``org.apache.spark.sql.catalyst.expressions.XXH64``) hashes
the expression's children in order, each with the previous hash as its seed (42 before the first): an int with
``hashInt`` (its 4 bytes), a long with ``hashLong``, a float as the int of its bits (``-0.0`` as ``0.0``, NaN
canonical), an array element by element.  Unsigned 64-bit arithmetic wraps, as Java's long does.
"""
from __future__ import annotations

import numpy as np

SPARK_SEED = 42  # XxHash64's default seed in Spark SQL

P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * P2
    h = h ^ (h >> np.uint64(29))
    h = h * P3
    return h ^ (h >> np.uint64(32))


def hash_int(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64.hashInt: the 4 bytes of each int32 (as unsigned) under each lane's seed."""
    v = np.asarray(value).astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    h = np.asarray(seed, dtype=np.uint64) + P5 + np.uint64(4)
    h = h ^ (v * P1)
    return _fmix(_rotl(h, 23) * P2 + P3)


def hash_long(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64.hashLong: the 8 bytes of each int64 under each lane's seed."""
    v = np.asarray(value).astype(np.int64).astype(np.uint64)
    h = np.asarray(seed, dtype=np.uint64) + P5 + np.uint64(8)
    h = h ^ (_rotl(v * P2, 31) * P1)
    return _fmix(_rotl(h, 27) * P1 + P4)


def float_bits(x: np.ndarray) -> np.ndarray:
    """Java's ``Float.floatToIntBits`` as Spark hashes a float: -0.0 as 0.0, every NaN as 0x7fc00000."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.int32).copy()
    bits[x == 0] = 0
    bits[np.isnan(x)] = 0x7FC00000
    return bits


def row_hash(seed: int, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``xxhash64(lit(seed), features, label)`` per row as Spark computes it (signed int64): ``seed`` an int
    literal, ``features`` float32 of shape (rows, n) (an array column without nulls), ``labels`` int64."""
    features = np.asarray(features, dtype=np.float32)
    if features.ndim != 2 or len(labels) != features.shape[0]:
        raise ValueError(f"features must be (rows, n) and labels (rows,), got {features.shape} and {np.shape(labels)}")
    rows = features.shape[0]
    h = hash_int(np.full(rows, int(seed), dtype=np.int64), np.full(rows, SPARK_SEED, dtype=np.uint64))
    bits = float_bits(features)
    for j in range(bits.shape[1]):
        h = hash_int(bits[:, j], h)
    return hash_long(np.asarray(labels, dtype=np.int64), h).view(np.int64)
