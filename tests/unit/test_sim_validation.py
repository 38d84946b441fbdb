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
