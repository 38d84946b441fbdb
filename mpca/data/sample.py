"""A sample of a job's training rows read on this machine, without Spark: what ``mpca plan -c`` trains its pilot
on (:mod:`mpca.sim.noise`).  Bundled datasets, the teacher task and the pytext corpus come from the package
itself; ``data.path`` in Parquet is read with pyarrow (its first rows); a catalog table or another format has no
local reader, and the error says how to give the pilot a Parquet sample instead."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from mpca.errors import UserError

SAMPLE_ROWS = 20_000  # rows the pilot draws its batches from (at most)


def local_sample(d, rows: int = SAMPLE_ROWS) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x, y) tensors of at most ``rows`` training rows of a job's ``data`` section
    (:class:`~mpca.config.JobDataSection`), shaped as the agents see them (``data.input_shape``)."""
    from mpca.data.checks import tensors

    if d.dataset == "teacher":
        from mpca.data.synthetic import TeacherTask

        task = TeacherTask(**d.teacher.model_dump())
        x, y = task.take(np.arange(min(rows, task.rows)))
        return torch.from_numpy(x), torch.from_numpy(y)
    if d.dataset == "pytext":
        from mpca.data.sources import text_corpus

        table = text_corpus(d).table("train")
    elif d.dataset is not None:
        from mpca.data.datasets import arrow_table, load

        table = arrow_table(*load(d.dataset))
    elif d.path is not None and d.format == "parquet" and not d.feature_columns:
        table = _parquet_head(d.path, d.features, d.label, rows)
    else:
        what = f"data.table {d.table!r}" if d.path is None else f"{d.path!r} ({d.format})"
        raise UserError(f"plan: the pilot reads a sample of the rows on this machine and cannot read {what}; write a "
                        f"sample as Parquet with columns {d.features!r} and {d.label!r} and set data.path to it")
    return tensors(table.slice(0, rows), d.features, d.label, d.input_shape)


def local_holdout(d, rows: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The job's own held-out rows where it has them (pytext's held-out files, ``data.holdout_path`` in Parquet),
    at most ``rows``; None where the run splits its rows by hash (the caller sets a disjoint slice aside)."""
    from mpca.data.checks import tensors

    if d.dataset == "pytext":
        from mpca.data.sources import text_corpus

        table = text_corpus(d).table("holdout")
    elif d.holdout_path is not None and d.format == "parquet" and not d.feature_columns:
        table = _parquet_head(d.holdout_path, d.features, d.label, rows)
    else:
        return None
    if table.num_rows == 0:
        return None
    return tensors(table.slice(0, rows), d.features, d.label, d.input_shape)


def _parquet_head(path: str, features: str, label: str, rows: int):
    import pyarrow.dataset as ds

    try:
        return ds.dataset(path, format="parquet").head(rows, columns=[features, label])
    except (OSError, ValueError, KeyError) as e:  # missing path, not Parquet, a column absent (ArrowInvalid)
        first = str(e).splitlines()[0][:200]
        raise UserError(f"plan: cannot read a sample of data.path {path!r} as Parquet: {first}") from None


__all__ = ["SAMPLE_ROWS", "local_holdout", "local_sample"]
