"""The holdout split of a training DataFrame: by a hash of each row's content, not ``DataFrame.randomSplit``.

``randomSplit`` draws a random number per row, so to give the same split every time a side is computed it
sorts every partition by all of its orderable columns first (Spark's ``Dataset.randomSplit``) — for an
``array<float>`` features column that is a sort of every training row, paid again each time the agents read
their data (measured on local-cluster[4,2,1024], 1 M teacher rows: 5.8–7.5 s against 3.3–6.3 s without the
split; with this one 4.1–4.4 s).  A row's side here is a function of its features, label and the seed alone:
the same whatever the partitioning or the order rows arrive in, no sort, no cache, and two copies of one
row always fall on the same side (no duplicate leaks from training into the holdout).
"""
from __future__ import annotations

BUCKETS = 1_000_000  # a row's hash modulo this; the holdout is the buckets below ``fraction * BUCKETS``


def holdout_cut(fraction: float) -> int:
    """The first training bucket: rows hashing below it are the holdout."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"a holdout fraction lies in [0, 1), got {fraction}")
    return round(fraction * BUCKETS)


def hash_split(df, features: str, label: str, fraction: float, seed: int):
    """(train, holdout) DataFrames: a row is in the holdout when ``xxhash64(seed, features, label)`` modulo
    :data:`BUCKETS` is below ``fraction`` of them — about ``fraction`` of the rows, disjoint, together all."""
    from pyspark.sql import functions as F

    cut = holdout_cut(fraction)
    bucket = F.pmod(F.xxhash64(F.lit(int(seed)), F.col(features), F.col(label)), F.lit(BUCKETS))
    return df.where(bucket >= cut), df.where(bucket < cut)


def holdout_mask(features, labels, fraction: float, seed: int):
    """The rows :func:`hash_split` puts in the holdout, without Spark: a boolean numpy array, one per row of
    ``features`` (float32, (rows, n)) and ``labels`` (int64) — Spark's xxhash64 recomputed by
    :mod:`mpca.data.xxhash`, so that the simulator evaluates on the runtime's very holdout."""
    from mpca.data.xxhash import row_hash

    return (row_hash(seed, features, labels) % BUCKETS) < holdout_cut(fraction)
