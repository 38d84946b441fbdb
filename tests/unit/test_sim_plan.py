"""mpca plan (mpca.sim.plan): the byte scaling of its proxy, the target's crossing time, the recommendation's rule
(hand-made rows, and a short real plan whose printed recommendation must follow from its printed times), the
teacher MLP sized to a parameter count, and the command line's one-line errors."""
import json
import math

import pytest
import torch

from mpca.cli import main
from mpca.errors import UserError
from mpca.sim.constants import NetworkConstants
from mpca.sim.grid import GridRow, crossing_time
from mpca.sim.measure import exchanged_values, measure_step_s, teacher_hidden_for, teacher_mlp_for
from mpca.sim.network import (broadcast_time, cycle_time, exchange_cpu_time, ring_allreduce_time, scaled_for_bytes,
                              tree_reduce_arrival)
from mpca.sim.plan import PlanConfig, plan, recommend, table, yaml_snippet
from mpca.sim.result import HistoryRow


# --------------------------------------------------------------------------- the proxy's bytes
def test_a_scaled_network_charges_b_bytes_as_the_original_charges_s_times_b():
    net = NetworkConstants(link_bps=100e6, block_bytes=4 * 2**20)
    s = 8.0
    scaled = scaled_for_bytes(net, s)
    assert scaled.link_bps == 12.5e6 and scaled.block_bytes == 2**19 and scaled.job_overhead_s == 0.25
    b = 1_000_000  # 1 MB proxy → 8 MB: at 100 Mbit, 0.64 s per copy
    for k in (2, 4, 16):
        assert broadcast_time(k, b, scaled) == pytest.approx(broadcast_time(k, s * b, net))
        assert ring_allreduce_time(k, b, scaled) == pytest.approx(ring_allreduce_time(k, s * b, net))
    ready = [0.0, 0.1, 0.1, 0.3, 0.5, 0.5, 0.6, 0.9, 1.0]
    assert tree_reduce_arrival(ready, b, scaled) == pytest.approx(tree_reduce_arrival(ready, s * b, net))
    # by hand, K = 2: max(c·B, B + 1·block)·8/rate + 2·latency, c = 1 + log2 2 = 2 → 2·8 MB·8/1e8 + 1 ms
    assert broadcast_time(2, b, scaled) == pytest.approx(2 * 8e6 * 8 / 100e6 + 2 * 0.0005)
    with pytest.raises(ValueError):
        scaled_for_bytes(net, 0.0)
    cpu = NetworkConstants(link_bps=100e6, exchange_cpu_s_per_mb=0.06, host_cores=2)
    for k in (2, 4, 16):  # the exchange's CPU too: 1 MB of proxy costs what 8 MB cost (0.48 s per agent, × K/2)
        assert cycle_time(k, b, b, scaled_for_bytes(cpu, s)) == pytest.approx(cycle_time(k, s * b, s * b, cpu))
    assert exchange_cpu_time(4, b, scaled_for_bytes(cpu, s)) == pytest.approx(0.48 * 2)


def test_the_teacher_mlp_is_sized_to_a_parameter_count():
    # 64-h-h-10: 64h + h + h² + h + 10h + 10 = h² + 76h + 10; h = 1024 → 1,126,410 (the benchmark's MLP)
    assert teacher_hidden_for(1_126_410) == 1024
    assert exchanged_values(teacher_mlp_for(1_126_410)) == 1_126_410
    assert teacher_hidden_for(1) == 1


def test_a_step_is_measured_on_this_host():
    t = measure_step_s(torch.nn.Sequential(torch.nn.Linear(8, 4)), None, batch_size=4, steps=2, warmup=1)
    assert 0 < t < 5


# --------------------------------------------------------------------------- the target's crossing
def test_the_crossing_time_is_linear_between_the_evaluations_around_the_target():
    h = [HistoryRow(0.0, 0, 0.9, 2.0), HistoryRow(10.0, 5, 0.7, 1.0), HistoryRow(20.0, 9, 0.3, 0.5)]
    assert crossing_time(h, 0.5) == pytest.approx(15.0)  # 0.7 → 0.3 over 10 s: 0.5 halfway
    assert crossing_time(h, 0.95) == 0.0
    assert crossing_time(h, 0.3) == 20.0
    assert crossing_time(h, 0.1) is None
    assert crossing_time(h, 0.75, "loss") == pytest.approx(15.0)  # loss 1.0 → 0.5 over 10 s: 0.75 halfway
    assert crossing_time(h, 2.5, "loss") == 0.0 and crossing_time(h, 0.4, "loss") is None


# --------------------------------------------------------------------------- the recommendation's rule
def row(name, k, t):
    return GridRow(name, k, {}, time_s=t)


