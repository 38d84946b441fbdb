"""The gradient noise scale (mpca.sim.noise) and how ``mpca plan`` uses it (issue 55, part 6): the estimators
against hand-computed values and a population whose noise scale is known; the local sample of a job's rows."""
from __future__ import annotations

import pytest
import torch

from mpca.cli import main
from mpca.errors import UserError
from mpca.sim.grid import GridRow
from mpca.sim.noise import NoiseScale, estimate, from_norms, ideal_speedup, pilot, simple_noise_scale
from mpca.sim.plan import PlanConfig, PlanResult, corrected, gain_line, noise_factor


def test_the_two_batch_estimators_recover_the_true_gradient_and_the_trace():
    # E|G_b|^2 = |G|^2 + tr(S)/b with |G|^2 = 1, tr(S) = 2: b = 1 gives 3, b = 4 gives 1.5
    grad_sq, trace = from_norms(3.0, 1.5, 1, 4)
    assert grad_sq == pytest.approx(1.0) and trace == pytest.approx(2.0)
    assert simple_noise_scale(grad_sq, trace) == pytest.approx(2.0)
    assert simple_noise_scale(0.0, 2.0) == float("inf") and simple_noise_scale(1.0, -0.1) == 0.0
    with pytest.raises(ValueError):
        from_norms(1.0, 1.0, 4, 4)


def test_the_ideal_speedup_is_mccandlish_eq_2_11():
    assert ideal_speedup(64, 64, 4) == pytest.approx((1 + 1) / (1 + 0.25))  # 1.6
    assert ideal_speedup(64, 64, 1) == 1.0
    assert ideal_speedup(0.0, 64, 8) == 1.0  # one batch already estimates the gradient: no gain
    assert ideal_speedup(float("inf"), 64, 8) == 8.0
    assert ideal_speedup(1e9, 16, 4) == pytest.approx(4.0, rel=1e-6)


class _Sum(torch.nn.Module):
    """loss = mean over the batch of w·x_i: every sample's gradient is x_i itself."""

    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return x @ self.w


def test_the_estimate_finds_the_noise_scale_of_a_known_population():
    # per-sample gradients x_i ~ N(mu, I_8), mu = (1, 0, ...): |G|^2 = 1, tr(S) = 8, B = 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 8, generator=gen)
    x[:, 0] += 1.0
    y = torch.zeros(len(x))
    (grad_sq, trace), big = estimate(_Sum(8), lambda out, _y: out.mean(), x, y, small=4, draws=2000, generator=gen)
    assert big == 32
    assert grad_sq == pytest.approx(1.0, rel=0.15) and trace == pytest.approx(8.0, rel=0.1)
    assert simple_noise_scale(grad_sq, trace) == pytest.approx(8.0, rel=0.2)


def test_a_pilot_trains_then_measures():
    from mpca.data.synthetic import TeacherTask
    from mpca.models import MLP, cross_entropy

    xs, ys = TeacherTask(rows=4096, features=64).take(torch.arange(4096).numpy())
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)
    model = MLP(64, (32,), 10)
    before = [p.detach().clone() for p in model.parameters()]
    ns = pilot(model, cross_entropy, torch.optim.Adam(model.parameters(), 1e-3), x, y, batch=16, steps=20, draws=4)
    assert ns.steps == 20 and ns.small == 16 and ns.big == 128 and ns.draws == 4
    assert ns.b_simple > 0 and ns.loss == ns.loss  # finite, measured
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it trained
    assert all(p.grad is None for p in model.parameters())
    assert "pilot steps" in ns.describe()


def test_the_plan_divides_each_time_by_the_ratio_of_the_ceilings():
    # user B = 256, proxy B = 16, b = 64, K = 4: (1 + 4)/(1 + 1) = 2.5 over (1 + 0.25)/(1 + 0.0625) = 1.1765
    assert noise_factor(256, 16, 64, 4) == pytest.approx(2.125)
    assert noise_factor(256, 16, 64, 1) == 1.0
    rows = [GridRow("single", 1, {}, time_s=20.0, times=[20.0]), GridRow("mpca", 4, {}, time_s=10.0, times=[10.0]),
            GridRow("sync", 4, {}, time_s=None, times=[None])]
    out = corrected(rows, 256, 16, 64)
    assert out[0].time_s == 20.0
    assert out[1].time_s == pytest.approx(10.0 / 2.125) and out[1].times[0] == pytest.approx(10.0 / 2.125)
    assert out[2].time_s is None
    assert rows[1].time_s == 10.0  # the proxy's rows are kept as they were


def test_the_output_says_which_gain_the_times_carry():
    cfg = PlanConfig(parameters=1000, device_step_s=0.1, link_bps=1e8, agents=(1, 4), algorithms=("single",))
    res = PlanResult(config=cfg, proxy_parameters=1000, byte_scale=1.0, start_error=0.9, target_error=0.3,
                     reference_s=10.0, horizon_s=20.0, eval_every_s=1.0, rows=[], recommended=None)
    assert "PROXY's own" in gain_line(res)
    res.config = cfg.model_copy(update={"noise_scale": 256.0})
    res.proxy_noise = NoiseScale(b_simple=16.0, grad_sq=1.0, trace=16.0, small=64, big=512, draws=4, steps=200,
                                 loss=1.0)
    line = gain_line(res)
    assert "YOUR task's" in line and "B = 256" in line and "B = 16" in line and "K=4: /2.12" in line


