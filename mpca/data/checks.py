"""Data and training-function checks: on the driver before any agent starts, and by each agent on its rows.

Each failure is a :class:`~mpca.errors.UserError` with one line saying what is wrong and how to fix it:
an empty data set, labels outside the model's classes, a model that cannot take the rows, an output the
loss cannot use, an ``optimizer_fn`` that raises.  ``mpca train`` runs them on local Parquet data before
Spark starts (:func:`check_parquet`); the Trainer checks a DataFrame's schema and the training functions on a
batch of zeros before the agents' job (:func:`check_schema`; on its first rows, :func:`check_dataframe` with
``full=False``, where no ``data.input_shape`` is given), and every agent checks all its rows as they arrive
(:func:`labels_problem`, :class:`~mpca.data.arrow.UnreadableRows`): no pass over the whole data set before
training — that pass was a
second read of every row (measured: 3.1–3.6 s of the 1 M-row benchmark task's start-up on this machine) and
grows with the data.  A dry run (``mpca train --dry-run``) still aggregates every row on the driver.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

from mpca.errors import UserError, error_line


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {error_line(e)}"


NO_ROWS = "the training data has no rows; check data.path (or the DataFrame's filters)"


def check_label_range(lo: Optional[float], hi: Optional[float], rows: int, label: str) -> None:
    """Rows and labels there at all; whether they fit the model is :func:`labels_outside`'s, once the model's
    first batch (:func:`check_batch`) has said whether they are class indices."""
    if rows == 0:
        raise UserError(NO_ROWS)
    if lo is None or hi is None:
        raise UserError(f"label column {label!r} holds only nulls")


def labels_outside(lo: float, hi: float, label: str, classes: Optional[int]) -> Optional[str]:
    """The one line for class-index labels (the model outputs ``classes`` scores) outside 0..classes-1, or
    None; labels that are not class indices (``classes`` None: regression targets) may take any value."""
    if classes is None:
        return None
    if lo < 0:
        return f"label column {label!r} holds negative values (min {lo:g}); class labels are 0..C-1"
    if hi >= classes:
        return (f"labels reach {hi:g} but the model outputs {classes} classes (labels must lie in 0..{classes - 1}); "
                "fix the labels or the model's output size")
    return None


def labels_problem(labels: torch.Tensor, classes: Optional[int], label: str) -> Optional[str]:
    """What is wrong with the labels of an agent's rows (all of them, as loaded), or None; ``classes`` is the
    model's output width when labels are class indices (:func:`check_batch`), else None."""
    if labels.numel() == 0:
        return None
    return labels_outside(float(labels.min()), float(labels.max()), label, classes)


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
                label_range: Optional[Tuple[float, float]] = None, label: str = "label",
                input_shape: Sequence[int] = ()) -> Optional[int]:
    """One forward, loss, backward and optimizer construction on a few rows, as an agent would do; returns
    the model's class count when the labels are class indices (None for other labels), after checking
    ``label_range`` (the labels' min and max over the rows checked) against it."""
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
    # class indices: one per row (output (n, C)) or one per position of a sequence (labels (n, T), output (n, T, C))
    classes = (int(out.shape[-1]) if out.dim() == y.dim() + 1 and out.dim() in (2, 3)
               and not torch.is_floating_point(y) else None)
    problem = labels_outside(*label_range, label, classes) if label_range is not None else None
    if problem:
        raise UserError(problem)
    try:
        loss = loss_fn(out, y)
        loss.backward()
    except Exception as e:  # noqa: BLE001
        raise UserError(f"the model's output (shape {tuple(out.shape)}) does not fit the loss with labels of shape "
                        f"{tuple(y.shape)}: {_first_line(e)}") from None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise UserError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} "
                        f"{tuple(getattr(loss, 'shape', ()))}")
    return classes


def unreadable(features: str, label: str, why) -> str:
    """The one line for rows whose columns cannot become tensors (on the driver or in an agent)."""
    return f"the data's columns {features!r}/{label!r} cannot be read: {why}"


def found_in_agent(line: str, agent: int) -> str:
    """A problem with an agent's rows, naming the agent (its rows are its partitions of the data)."""
    return f"{line} (found in agent {agent}'s rows)"


def tensors(table, features: str, label: str, input_shape: Sequence[int]):
    """Rows of an Arrow table as (x, y), with column mistakes as one line."""
    from mpca.data.arrow import batches_to_tensors

    try:
        return batches_to_tensors(table.to_batches(), features, label, input_shape)
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(unreadable(features, label, e)) from None