def test_the_recommendation_is_the_fewest_agents_within_the_tolerance_of_the_fastest():
    rows = [row("single", 1, 100.0), row("sync", 2, 60.0), row("sync", 8, 30.0), row("mpca", 4, 32.0),
            row("mpca", 16, 29.0), row("ddp", 2, None)]
    # fastest 29 s; within 10%: ≤ 31.9 s → sync K=8 (30) and mpca K=16 (29): the fewest agents is sync K=8
    assert recommend(rows, 0.10) is rows[2]
    # within 15% (≤ 33.35 s) mpca K=4 (32 s) joins with fewer agents
    assert recommend(rows, 0.15) is rows[3]
    # no slack: the fastest
    assert recommend(rows, 0.0) is rows[4]
    # equal K and time: the first listed
    tie = [row("diloco", 2, 10.0), row("sync", 2, 10.0)]
    assert recommend(tie, 0.1) is tie[0]
    assert recommend([row("ddp", 2, None)], 0.1) is None


def rule_by_hand(rows, tolerance):
    times = {id(r): r.time_s for r in rows if r.time_s is not None}
    best = min(times.values())
    near = [r for r in rows if r.time_s is not None and r.time_s <= (1 + tolerance) * best]
    fewest = min(r.agents for r in near)
    return min((r for r in near if r.agents == fewest), key=lambda r: r.time_s)


def test_a_short_plan_recommends_what_its_own_times_say(tmp_path):
    cfg = PlanConfig(parameters=200_000, device_step_s=0.05, link_bps=1e10, agents=(1, 4), algorithms=("single", "ddp"),
                     proxy_hidden=(16,), rows=1024, holdout=128,
                     reduction=0.7, seeds=1, evals=30, tolerance=4.0)
    res = plan(cfg)
    ran = [r for r in res.rows if not r.skipped]
    assert [(r.algorithm, r.agents) for r in ran] == [("single", 1), ("ddp", 4)]  # K = 1 is single's alone
    assert res.speedup(ran[0]) == 1.0
    assert res.byte_scale == pytest.approx(200_000 / res.proxy_parameters)
    assert res.reference_s > 0 and res.target_error == pytest.approx(0.7 * res.start_error)
    hand = rule_by_hand(res.rows, cfg.tolerance)
    assert res.recommended is hand
    # the rule has something to choose: rows at different K within the slack, the fastest not the fewest agents
    near = [r for r in ran if r.time_s is not None and r.time_s <= (1 + cfg.tolerance) * min(x.time_s for x in ran if x.time_s)]
    assert len({r.agents for r in near}) > 1
    fastest = min((r for r in ran if r.time_s is not None), key=lambda r: r.time_s)
    assert fastest is not hand, [(r.algorithm, r.agents, r.time_s) for r in ran]
    printed = table(res)
    marked = [line for line in printed.splitlines() if "**recommended**" in line]
    assert len(marked) == 1 and marked[0].startswith(f"| {hand.algorithm} |") and f"| {hand.agents} |" in marked[0]
    snippet = yaml_snippet(res)
    assert f"agents: {hand.agents}" in snippet and f"name: {hand.algorithm}" in snippet
    assert "not run: single at K = 4" in printed and "not run: ddp at K = 1" in printed


