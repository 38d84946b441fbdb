import torch

from mpca.bench.pull import measure


def test_pull_benchmark_measures_both_sides():
    r = measure("smallcnn", torch.device("cpu"), batch=8, repeats=2)
    assert r["pull_ms"] > 0 and r["step_ms"] > 0
    assert 0 < r["share"] < 1  # a pull is cheaper than a whole step, even on a tiny model
