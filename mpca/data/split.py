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
EVALUATION_ROWS = 5000  # the trainer evaluates on at most this many holdout rows by default (data.holdout_max_rows)


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
    bucket = F.pmod(row_hash_column(features, label, seed), F.lit(BUCKETS))
    return df.where(bucket >= cut), df.where(bucket < cut)


def row_hash_column(features: str, label: str, seed: int):
    from pyspark.sql import functions as F

    return F.xxhash64(F.lit(int(seed)), F.col(features), F.col(label))


def evaluation_rows(holdout, features: str, label: str, seed: int, max_rows: int):
    """The holdout rows the trainer scores on: each partition's first ``max_rows`` holdout rows (a read bounded as
    ``limit``'s is), and of those the ``max_rows`` of the smallest row hash (``xxhash64(seed, features, label)``, 64
    bits: ties only between identical rows). The same rows in every run on the same data (read in the same order, as
    a scan is; a shuffle's partitions are not); where no partition holds more than ``max_rows`` holdout rows (the
    benchmark's task), the smallest-hash rows of the whole holdout, whatever the partitioning — the rows
    :func:`evaluation_subset` picks. ``limit(max_rows)`` alone took a different subset from one collection to the
    next (its partitions' rows arrive in any order: 2 of 3 collections of the benchmark's holdout agreed), so one
    model scored differently in two runs of one job and the benchmark's algorithms were scored on different rows."""
    n = int(max_rows)
    columns = holdout.select(features, label)

    def first_rows(batches):
        left = n
        for batch in batches:
            if left <= 0:
                return
            yield batch.slice(0, left)
            left -= min(left, batch.num_rows)

    return columns.mapInArrow(first_rows, columns.schema).orderBy(row_hash_column(features, label, seed)).limit(n)


def holdout_mask(features, labels, fraction: float, seed: int):
    """The rows :func:`hash_split` puts in the holdout, without Spark: a boolean numpy array, one per row of
    ``features`` (float32, (rows, n)) and ``labels`` (int64) — Spark's xxhash64 recomputed by
    :mod:`mpca.data.xxhash`, so that the simulator evaluates on the runtime's very holdout."""
    from mpca.data.xxhash import row_hash

    return (row_hash(seed, features, labels) % BUCKETS) < holdout_cut(fraction)


def evaluation_subset(features, labels, seed: int, max_rows: int):
    """The indices of the rows :func:`evaluation_rows` keeps of a holdout given as numpy arrays (``features``
    float32 (rows, n), ``labels`` int64): the ``max_rows`` of the smallest signed 64-bit row hash, in that
    order (all rows, in hash order, when there are no more than ``max_rows``)."""
    import numpy as np

    from mpca.data.xxhash import row_hash

    order = np.argsort(row_hash(seed, features, labels), kind="stable")
    return order[:max_rows]