def check_schema(schema, features: str, label: str, input_shape: Sequence[int], model_fn: Callable,
                 loss_fn: Callable, optimizer_fn: Callable) -> Optional[int]:
    """A Spark DataFrame checked without reading a row: its columns' types, and a batch of zeros shaped as
    ``input_shape`` (labels of the label column's kind) through the model, the loss and the optimizer, as
    :func:`check_batch`.  Returns the model's class count for integer labels, else None.  The rows' values
    (their widths, nulls, label range, whether there are any) are the agents' to check as they load them.

    Reading the first rows on the driver was a job of its own before the agents' job.  Where the rows come
    out of a Python worker (a ``mapInArrow``, a Python UDF), that job leaves the worker with output nobody
    reads, and PySpark drops it instead of returning it to the executor's pool: the agent that executor
    runs next forked a fresh one and imported its modules again, the last agent up 2.5 s after the others
    (docs/notes/measurements.md, "Start-up")."""
    from pyspark.sql.types import ArrayType, BooleanType, IntegralType, NumericType

    f_type, l_type = schema[features].dataType, schema[label].dataType
    sequence = isinstance(l_type, ArrayType)  # a label per position: as many as the features have
    l_type = l_type.elementType if sequence else l_type
    values = f_type
    for _ in range(2):  # an array of numbers, or of arrays of numbers (images), as mpca.data.arrow reads them
        values = values.elementType if isinstance(values, ArrayType) else values
    if not isinstance(values, NumericType):
        raise UserError(unreadable(features, label, f"unsupported feature column type {f_type.simpleString()}; "
                                                    "use array<float> (or a vector column)"))
    if not isinstance(l_type, (NumericType, BooleanType)):
        raise UserError(unreadable(features, label, f"unsupported label column type {l_type.simpleString()}; use "
                                                    "integers for class indices (an array of them: one per "
                                                    "position) or floats for regression targets"))
    x = torch.zeros((2, *input_shape), dtype=torch.float32)
    y = torch.zeros((2, *(input_shape if sequence else ())),
                    dtype=torch.int64 if isinstance(l_type, IntegralType) else torch.float32)
    return check_batch(model_fn, loss_fn, optimizer_fn, x, y, None, label, input_shape)


def check_columns(names: Sequence[str], features: str, label: str) -> None:
    for c in (features, label):
        if c not in names:
            raise UserError(f"column {c!r} not in the data (columns: {sorted(names)}); set data.features/data.label")


def check_parquet(path: str, features: str, label: str, input_shape: Sequence[int], model_fn: Callable,
                  loss_fn: Callable, optimizer_fn: Callable, sample_rows: int = 16) -> None:
    """Local Parquet data, read with pyarrow (no Spark): columns, rows, label range, one training batch."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from mpca.data.arrow import is_list

    try:
        data = ds.dataset(path, format="parquet")
        names = data.schema.names
    except Exception as e:  # noqa: BLE001 - unreadable files: one line
        raise UserError(f"data.path {path!r} cannot be read as Parquet: {_first_line(e)}") from None
    check_columns(names, features, label)
    labels = data.to_table(columns=[label]).column(label)
    rows = len(labels)
    if rows and is_list(labels.type):  # a label per position: the range of all of them
        labels = pc.list_flatten(labels)
    mm = pc.min_max(labels) if rows else None
    lo = mm["min"].as_py() if mm else None
    hi = mm["max"].as_py() if mm else None
    check_label_range(lo, hi, rows, label)
    sample = data.head(sample_rows, columns=[features, label])
    x, y = tensors(sample, features, label, input_shape)
    check_batch(model_fn, loss_fn, optimizer_fn, x, y, (lo, hi), label, input_shape)
    vocab = getattr(model_fn(), "vocab_size", None)  # a language model reads its features as token ids
    if vocab is not None:
        values = data.to_table(columns=[features]).column(features)
        mm = pc.min_max(pc.list_flatten(values) if is_list(values.type) else values)
        problem = tokens_outside(mm["min"].as_py(), mm["max"].as_py(), features, int(vocab))
        if problem:
            raise UserError(problem)


def tokens_outside(lo: float, hi: float, features: str, vocab: int) -> Optional[str]:
    """The one line for token ids outside a language model's vocabulary 0..vocab-1, or None."""
    if lo < 0 or hi >= vocab:
        return (f"token ids in {features!r} reach {lo:g}..{hi:g} but the model's vocabulary is 0..{vocab - 1} "
                "(model.args.vocab_size): re-encode the text or raise vocab_size")
    return None


def check_dataframe(df, features: str, label: str, input_shape: Sequence[int], model_fn: Callable,
                    loss_fn: Callable, optimizer_fn: Callable, sample_rows: int = 16, full: bool = True,
                    label_rows: int = 1024) -> Optional[int]:
    """A Spark DataFrame's first rows through the model, and its label range: of every row (``full``: one
    aggregate job, a pass over all the data) or of the first ``label_rows`` (the agents then check all their
    rows: :func:`labels_problem`).  Returns the model's class count for class-index labels, else None."""
    from pyspark.sql import functions as F

    from mpca.compat import take_arrow

    from pyspark.sql.types import ArrayType

    if full:
        sequence = isinstance(df.schema[label].dataType, ArrayType)  # labels per position: their range
        lo_col, hi_col = (F.array_min(label), F.array_max(label)) if sequence else (F.col(label), F.col(label))
        row = df.agg(F.count(F.lit(1)).alias("n"), F.min(lo_col).alias("lo"), F.max(hi_col).alias("hi")).collect()[0]
        lo, hi, rows = row["lo"], row["hi"], int(row["n"])
        sample = take_arrow(df.select(features, label), sample_rows)
    else:
        sample = take_arrow(df.select(features, label), max(sample_rows, label_rows))
        ys = [v for v in sample.column(label).to_pylist() if v is not None]
        ys = [u for v in ys for u in v] if ys and isinstance(ys[0], list) else ys  # labels per position
        (lo, hi), rows = (min(ys), max(ys)) if ys else (None, None), sample.num_rows
        sample = sample.slice(0, sample_rows)
    check_label_range(lo, hi, rows, label)
    x, y = tensors(sample, features, label, input_shape)
    return check_batch(model_fn, loss_fn, optimizer_fn, x, y, (lo, hi), label, input_shape)
