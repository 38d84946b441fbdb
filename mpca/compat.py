"""The few PySpark calls whose API changed between Spark 3.5 and 4.x, behind one function each.

Spark 3.5 (Databricks 15.x/16.x LTS, Cloudera CDP 7.3) lacks three 4.0 APIs mpca uses:

* ``DataFrame.toArrow()`` (4.0) — 3.5: ``DataFrame._collect_as_arrow()``, the same Arrow batches;
* ``DataFrame.mapInArrow(..., profile=)`` (4.0) — 3.5: the stage-level scheduling of the agents' job goes
  through ``.rdd.withResources(profile)`` on the same stage (3.1+);
* ``SparkSession.createDataFrame(pyarrow.Table)`` (4.0) — 3.5: from the table's pandas frame (Arrow enabled).
"""
from __future__ import annotations

import contextlib

import pyarrow as pa


def to_arrow(df) -> pa.Table:
    """Collect a (small) DataFrame to the driver as an Arrow table."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = df._collect_as_arrow()
    schema = to_arrow_schema(df.schema)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def take_arrow(df, n: int) -> pa.Table:
    """``df``'s first ``n`` rows as an Arrow table, read as ``DataFrame.take`` reads them: the first partition,
    then more partitions only where it held too few rows (``spark.sql.limit.scaleUpFactor``). An Arrow
    collection of ``df.limit(n)`` (:func:`to_arrow`) runs the limit as a shuffle of every partition's first
    ``n`` rows instead, so it computes every partition: the 1 M-row teacher task's first-rows check started a
    Python worker on each of 4 executors for it (12.4 s in a fresh session)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        schema = to_arrow_schema(df.schema)
    except Exception:  # noqa: BLE001 - a type without an Arrow schema here (an ML vector): Spark's own conversion
        return to_arrow(df.limit(n))
    return pa.Table.from_pylist([r.asDict(recursive=True) for r in df.limit(n).collect()], schema=schema)


def collect_map_in_arrow(df, fn, schema: str, profile) -> list:
    """``df.mapInArrow(fn, schema)`` run with the resource ``profile`` and collected (Rows)."""
    import inspect

    if "profile" in inspect.signature(df.mapInArrow).parameters:
        return df.mapInArrow(fn, schema, profile=profile).collect()
    return df.mapInArrow(fn, schema).rdd.withResources(profile).collect()


@contextlib.contextmanager
def _session_conf(spark, key: str, value: str):
    """``key`` set to ``value`` on the session for the block, then back to what it was (or unset)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def dataframe_from_arrow(spark, table: pa.Table, partitions: int = 1):
    """A DataFrame of a (small, driver-side) Arrow table in ``partitions`` partitions of consecutive rows,
    backed by an RDD of its Arrow batches (one batch per partition).

    Spark 4 would turn a table below ``spark.sql.execution.arrow.localRelationThreshold`` (48 MB) into a
    local relation, whose rows every query copies again on the driver (measured: 15,000 rows kept per
    5,000-row DataFrame, and a 1 GB driver heap ran out after ~20 training runs in one session)."""
    rows_per_batch = str(max(1, -(-table.num_rows // max(1, partitions))))
    with _session_conf(spark, "spark.sql.execution.arrow.localRelationThreshold", "0"), \
            _session_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", rows_per_batch):
        try:
            return spark.createDataFrame(table)
        except (TypeError, ValueError):  # Spark 3.5: no pyarrow.Table input; from pandas through Arrow, typed
            from pyspark.sql.pandas.types import from_arrow_schema

            # off in a plain spark-submit session: rows of numpy arrays then cannot be typed
            with _session_conf(spark, "spark.sql.execution.arrow.pyspark.enabled", "true"):
                return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))
