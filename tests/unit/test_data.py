import numpy as np
import pyarrow as pa
import pytest

from mpca.data.arrow import batches_to_tensors
from mpca.data.datasets import arrow_table, load_digits, load_mnist5k


def test_bundled_datasets_load_offline():
    x, y = load_digits()
    assert x.shape == (1797, 64) and 0 <= x.min() and x.max() <= 1 and set(np.unique(y)) == set(range(10))
    x, y = load_mnist5k()
    assert x.shape == (5000, 784) and x.max() <= 1 and set(np.unique(y)) == set(range(10))


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