# --------------------------------------------------------------------------- a job's rows on this machine
def _job(tmp_path, data: str):
    from mpca.config import load_config

    p = tmp_path / "job.yaml"
    p.write_text(data)
    return load_config([str(p)])


def test_a_local_sample_is_shaped_as_the_agents_see_it(tmp_path):
    from mpca.data.sample import local_sample

    x, y = local_sample(_job(tmp_path, "data: {dataset: digits}\n").data, rows=100)
    assert x.shape == (100, 1, 8, 8) and y.shape == (100,)
    job = _job(tmp_path, "data: {dataset: teacher, input_shape: [64], teacher: {rows: 5000}}\n")
    x, y = local_sample(job.data, rows=300)
    assert x.shape == (300, 64) and int(y.max()) < 10
    job = _job(tmp_path, "data: {dataset: pytext, input_shape: [32], text: {window: 32, max_mb: 0.2}}\n"
                         "model: {name: transformer}\n")
    x, y = local_sample(job.data, rows=50)
    assert x.shape == (50, 32) and y.shape == (50, 32) and torch.equal(x[0, 1:], y[0, :-1])  # the next byte


def test_a_source_without_a_local_reader_is_one_line(tmp_path):
    from mpca.data.sample import local_sample

    with pytest.raises(UserError, match="cannot read data.table 'db.rows'.*as Parquet"):
        local_sample(_job(tmp_path, "data: {table: db.rows}\n").data)
    with pytest.raises(UserError, match="cannot read a sample of data.path"):
        local_sample(_job(tmp_path, f"data: {{path: {tmp_path / 'none'}}}\n").data)


def test_plan_with_a_job_measures_its_noise_scale(tmp_path, capsys):
    from mpca.sim.plan_command import add_arguments, config_from
    import argparse

    job = tmp_path / "job.yaml"
    job.write_text("data: {dataset: digits}\ntraining: {batch_size: 16}\n")
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg, lines, workload = config_from(p.parse_args(["-c", str(job), "--device-step-s", "0.1", "--pilot-steps", "5",
                                                     "--gradients", "proxy"]))
    assert workload is None and cfg.batch_size == 16 and cfg.pilot_steps == 5
    assert cfg.noise_scale is not None and cfg.noise_scale > 0
    assert "gradient noise scale (pilot on digits)" in lines and "after 5 pilot steps" in lines
    cfg, lines, _ = config_from(p.parse_args(["--parameters", "5000", "--device-step-s", "0.1", "--noise-scale", "300"]))
    assert cfg.noise_scale == 300 and cfg.batch_size == 64 and "(given)" in lines
    cfg, lines, workload = config_from(p.parse_args(["-c", str(job), "--device-step-s", "0.1"]))  # the job's own gradients
    assert cfg.noise_scale is None and "your model on a sample of digits" in lines
    assert len(workload.hy) == cfg.holdout and len(workload.y) == 1797 - cfg.holdout  # disjoint: all of digits
    assert workload.x.shape[1:] == (1, 8, 8) and workload.describe()["name"] == "digits"


def test_a_negative_noise_scale_is_one_line(capsys):
    assert main(["plan", "--parameters", "1000", "--device-step-s", "0.1", "--noise-scale", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "noise_scale" in err, err


def test_the_command_with_a_job_prints_which_gain_it_used(tmp_path, capsys):
    import json

    job = tmp_path / "job.yaml"
    job.write_text("data: {dataset: digits}\ntraining: {batch_size: 16}\n")
    out = tmp_path / "plan.json"
    code = main(["plan", "-q", "-c", str(job), "--gradients", "proxy", "--device-step-s", "0.05", "--pilot-steps", "5",
                 "--agents", "1,2",
                 "--algorithms", "single,ddp", "--proxy-hidden", "16", "--reduction", "0.7", "--link", "10gbit",
                 "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "gradient noise scale (pilot on digits)" in printed and "YOUR task's gradient noise scale" in printed
    data = json.loads(out.read_text())
    assert data["config"]["noise_scale"] > 0 and data["proxy_noise"]["steps"] == 5
    assert set(data["proxy_times"]) == {"single@1", "ddp@2"}


def test_the_command_with_a_job_trains_its_own_model_in_every_cell(tmp_path, capsys):
    import json

    job = tmp_path / "job.yaml"
    job.write_text("data: {dataset: digits}\ntraining: {batch_size: 16}\n")
    out = tmp_path / "plan.json"
    code = main(["plan", "-q", "-c", str(job), "--device-step-s", "0.05", "--agents", "1,2", "--algorithms", "single,ddp",
                 "--target-loss", "1.6", "--link", "10gbit", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "gradients: YOUR model" in printed and "YOUR task's own" in printed and "PROXY" not in printed
    data = json.loads(out.read_text())
    assert data["workload"]["name"] == "digits" and data["proxy_noise"] is None
    assert data["proxy_parameters"] == data["config"]["parameters"] and data["byte_scale"] == 1.0
    assert data["rows"][0]["time_s"] is not None and "target: holdout loss from" in printed  # followed in nats
    assert data["target_error"] == 1.6 and data["start_error"] > 2.0  # the untrained model's ~ln 10
