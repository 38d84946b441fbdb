"""lab/sim_validation.py: the validation rows run on the benchmark's task, the task held while the run's seed
changes, medians with unreached seeds counted as slowest."""
import json

from lab.sim_validation import config, main, median_time


def test_an_unreached_seed_counts_as_slowest_and_most_unreached_is_none():
    assert median_time([30.0, None, 10.0]) == 30.0
    assert median_time([None, None, 10.0]) is None
    assert median_time([12.0, 11.0, 13.0]) == 12.0


def test_the_task_stays_the_benchmarks_while_the_run_seed_changes(tmp_path):
    import argparse

    args = argparse.Namespace(exchange_cpu=0.06, host_cores=2, rows=100, holdout=50, task_seed=0, holdout_at=None,
                              max_seconds=1.0, split_rows=1_000_000)
    a, b = config({"name": "mpca"}, 2, "fp32", 0, args), config({"name": "mpca"}, 2, "fp32", 2, args)
    assert (a.workload.seed, b.workload.seed) == (0, 0) and (a.seed, b.seed) == (0, 2)
    assert b.compute.seed == 2 and b.network.exchange_cpu_s_per_mb == 0.06 and b.network.host_cores == 2
    assert (b.network.link_bps, b.compute.step_s) == (100e6, 0.3)  # the regime the measured rows ran in
    assert b.workload.split_rows == 1_000_000  # evaluated on the runtime's holdout of the benchmark's 1 M rows
    args.rows = 0  # the default: each agent trains on the runtime's partition of the 1 M rows
    assert [config({"name": "sync"}, k, "fp32", 0, args).workload.rows_per_agent for k in (1, 2, 4)] == \
        [1_000_000, 500_000, 250_000]
    args.regime = "vgga-gbe"  # the rows measured in the ≈ 100 regime: its link and T
    vgga = config({"name": "mpca"}, 4, "int8", 0, args)
    assert (vgga.network.link_bps, vgga.compute.step_s) == (30e6, 0.1)
    args.rows = 100
    out = tmp_path / "v.json"
    assert main(["--rows", "200", "--split-rows", "8000", "--max-seconds", "1.5", "--seeds", "2", "--only", "mpca@2",
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["label"] == "mpca" and row["agents"] == 2 and [s["seed"] for s in row["per_seed"]] == [0, 1]
    assert row["mean_cycle_s"] > 0


def _compare_json(tmp_path):
    runs = [{"agent_starts_s": [6.27, 6.30], "agents_up_s": 6.43, "time_to": {"0.3": 34.53, "0.26": None}},
            {"agent_starts_s": [6.07, 5.96], "agents_up_s": 6.09, "time_to": {"0.3": 34.19, "0.26": 36.19}}]
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"algorithms": {
        "easgd:t30": {"algorithm": {"name": "easgd", "every": 30}, "agents": 2, "runs": runs},
        "diloco@int8": {"algorithm": {"name": "diloco"}, "agents": 4, "runs": runs}}}))
    return str(path)


def test_a_measured_row_is_found_by_its_settings_k_and_wire_and_keeps_each_repeats_starts(tmp_path):
    import pytest

    from lab.sim_validation import measured_for, measured_runs, relative_starts

    measured = measured_runs([_compare_json(tmp_path)])
    easgd = measured_for(measured, {"name": "easgd", "every": 30}, 2, "fp32")
    assert easgd["label"] == "easgd:t30" and [r["agent_starts_s"] for r in easgd["runs"]] == [[6.27, 6.30],
                                                                                               [6.07, 5.96]]
    assert easgd["runs"][0]["after_start_up"]["0.3"] == pytest.approx(28.1)  # 34.53 - 6.43
    assert easgd["runs"][0]["after_start_up"]["0.26"] is None
    assert measured_for(measured, {"name": "diloco", "every": 50}, 4, "int8")["label"] == "diloco@int8"  # H = 50
    assert measured_for(measured, {"name": "diloco", "every": 50}, 4, "fp32") is None  # another wire
    assert measured_for(measured, {"name": "easgd", "every": 20}, 2, "fp32") is None  # another τ
    assert measured_for(measured, {"name": "easgd", "every": 30}, 4, "fp32") is None  # another K
    # the first agent at 0, the start-up at the last one's start; which agent came first is kept
    assert relative_starts([6.07, 5.96]) == (pytest.approx(0.11), (pytest.approx(0.11), 0.0))
    assert relative_starts([]) == (0.0, ()) and relative_starts([3.0]) == (0.0, ())


def test_a_measured_row_is_simulated_once_per_repeat_with_its_starts_and_counted_from_the_last(tmp_path):
    import argparse

    import pytest

    from lab.sim_validation import measured_for, measured_runs, run_row

    args = argparse.Namespace(exchange_cpu=0.06, host_cores=2, rows=200, holdout=50, task_seed=0, holdout_at=None,
                              max_seconds=1.0, split_rows=8000, seeds=1)
    measured = measured_for(measured_runs([_compare_json(tmp_path)]), {"name": "easgd", "every": 30}, 2, "fp32")
    row = run_row("easgd t30", {"name": "easgd", "every": 30}, 2, "fp32", args, measured)
    assert [s["agent_starts_s"] for s in row["per_seed"]] == [[0.0, 0.03], [0.11, 0.0]]
    assert row["measured"]["label"] == "easgd:t30"
    after = row["measured"]["median_after_start_up"]
    assert after["0.3"] == pytest.approx(28.1) and after["0.26"] is None  # one of two did not reach it: slowest
    plain = run_row("easgd t30", {"name": "easgd", "every": 30}, 2, "fp32", args)
    assert [s["agent_starts_s"] for s in plain["per_seed"]] == [[]] and "measured" not in plain


def test_rows_of_your_own_replace_the_regimes_table_and_link_and_t_replace_the_regimes(tmp_path):
    import argparse

    import pytest

    from lab.sim_validation import rows

    args = argparse.Namespace(row=["sync:H17=sync,every=17", "mpca=mpca"], agents=8, wire="int8", regime="vgga-gbe")
    assert rows(args) == [("sync:H17", {"name": "sync", "every": 17}, 8, "int8"), ("mpca", {"name": "mpca"}, 8, "int8")]
    args.row = []
    assert rows(args)[0] == ("mpca@fp32", {"name": "mpca"}, 4, "fp32")  # the ≈ 100 regime's measured rows
    args.row = ["sync:H0=sync,every=0"]
    with pytest.raises(SystemExit, match="every"):
        rows(args)
    args = argparse.Namespace(exchange_cpu=0.06, host_cores=2, rows=100, holdout=50, task_seed=0, holdout_at=None,
                              max_seconds=1.0, split_rows=1_000_000, link="30mbit", device_step_s=1.2)
    slow = config({"name": "sync", "every": 17}, 8, "fp32", 0, args)
    assert (slow.network.link_bps, slow.compute.step_s) == (30e6, 1.2)
    out = tmp_path / "r.json"
    assert main(["--rows", "200", "--split-rows", "8000", "--max-seconds", "1.5", "--agents", "2", "--link", "1gbit",
                 "--row", "sync:H5=sync,every=5", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["label"], row["algorithm"], row["agents"]) == ("sync:H5", {"name": "sync", "every": 5}, 2)
    assert json.loads(out.read_text())["settings"]["link"] == "1gbit"
