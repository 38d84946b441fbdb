"""Arrow record batches → torch tensors, without pandas and without collecting to the driver."""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch


class UnreadableRows(ValueError):
    """Rows whose feature or label column cannot become tensors (the user's data to fix: one line)."""


def _column_values(col: pa.Array) -> Tuple[np.ndarray, int]:
    """Flatten a (possibly nested) list column into its numeric values and the row width."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if is_list(col.type):
        if col.null_count:
            raise UnreadableRows("feature column contains null rows")
        flat = col.flatten()
        if pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
            flat = flat.flatten()
        values = flat.to_numpy(zero_copy_only=False)
        width = len(values) // len(col) if len(col) else 0
        lengths = pc.min_max(pc.list_value_length(col))  # the rows' own lengths: equal totals can hide ragged rows
        if width * len(col) != len(values) or lengths["min"] != lengths["max"]:
            raise UnreadableRows("arrays have different lengths across rows (ragged): every row needs as many "
                                 "values (pad or cut the sequences to one length)")
        return values, width
    if pa.types.is_floating(col.type) or pa.types.is_integer(col.type):
        return col.to_numpy(zero_copy_only=False), 1
    raise UnreadableRows(f"unsupported feature column type {col.type}; use array<float> (or a vector column)")


def label_dtype(labels: np.ndarray) -> np.dtype:
    """How labels are kept for training: integer labels as int64 (class indices), any others as float32."""
    return np.dtype(np.int64 if np.issubdtype(labels.dtype, np.integer) else np.float32)


def batch_arrays(b: pa.RecordBatch, features: str, label: str,
                 input_shape: Sequence[int]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """One record batch as (float32 features reshaped to ``(rows, *input_shape)``, labels); None if empty."""
    if b.num_rows == 0:
        return None
    values, width = _column_values(b.column(b.schema.get_field_index(features)))
    expected = int(np.prod(input_shape)) if input_shape else width
    if width != expected:
        raise UnreadableRows(f"rows of {features!r} have {width} values but input_shape {tuple(input_shape)} needs "
                             f"{expected}")
    x = values.astype(np.float32, copy=False).reshape(b.num_rows, *(input_shape or (width,)))
    labels = b.column(b.schema.get_field_index(label))
    if labels.null_count:
        raise UnreadableRows(f"label column {label!r} holds nulls ({labels.null_count} of {b.num_rows} rows in a batch); "
                             "drop or fill those rows")
    if is_list(labels.type):  # a label per position (a sequence's next tokens): (rows, width)
        values, width = _column_values(labels)
        return x, values.reshape(b.num_rows, width)
    return x, labels.to_numpy(zero_copy_only=False)


def is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def concat_arrays(arrays: List[Tuple[np.ndarray, np.ndarray]],
                  input_shape: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Batches from :func:`batch_arrays` as one (features, labels) pair of tensors (labels: :func:`label_dtype`)."""
    if not arrays:
        shape = (0, *(input_shape or (0,)))
        return torch.zeros(shape, dtype=torch.float32), torch.zeros(0, dtype=torch.int64)
    x = torch.from_numpy(np.concatenate([a for a, _ in arrays]))
    y = np.concatenate([b for _, b in arrays])
    return x, torch.from_numpy(y.astype(label_dtype(y)))


def batches_to_tensors(batches: Iterable[pa.RecordBatch], features: str, label: str,
                       input_shape: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Concatenate record batches into (features reshaped to ``(n, *input_shape)``, labels)."""
    arrays = [a for a in (batch_arrays(b, features, label, input_shape) for b in batches) if a is not None]
    return concat_arrays(arrays, input_shape)
