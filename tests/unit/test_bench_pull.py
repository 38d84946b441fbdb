import torch

from mpca.bench.pull import measure


def test_pull_benchmark_measures_what_the_agent_does_before_a_step():
    r = measure("smallcnn", torch.device("cpu"), batch=8, repeats=2)
    assert r["pull_ms"] > 0 and r["step_ms"] > 0
    assert 0 < r["share"] < 1  # a pull is cheaper than a whole step, even on a tiny model
