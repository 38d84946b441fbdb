"""Where a job's training rows come from: a bundled dataset, the synthetic teacher task generated on the
executors, a path Spark reads with ``data.format``, or a catalog table (the ``data`` section of a job)."""
from __future__ import annotations

from typing import Optional

from mpca.errors import UserError, error_line


def job_dataframe(spark, d, agents: int = 1):
    """The DataFrame of a job's ``data`` section (:class:`~mpca.config.JobDataSection`) for ``agents`` agents.

    Rows the job generates (the teacher task, a bundled dataset) come in ``data.partitions`` partitions, or one
    per agent where there are more agents: the agents' job then coalesces them without a shuffle
    (:func:`mpca.runtime.agent_job.balanced`): each agent reads a contiguous slice, no agent's start waits for
    a shuffle of every row, and an executor lost mid-run retries its own agent instead of every agent (a
    shuffle's map outputs die with it).  A path or table keeps its own layout."""
    from mpca.data.datasets import dataset_dataframe

    partitions = max(d.partitions, agents)
    if d.dataset == "teacher":
        from mpca.data.synthetic import TeacherTask

        return TeacherTask(**d.teacher.model_dump()).dataframe(spark, partitions)
    if d.dataset == "pytext":
        from mpca.compat import dataframe_from_arrow

        return dataframe_from_arrow(spark, text_corpus(d).table("train"), partitions)
    if d.dataset is not None:
        return dataset_dataframe(spark, d.dataset, partitions)
    return read_source(spark, d)


def job_holdout(spark, d):
    """The rows a job scores on where it has its own (``data.dataset: pytext``'s files set aside,
    ``data.holdout_path``), else None: the trainer splits ``data.holdout`` of the rows by their hash."""
    if d.dataset == "pytext":
        from mpca.compat import dataframe_from_arrow

        return dataframe_from_arrow(spark, text_corpus(d).table("holdout"), 1)
    if d.holdout_path is not None:
        return read_source(spark, d, path=d.holdout_path)
    return None


def text_corpus(d):
    """The :class:`~mpca.data.text.TextCorpus` of a job's ``data`` section (``data.text``, ``data.holdout``); its
    file split does not follow the run's seed: every run of a corpus scores on the same files."""
    from mpca.data.text import TextCorpus

    t = d.text
    return TextCorpus(root=t.root, window=t.window, holdout=d.holdout, max_mb=t.max_mb, suffix=t.suffix)


def read_source(spark, d, path: Optional[str] = None, scoring: bool = False):
    """The DataFrame of ``data.path`` (or ``path``) read with ``data.format`` and ``data.options``, or of
    ``data.table``; with ``data.feature_columns`` those columns become the ``data.features`` array (for
    ``scoring``: added beside every column, no label needed; for training: features and label only).
    A source Spark cannot read is one line naming it and what to fix."""
    from pyspark.sql import functions as F

    path = path or d.path
    what = f"data.table {d.table!r}" if path is None else f"{path!r} as {d.format}"
    try:
        df = spark.table(d.table) if path is None else spark.read.format(d.format).options(**d.options).load(path)
        columns = df.columns
    except Exception as e:  # noqa: BLE001 - Spark's AnalysisException, a missing data source: the user must fix
        first = error_line(e, 200)
        hint = (f"; data.format {d.format!r} needs its package on the cluster (e.g. delta-spark for delta)"
                if "data source" in first.lower() or "DATA_SOURCE_NOT_FOUND" in first else "")
        raise UserError(f"cannot read {what}: {first}{hint}") from None
    if d.feature_columns:
        missing = [c for c in [*d.feature_columns, *([] if scoring else [d.label])] if c not in columns]
        if missing:
            raise UserError(f"data.feature_columns/label: {missing} not among the columns of {what} "
                            f"({', '.join(columns[:20])}{', ...' if len(columns) > 20 else ''})")
        features = F.array(*[F.col(c).cast("float") for c in d.feature_columns])
        df = df.withColumn(d.features, features) if scoring else df.select(features.alias(d.features), F.col(d.label))
    return df
