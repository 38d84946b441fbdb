"""The few PySpark calls whose API changed between Spark 3.5 and 4.x, behind one function each.

Spark 3.5 (Databricks 15.x/16.x LTS, Cloudera CDP 7.3) lacks three 4.0 APIs mpca uses:

* ``DataFrame.toArrow()`` (4.0) — 3.5: ``DataFrame._collect_as_arrow()``, the same Arrow batches;
* ``DataFrame.mapInArrow(..., profile=)`` (4.0) — 3.5: the stage-level scheduling of the agents' job goes
  through ``.rdd.withResources(profile)`` on the same stage (3.1+);
* ``SparkSession.createDataFrame(pyarrow.Table)`` (4.0) — 3.5: from the table's pandas frame (Arrow enabled).
"""
from __future__ import annotations

import pyarrow as pa


def to_arrow(df) -> pa.Table:
    """Collect a (small) DataFrame to the driver as an Arrow table."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = df._collect_as_arrow()
    schema = to_arrow_schema(df.schema)
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def collect_map_in_arrow(df, fn, schema: str, profile) -> list:
    """``df.mapInArrow(fn, schema)`` run with the resource ``profile`` and collected (Rows)."""
    import inspect

    if "profile" in inspect.signature(df.mapInArrow).parameters:
        return df.mapInArrow(fn, schema, profile=profile).collect()
    return df.mapInArrow(fn, schema).rdd.withResources(profile).collect()


def dataframe_from_arrow(spark, table: pa.Table):
    """A DataFrame of a (small, driver-side) Arrow table."""
    try:
        return spark.createDataFrame(table)
    except (TypeError, ValueError):  # Spark 3.5: no pyarrow.Table input; from pandas through Arrow, typed
        from pyspark.sql.pandas.types import from_arrow_schema

        key = "spark.sql.execution.arrow.pyspark.enabled"  # off in a plain spark-submit session: rows of
        before = spark.conf.get(key, None)                  # numpy arrays then cannot be typed
        spark.conf.set(key, "true")
        try:
            return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))
        finally:
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)