# --------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv, says", [
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--algorithms", "nope"], "unknown algorithm 'nope'"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--algorithms", "weaksync"], "does not run weaksync"),
    (["plan", "--model", "no_such_module_26:f", "--device-step-s", "0.1"], "cannot be imported"),
    (["plan", "--model", "builtins:dict", "--device-step-s", "0.1"], "not a torch.nn.Module"),
    (["plan", "--model", "mpca", "--device-step-s", "0.1"], "package.module:factory"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--host-cores", "0"], "host_cores"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--link", "fast"], "plan: --link 'fast'"),
    (["plan", "--parameters", "1000", "--device-step-s", "-1"], "step_s"),
    (["plan", "--parameters", "0", "--device-step-s", "0.1"], "--parameters must be >= 1"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--agents", "1,x"], "--agents"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "algorithm.sync.every=0"], "every"),
    (["plan", "--model", "mpca.models:MLP", "--device-step-s", "0.1", "--proxy-hidden", "sized"], "goes with --parameters"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--target-error", "0.2", "--target-loss", "1.5"],
     "target_error or target_loss, not both"),
    (["plan", "--parameters", "1000", "--device-step-s", "0.1", "--target-loss", "0"], "target_loss"),
    (["plan", "--parameters", "1000"], "plan: give --device-step-s SECONDS (one step's device time) or --measure"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err, err


def test_the_command_measures_an_imported_model_and_prints_a_prediction_with_its_assumptions(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", "-q", "--model", "mpca.models:MLP", "--measure", "--batch-size", "8", "--agents", "1,2",
                 "--algorithms", "single,diloco", "--seeds", "1", "--proxy-hidden", "16", "--reduction", "0.7",
                 "--link", "10gbit", "--json", str(out), "algorithm.diloco.every=5"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "PREDICTION" in printed and "mpca.models:MLP" in printed and "measured on this host" in printed
    assert "link 10000 Mbit/s" in printed and "not modelled: CPU contention" in printed and "PROXY" in printed
    assert "every=5" in printed
    data = json.loads(out.read_text())
    assert data["config"]["parameters"] == 64 * 256 + 256 + 256 * 256 + 256 + 2570
    assert math.isfinite(data["reference_s"]) and data["rows"]


def test_one_data_set_is_split_among_the_agents_with_one_holdout_for_every_k():
    from mpca.sim.grid import split_rows
    from mpca.sim.workload import TeacherWorkload

    w = split_rows(TeacherWorkload(hidden=(4,), holdout=10), 4, 1000)
    assert w.rows_per_agent == 250 and w.holdout_at == 1000
    assert split_rows(w, 3, 1000).rows_per_agent == 333
    x1, _ = split_rows(w, 1, 1000).holdout_rows(1)
    x4, _ = w.holdout_rows(4)
    assert torch.equal(x1, x4)  # the same holdout rows whatever K
    with pytest.raises(ValueError):
        split_rows(w, 8, 4)


def test_periods_follow_the_rule_of_five_unless_the_user_set_them():
    from mpca.sim.plan import algorithm_at, exchange_ratio

    cfg = PlanConfig(parameters=1_250_000, device_step_s=0.3, link_bps=100e6, agents=(2,), algorithms=("sync", "mpca"))
    # 5 MB at 100 Mbit: 0.4 s a copy.  K = 2: broadcast max(2 copies, B + 1 block) = 0.8 s + 2 × 0.5 ms, after the
    # 0.25 s overhead → 1.051 s; reduce 0.25 + 2 × 0.4 + 0.5 ms = 1.0505 s; r = 1.051 / 0.3 = 3.503; H = round(17.52)
    assert exchange_ratio(cfg, 2) == pytest.approx(1.051 / 0.3)
    assert algorithm_at(cfg, "sync", 2).every == 18
    assert algorithm_at(cfg, "diloco", 2).every == 18 and algorithm_at(cfg, "easgd", 2).every == 18
    assert algorithm_at(cfg, "mpca", 2).shards == 3
    own = cfg.model_copy(update={"settings": {"sync": {"every": 7}}})
    assert algorithm_at(own, "sync", 2).every == 7 and algorithm_at(own, "diloco", 2).every == 18
    assert algorithm_at(cfg.model_copy(update={"periods": "defaults"}), "sync", 2).every == 50


def test_without_algorithms_the_plan_tries_the_planners_default_set():
    import argparse

    from mpca.sim.plan import DEFAULT_ALGORITHMS
    from mpca.sim.plan_command import add_arguments, config_from

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg, _, _ = config_from(p.parse_args(["--parameters", "1000", "--device-step-s", "0.1"]))
    assert cfg.algorithms == DEFAULT_ALGORITHMS
    cfg, _, _ = config_from(p.parse_args(["--parameters", "1000", "--device-step-s", "0.1", "--algorithms", "mpca, sync"]))
    assert cfg.algorithms == ("mpca", "sync")


def _plan_config(argv):
    import argparse

    from mpca.sim.plan_command import add_arguments, config_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from(parser.parse_args(argv))[0]


def test_with_a_job_the_plan_takes_its_emulated_devices_and_wire_unless_an_option_gives_them(tmp_path):
    """One spelling per setting: a job's emulation.device_step_s, emulation.device_speed and wire.format are the
    plan's where no option gives them, as its training.batch_size already was."""
    job = tmp_path / "job.yaml"
    job.write_text("data: {dataset: digits}\ntraining: {batch_size: 16}\nwire: {format: int8}\n"
                   "emulation: {device_step_s: 0.2, device_speed: {1: 0.5}}\n")
    proxy = ["-c", str(job), "--gradients", "proxy", "--noise-scale", "100"]  # no pilot, no rows read
    cfg = _plan_config(proxy)
    assert (cfg.device_step_s, cfg.device_speed, cfg.wire, cfg.batch_size) == (0.2, {1: 0.5}, "int8", 16)
    cfg = _plan_config(proxy + ["--device-step-s", "0.05", "--device-speed", "2:0.25", "--wire", "bf16",
                                "--batch-size", "8"])
    assert (cfg.device_step_s, cfg.device_speed, cfg.wire, cfg.batch_size) == (0.05, {2: 0.25}, "bf16", 8)
    bare = tmp_path / "bare.yaml"
    bare.write_text("data: {dataset: digits}\n")
    cfg = _plan_config(["-c", str(bare), "--gradients", "proxy", "--noise-scale", "100", "--device-step-s", "0.1"])
    assert (cfg.device_speed, cfg.wire, cfg.batch_size) == ({}, "fp32", 64)  # the plan's own defaults
    with pytest.raises(UserError, match="bare.yaml sets no emulation.device_step_s"):
        _plan_config(["-c", str(bare), "--gradients", "proxy", "--noise-scale", "100"])
