"""Data and training-function checks that run on the driver before any agent starts.

Each failure is a :class:`~mpca.errors.UserError` with one line saying what is wrong and how to fix it:
an empty data set, labels outside the model's classes, a model that cannot take the rows, an output the
loss cannot use, an ``optimizer_fn`` that raises.  ``mpca train`` runs them on local Parquet data before
Spark starts (:func:`check_parquet`); the Trainer runs them on the DataFrame's first rows and one
aggregate job (:func:`check_dataframe`), before the agents' job.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Sequence

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


MAX_COUNTED_CLASSES = 10_000  # labels with more distinct values are not counted per class
SKEW_TOLERANCE = 0.2  # total variation between one agent's labels and all rows' labels before a warning


def label_counts(labels: torch.Tensor) -> Optional[Dict[str, int]]:
    """Rows per class of integer labels (keys as strings: they travel in a JSON header); None for other labels
    (regression targets) or more than ``MAX_COUNTED_CLASSES`` distinct values."""
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.dim() != 1 or len(labels) == 0:
        return None
    values, counts = torch.unique(labels.detach().cpu(), return_counts=True)
    if len(values) > MAX_COUNTED_CLASSES:
        return None
    return {str(int(v)): int(c) for v, c in zip(values, counts)}


def label_skew(per_agent: Mapping[int, Optional[Mapping[str, int]]],
               tolerance: float = SKEW_TOLERANCE) -> Optional[str]:
    """One warning line when some agent's class mix differs from all rows' mix by more than ``tolerance`` in
    total variation, ½ Σ_c |p_agent(c) − p_all(c)| (0: the same mix, 1: disjoint classes) — the data is then
    probably ordered by label and each agent learns its own slice of the classes.  None otherwise."""
    counts = {a: c for a, c in per_agent.items() if c}
    if len(counts) < 2:
        return None
    pooled: Dict[str, int] = {}
    for c in counts.values():
        for k, n in c.items():
            pooled[k] = pooled.get(k, 0) + n
    total = sum(pooled.values())

    def distance(c: Mapping[str, int]) -> float:
        rows = sum(c.values())
        return 0.5 * sum(abs(c.get(k, 0) / rows - n / total) for k, n in pooled.items())

    worst = max(counts, key=lambda a: distance(counts[a]))
    d = distance(counts[worst])
    if d <= tolerance:
        return None
    return (f"the agents' data differ in their labels: agent {worst} holds {len(counts[worst])} of the "
            f"{len(pooled)} labels (total variation {d:.2f} from all rows), so each agent learns its own slice "
            "of the classes — the data is probably ordered by label: set data.shuffle: true (or write it "
            "shuffled)")


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
