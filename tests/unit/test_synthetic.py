"""The synthetic teacher task: rows follow from (seed, index) alone, whatever the partitioning."""
import numpy as np
import pytest

from mpca.data.synthetic import BLOCK, TeacherTask


def test_rows_are_deterministic_from_the_seed():
    ids = np.array([0, 1, BLOCK - 1, BLOCK, 3 * BLOCK + 17, 9_999])
    a, b = TeacherTask(rows=20_000, seed=3).take(ids), TeacherTask(rows=20_000, seed=3).take(ids)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    other = TeacherTask(rows=20_000, seed=4).take(ids)
    assert not np.array_equal(a[0], other[0]) and a[0].dtype == np.float32 and a[1].dtype == np.int64


def test_every_partitioning_and_order_gives_the_same_rows():
    task = TeacherTask(rows=3 * BLOCK + 500, features=8, hidden=16)
    whole_x, whole_y = task.take(np.arange(task.rows))
    parts = [task.take(np.arange(lo, hi)) for lo, hi in [(0, 1000), (1000, BLOCK + 7), (BLOCK + 7, task.rows)]]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), whole_x)
    assert np.array_equal(np.concatenate([p[1] for p in parts]), whole_y)
    shuffled = np.random.default_rng(1).permutation(task.rows)
    x, y = task.take(shuffled)
    assert np.array_equal(x, whole_x[shuffled]) and np.array_equal(y, whole_y[shuffled])
    assert len(task.block(3)[0]) == 500  # the last block is cut at the task's end


def test_labels_come_from_the_teacher_and_every_class_occurs():
    task = TeacherTask(rows=20_000)
    x, y = task.take(np.arange(task.rows))
    w1, b1, w2, b2 = task.teacher()
    assert np.array_equal(y, (np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2).argmax(1))
    share = np.bincount(y, minlength=task.classes) / len(y)
    assert share.min() > 0.03 and share.max() < 0.25, share  # centred logits: no class dominates


def test_out_of_range_rows_and_bad_shapes_are_refused():
    task = TeacherTask(rows=100)
    with pytest.raises(IndexError):
        task.take(np.array([100]))
    with pytest.raises(ValueError):
        TeacherTask(classes=1)
