import numpy as np
import pyarrow as pa
import pytest

import torch

from mpca.data.arrow import batches_to_tensors
from mpca.data.checks import label_counts, label_skew
from mpca.data.datasets import arrow_table, load_digits, load_mnist5k


def test_bundled_datasets_load_offline():
    x, y = load_digits()
    assert x.shape == (1797, 64) and 0 <= x.min() and x.max() <= 1 and set(np.unique(y)) == set(range(10))
    x, y = load_mnist5k()
    assert x.shape == (5000, 784) and x.max() <= 1 and set(np.unique(y)) == set(range(10))


def test_every_contiguous_quarter_of_a_bundled_dataset_holds_every_class():
    # agents get whole partitions (coalesced): a dataset stored sorted by label would give each its own classes
    for x, y in (load_digits(), load_mnist5k()):
        for q in np.array_split(y, 4):
            assert set(np.unique(q)) == set(range(10))
    assert load_mnist5k()[1].tolist() == load_mnist5k()[1].tolist()  # one fixed order


def test_label_counts_count_integer_classes_only():
    assert label_counts(torch.tensor([3, 1, 3, 3])) == {"1": 1, "3": 3}
    assert label_counts(torch.tensor([0.5, 1.5])) is None  # a regression target
    assert label_counts(torch.zeros(0, dtype=torch.int64)) is None
    assert label_counts(torch.arange(20_000)) is None  # too many distinct values to be classes


def test_label_skew_is_the_total_variation_from_all_rows_mix():
    # agent 0: classes 0,1 (50/50); agent 1: 0,1,2,3 (25 each) -> all rows: 0: 3/8, 1: 3/8, 2: 1/8, 3: 1/8
    # agent 0's distance: ½ (|1/2 − 3/8|·2 + |0 − 1/8|·2) = ½ · (1/4 + 1/4) = 0.25; agent 1's: ½ · 4 · 1/8 = 0.25
    split = {0: {"0": 50, "1": 50}, 1: {"0": 25, "1": 25, "2": 25, "3": 25}}
    msg = label_skew(split, tolerance=0.2)
    assert msg is not None and "agent 0 holds 2 of the 4 labels (total variation 0.25" in msg
    assert "data.shuffle: true" in msg
    assert label_skew(split, tolerance=0.25) is None  # exactly at the tolerance: no warning
    sorted_halves = {0: {"0": 10, "1": 10}, 1: {"2": 10, "3": 10}}  # disjoint classes: distance ½
    assert "total variation 0.50" in label_skew(sorted_halves)
    assert label_skew({0: {"0": 10, "1": 12}, 1: {"0": 11, "1": 10}}) is None  # the same mix, up to noise
    assert label_skew({0: {"0": 10}, 1: None}) is None  # regression labels: nothing to compare


def test_arrow_batches_to_tensors_reshape_and_types():
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)
    t = arrow_table(x, np.array([3, 7]))
    fx, fy = batches_to_tensors(t.to_batches(max_chunksize=1), "features", "label", (1, 8, 8))
    assert fx.shape == (2, 1, 8, 8) and fx[1, 0, 0, 1].item() == 65 and fy.tolist() == [3, 7]
    ex, ey = batches_to_tensors([], "features", "label", (1, 8, 8))
    assert ex.shape == (0, 1, 8, 8) and ey.shape == (0,)


def test_wrong_width_is_a_clear_error():
    t = arrow_table(np.zeros((2, 10), dtype=np.float32), np.array([0, 1]))
    with pytest.raises(ValueError, match="have 10 values but input_shape"):
        batches_to_tensors(t.to_batches(), "features", "label", (1, 8, 8))
    bad = pa.table({"features": pa.array(["a"]), "label": pa.array([1])})
    with pytest.raises(ValueError, match="unsupported feature column"):
        batches_to_tensors(bad.to_batches(), "features", "label", (1,))


