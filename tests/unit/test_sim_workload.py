"""A job's own task in the simulator (mpca.sim.workload.SampleWorkload, job_workload): the rows split among the
agents as Spark's partitions are, its own holdout, and BatchNorm statistics re-estimated before each score."""
from __future__ import annotations

import functools

import pytest
import torch

from mpca.models import build_optimizer, cross_entropy
from mpca.sim.simulator import SimConfig, Simulator
from mpca.sim.workload import SampleWorkload, job_workload


def _bn_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _work(rows=100):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)
    return SampleWorkload(_bn_model, cross_entropy, functools.partial(build_optimizer, "adam", 1e-3, 0.0, 0.0),
                          x, y, x[:20], y[:20], calibration=16, name="toy")


def test_the_rows_are_split_in_contiguous_blocks_with_one_holdout():
    w = _work().split(4, 1000)  # at most the sample's 100 rows
    assert w.rows_per_agent == 25
    x2, _ = w.agent_rows(2, 4)
    assert torch.equal(x2, w.x[50:75]) and torch.equal(w.holdout_rows(4)[0], w.hx)
    assert w.calibration_rows(4).shape == (16, 4)
    with pytest.raises(ValueError, match="cannot be split"):
        _work(3).split(4, 3)


def test_batchnorm_statistics_are_re_estimated_unless_they_are_used_as_exchanged():
    base = dict(agents=2, workload=_work().split(2, 100), batch_size=8, max_virtual_s=1.0, eval_every_s=0.5)
    sim = Simulator(SimConfig(algorithm={"name": "mpca", "buffers": "recalibrate"}, **base))
    assert sim.calibration is not None and sim.calibration.shape == (16, 4)
    assert Simulator(SimConfig(algorithm={"name": "mpca", "buffers": "average"}, **base)).calibration is None
    assert sim.run().history  # it scores
    import copy

    from mpca.evaluation import recalibrate_batchnorm

    again = copy.deepcopy(sim.eval_model)
    recalibrate_batchnorm(again, sim.calibration)  # the scored model's statistics are the re-estimated ones
    assert torch.allclose(again[1].running_mean, sim.eval_model[1].running_mean)
    assert not torch.allclose(sim.eval_model[1].running_mean, torch.zeros(8))


def test_a_text_job_is_scored_on_its_own_held_out_files(tmp_path):
    from mpca.config import load_config

    p = tmp_path / "job.yaml"
    p.write_text("data: {dataset: pytext, input_shape: [32], text: {window: 32, max_mb: 0.5}}\n"
                 "model: {name: transformer, args: {width: 16, layers: 1, heads: 2}}\n")
    w = job_workload(load_config([str(p)]), rows=200, holdout=50)
    assert len(w.y) == 200 and len(w.hy) == 50 and w.describe()["name"] == "pytext"
    train = {bytes(r.to(torch.uint8).tolist()) for r in w.x}
    assert not train & {bytes(r.to(torch.uint8).tolist()) for r in w.hx}  # other files, other windows
