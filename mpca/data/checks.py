"""Data and training-function checks that run on the driver before any agent starts.

Each failure is a :class:`~mpca.errors.UserError` with one line saying what is wrong and how to fix it:
an empty data set, labels outside the model's classes, a model that cannot take the rows, an output the
loss cannot use, an ``optimizer_fn`` that raises.  ``mpca train`` runs them on local Parquet data before
Spark starts (:func:`check_parquet`); the Trainer runs them on the DataFrame's first rows and one
aggregate job (:func:`check_dataframe`), before the agents' job.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from mpca.errors import UserError, error_line


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {error_line(e)}"


def check_label_range(lo: Optional[float], hi: Optional[float], rows: int, label: str) -> None:
    if rows == 0:
        raise UserError("the training data has no rows; check data.path (or the DataFrame's filters)")
    if lo is None or hi is None:
        raise UserError(f"label column {label!r} holds only nulls")
    if lo < 0:
        raise UserError(f"label column {label!r} holds negative values (min {lo:g}); class labels are 0..C-1")


def check_batch(model_fn: Callable, loss_fn: Callable, optimizer_fn: Callable, x: torch.Tensor, y: torch.Tensor,
                label_max: Optional[float] = None, input_shape: Sequence[int] = ()) -> None:
    """One forward, loss, backward and optimizer construction on a few rows, as an agent would do."""
    try:
        model = model_fn()
    except Exception as e:  # noqa: BLE001 - the user's function
        raise UserError(f"model_fn failed on the driver: {_first_line(e)}") from None
    try:
        optimizer_fn(model.parameters())
    except Exception as e:  # noqa: BLE001
        raise UserError(f"optimizer_fn failed on the model's parameters: {_first_line(e)}") from None
    try:
        out = model(x)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"the model cannot take the data's rows (shape {tuple(x.shape)}, data.input_shape "
                        f"{list(input_shape)}): {_first_line(e)}") from None
    if label_max is not None and out.dim() == 2 and not torch.is_floating_point(y) and label_max >= out.shape[1]:
        raise UserError(f"labels reach {label_max:g} but the model outputs {out.shape[1]} classes (labels must lie "
                        f"in 0..{out.shape[1] - 1}); fix the labels or the model's output size")
    try:
        loss = loss_fn(out, y)
        loss.backward()
    except Exception as e:  # noqa: BLE001
        raise UserError(f"the model's output (shape {tuple(out.shape)}) does not fit the loss with labels of shape "
                        f"{tuple(y.shape)}: {_first_line(e)}") from None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise UserError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                        f"{tuple(getattr(loss, 'shape', ()))}")


def tensors(table, features: str, label: str, input_shape: Sequence[int]):
    """Rows of an Arrow table as (x, y), with column mistakes as one line."""
    from mpca.data.arrow import batches_to_tensors

    try:
        return batches_to_tensors(table.to_batches(), features, label, input_shape)
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"the data's columns {features!r}/{label!r} cannot be read: {e}") from None


def check_columns(names: Sequence[str], features: str, label: str) -> None:
    for c in (features, label):
        if c not in names:
            raise UserError(f"column {c!r} not in the data (columns: {sorted(names)}); set data.features/data.label")


def check_parquet(path: str, features: str, label: str, input_shape: Sequence[int], model_fn: Callable,
                  loss_fn: Callable, optimizer_fn: Callable, sample_rows: int = 16) -> None:
    """Local Parquet data, read with pyarrow (no Spark): columns, rows, label range, one training batch."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    try:
        data = ds.dataset(path, format="parquet")
        names = data.schema.names
    except Exception as e:  # noqa: BLE001 - unreadable files: one line
        raise UserError(f"data.path {path!r} cannot be read as Parquet: {_first_line(e)}") from None
    check_columns(names, features, label)
    labels = data.to_table(columns=[label]).column(label)
    rows = len(labels)
    mm = pc.min_max(labels) if rows else None
    lo = mm["min"].as_py() if mm else None
    hi = mm["max"].as_py() if mm else None
    check_label_range(lo, hi, rows, label)
    sample = data.head(sample_rows, columns=[features, label])
    x, y = tensors(sample, features, label, input_shape)
    check_batch(model_fn, loss_fn, optimizer_fn, x, y, hi, input_shape)


def check_dataframe(df, features: str, label: str, input_shape: Sequence[int], model_fn: Callable,
                    loss_fn: Callable, optimizer_fn: Callable, sample_rows: int = 16) -> None:
    """A Spark DataFrame: one aggregate job (rows, label range) and its first rows through the model."""
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.lit(1)).alias("n"), F.min(label).alias("lo"), F.max(label).alias("hi")).collect()[0]
    check_label_range(row["lo"], row["hi"], int(row["n"]), label)
    from mpca.compat import to_arrow

    sample = to_arrow(df.select(features, label).limit(sample_rows))
    x, y = tensors(sample, features, label, input_shape)
    check_batch(model_fn, loss_fn, optimizer_fn, x, y, row["hi"], input_shape)