def test_null_labels_are_unreadable_rows_not_nan_targets():
    from mpca.data.arrow import UnreadableRows

    t = pa.table({"features": pa.array([[1.0, 2.0], [3.0, 4.0]]), "label": pa.array([1, None], type=pa.int64())})
    with pytest.raises(UnreadableRows, match="label column 'label' holds nulls \\(1 of 2 rows"):
        batches_to_tensors(t.to_batches(), "features", "label", (2,))


def test_the_schema_check_reads_no_row_and_returns_the_class_count_of_integer_labels():
    """:func:`check_schema`: the columns' Spark types and a batch of zeros through the training functions —
    a class count for integer labels, None for float targets, one line for each mistake."""
    from pyspark.sql.types import (ArrayType, DoubleType, FloatType, LongType, StringType, StructField,
                                   StructType)

    from mpca.data.checks import check_schema
    from mpca.errors import UserError

    def schema(features, label):
        return StructType([StructField("features", features), StructField("label", label)])

    def adam(p):
        return torch.optim.Adam(p)

    def check(s, model=lambda: torch.nn.Linear(4, 3), loss=torch.nn.functional.cross_entropy, shape=(4,)):
        return check_schema(s, "features", "label", shape, model, loss, adam)

    assert check(schema(ArrayType(FloatType()), LongType())) == 3
    assert check(schema(ArrayType(ArrayType(DoubleType())), LongType()), shape=(2, 2),
                 model=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))) == 3
    mse = lambda out, y: torch.nn.functional.mse_loss(out.squeeze(1), y)  # noqa: E731
    assert check(schema(ArrayType(FloatType()), DoubleType()), model=lambda: torch.nn.Linear(4, 1), loss=mse) is None
    with pytest.raises(UserError, match="cannot be read: unsupported feature column type string"):
        check(schema(StringType(), LongType()))
    with pytest.raises(UserError, match="unsupported label column type string"):
        check(schema(ArrayType(FloatType()), ArrayType(StringType())))  # an array's elements are checked too
    # integer labels per position (a sequence model's next tokens): the class count is the output's last axis
    per_token = lambda: torch.nn.Sequential(torch.nn.Unflatten(1, (4, 1)), torch.nn.Linear(1, 7))  # noqa: E731
    assert check(schema(ArrayType(FloatType()), ArrayType(LongType())), model=per_token,
                 loss=lambda out, y: torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())) == 7
    with pytest.raises(UserError, match="does not fit the loss with labels of shape \\(2, 4\\)"):
        check(schema(ArrayType(FloatType()), ArrayType(LongType())))  # one output per row, labels per position
    with pytest.raises(UserError, match="the model cannot take the data's rows \\(shape \\(2, 5\\)"):
        check(schema(ArrayType(FloatType()), LongType()), shape=(5,))
    with pytest.raises(UserError, match="does not fit the loss"), pytest.warns(UserWarning, match="target size"):
        check(schema(ArrayType(FloatType()), LongType()), loss=mse)  # torch warns of the broadcast, then refuses it


def test_the_holdout_is_the_hash_buckets_below_its_fraction():
    from mpca.data.split import BUCKETS, holdout_cut

    assert holdout_cut(0.01) == BUCKETS // 100 and holdout_cut(0.0) == 0
    with pytest.raises(ValueError):
        holdout_cut(1.0)


def test_an_agent_refuses_labels_below_zero_or_past_the_models_classes_in_one_line():
    import torch

    from mpca.data.checks import labels_problem

    assert labels_problem(torch.tensor([0, 3, 9]), 10, "label") is None
    assert labels_problem(torch.tensor([0, 3, 29]), 10, "label").startswith("labels reach 29 but the model outputs 10")
    assert "negative values (min -1)" in labels_problem(torch.tensor([-1, 2]), 10, "y")
    assert labels_problem(torch.tensor([0.5, 40.0]), None, "label") is None  # regression targets: no class count
    assert labels_problem(torch.tensor([], dtype=torch.int64), 10, "label") is None  # an empty partition
    assert labels_problem(torch.tensor([-2.5, 40.0]), None, "label") is None  # regression: negatives too


