"""An agent's partition beyond its memory budget: spilled once to local disk, memory-mapped, memory flat."""
import gc
import os

import numpy as np
import pyarrow as pa
import pytest
import torch

from mpca.data.arrow import batches_to_tensors
from mpca.data.spill import load_partition

WIDTH = 1024  # float32 values per row: 4 KB


def _batches(count: int, rows: int = 512, labels=pa.int32()):
    """``count`` record batches of ``rows`` rows (2 MB each), made one at a time as Spark hands them over."""
    for i in range(count):
        start = i * rows
        values = (np.arange(start * WIDTH, (start + rows) * WIDTH, dtype=np.float32) % 997.0)
        feats = pa.FixedSizeListArray.from_arrays(pa.array(values), WIDTH)
        yield pa.RecordBatch.from_arrays([feats, pa.array(np.arange(start, start + rows) % 10, type=labels)],
                                         names=["features", "label"])


def _rss_anon_mb() -> float:
    """The process's anonymous resident memory (its own heap, not file pages of a memory map)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status RssAnon on this system")


def test_within_the_budget_rows_stay_in_memory_as_before():
    part = load_partition(_batches(3), "features", "label", [WIDTH], budget_mb=100)
    x, y = batches_to_tensors(_batches(3), "features", "label", [WIDTH])
    assert not part.spilled and torch.equal(part.features, x) and torch.equal(part.labels, y)


def test_beyond_the_budget_the_same_rows_are_read_from_local_disk_and_removed_at_the_end(tmp_path):
    part = load_partition(_batches(3), "features", "label", [WIDTH], budget_mb=1, directory=str(tmp_path))
    x, y = batches_to_tensors(_batches(3), "features", "label", [WIDTH])
    assert part.spilled and part.rows == 3 * 512
    assert torch.equal(part.features, x) and torch.equal(part.labels, y) and part.labels.dtype == torch.int64
    files = sorted(os.listdir(part.directory))
    assert files == ["features.f32", "labels.int64"]
    assert os.path.getsize(os.path.join(part.directory, "features.f32")) == 3 * 512 * WIDTH * 4
    idx = torch.tensor([5, 700, 1500])
    assert torch.equal(part.features[idx], x[idx])  # what the training loop does
    part.close()
    assert os.listdir(tmp_path) == []
    floats = load_partition(_batches(1, labels=pa.float64()), "features", "label", [32, 32], budget_mb=0,
                            directory=str(tmp_path))
    assert floats.labels.dtype == torch.float32 and floats.features.shape == (512, 32, 32)
    floats.close()


def test_a_bad_batch_while_spilling_leaves_no_files(tmp_path):
    def bad():
        yield from _batches(2)
        yield pa.RecordBatch.from_arrays([pa.array([1.0, 2.0]), pa.array([0, 1])], names=["features", "label"])

    with pytest.raises(ValueError, match="input_shape"):
        load_partition(bad(), "features", "label", [WIDTH], budget_mb=1, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_partition_ten_times_the_budget_trains_with_flat_memory(tmp_path):
    """320 MB of rows through a 16 MB budget: the agent's own memory grows by about the budget while the rows
    stream in and while every row is read back in random mini-batches; in memory it grows by the data."""
    gc.collect()
    before = _rss_anon_mb()
    part = load_partition(_batches(160), "features", "label", [WIDTH], budget_mb=16, directory=str(tmp_path))
    loaded = _rss_anon_mb()
    order = torch.randperm(part.rows)
    total = 0.0
    for lo in range(0, part.rows, 64):  # one epoch, as the agent's loop reads it
        idx = order[lo:lo + 64].sort().values
        total += float(part.features[idx].sum())
    read = _rss_anon_mb()
    part.close()
    assert part.rows == 160 * 512 and total > 0
    assert loaded - before < 80 and read - before < 80, (before, loaded, read)
    gc.collect()
    before = _rss_anon_mb()
    x, _ = batches_to_tensors(_batches(160), "features", "label", [WIDTH])
    assert _rss_anon_mb() - before > 250  # the same rows in memory: the measurement can tell
    del x