def test_negative_regression_targets_pass_the_drivers_checks_and_negative_class_labels_do_not(tmp_path):
    """Labels are held to 0..C-1 only when they are class indices (the model's first batch says so): a
    regression target may be negative."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from mpca.data.checks import check_parquet
    from mpca.errors import UserError

    def write(name, labels):
        rows = len(labels)
        table = pa.table({"features": pa.array([[float(i), 1.0, -1.0] for i in range(rows)]), "label": labels})
        pq.write_table(table, str(tmp_path / name))
        return str(tmp_path / name)

    def run(path, model, loss):
        return check_parquet(path, "features", "label", (3,), lambda: model, loss,
                             lambda p: torch.optim.SGD(p, lr=0.1))

    targets = write("targets.parquet", pa.array([-3.5, 0.25, -0.5, 2.0], type=pa.float32()))
    run(targets, torch.nn.Linear(3, 1), lambda out, y: torch.nn.functional.mse_loss(out.squeeze(1), y))
    classes = write("classes.parquet", pa.array([1, -1, 0, 2], type=pa.int64()))
    with pytest.raises(UserError, match="holds negative values \\(min -1\\)"):
        run(classes, torch.nn.Linear(3, 4), torch.nn.functional.cross_entropy)


# Spark 4.3.0's F.xxhash64(F.lit(seed), "features", "label") on these rows (features array<float> without
# nulls, label bigint), collected from a local session: the values the numpy hash must give.
SPARK_XXHASH64 = {
    0: [-2640644109883805695, -2640644109883805695, 5287669204069805211, -2984540310115537990, -6054464427634985029],
    1: [6932476897473192484, 6932476897473192484, 5240573857041544428, -4698198733687874474, 8012336215753807535],
}
HASHED_ROWS = [([0.0, 1.5, -2.25], 3), ([-0.0, 1.5, -2.25], 3), ([float("nan"), 1e-30, 3.4e38], -7), ([], 0),
               ([1.0], 9)]


def test_the_numpy_row_hash_is_sparks_xxhash64_including_negative_zero_nan_and_empty_arrays():
    """mpca.data.xxhash recomputes hash_split's hash without a JVM (the simulator's holdout)."""
    from mpca.data.xxhash import row_hash

    for seed, expected in SPARK_XXHASH64.items():
        got = [int(row_hash(seed, np.array(f, np.float32).reshape(1, -1), np.array([y]))[0]) for f, y in HASHED_ROWS]
        assert got == expected, seed


def test_the_evaluated_holdout_rows_are_those_of_the_smallest_signed_row_hash():
    """mpca.data.split.evaluation_subset, against Spark's own hashes of three rows (SPARK_XXHASH64): seed 0 puts
    the two equal rows (0.0 and -0.0) first, seed 1 the NaN row (5.24e18 < 6.93e18); the numpy order is the
    signed order Spark's orderBy uses (seed 0's smallest hash is negative)."""
    from mpca.data.split import evaluation_subset

    x = np.array([f for f, _ in HASHED_ROWS[:3]], np.float32)
    y = np.array([label for _, label in HASHED_ROWS[:3]])
    assert evaluation_subset(x, y, 0, 2).tolist() == [0, 1] and evaluation_subset(x, y, 0, 10).tolist() == [0, 1, 2]
    assert evaluation_subset(x, y, 1, 1).tolist() == [2] and evaluation_subset(x, y, 1, 3).tolist() == [2, 0, 1]


def test_holdout_mask_takes_the_rows_whose_bucket_is_below_the_cut():
    from mpca.data.split import BUCKETS, holdout_cut, holdout_mask
    from mpca.data.xxhash import row_hash

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20_000, 4)).astype(np.float32), rng.integers(0, 10, 20_000)
    mask = holdout_mask(x, y, 0.1, 5)
    buckets = np.mod(row_hash(5, x, y), BUCKETS)  # pmod: a negative hash lands in [0, BUCKETS) too
    assert buckets.min() >= 0 and np.array_equal(mask, buckets < holdout_cut(0.1))
    assert 1_800 <= mask.sum() <= 2_200 and not np.array_equal(mask, holdout_mask(x, y, 0.1, 6))
