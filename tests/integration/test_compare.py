"""`mpca bench compare` on the shared local-cluster: every algorithm on the same data, model, seed and targets."""
import json
import math

import pandas as pd
import pytest

from mpca.bench.compare import compare, parse_variant, run_settings, time_to
from mpca.config import load_config, settings_from
from mpca.errors import UserError
from mpca.report import strict_json

pytestmark = pytest.mark.cluster()


def test_time_to_target_reads_the_first_crossing():
    h = pd.DataFrame({"wall_s": [1.0, 2.0, 3.0, 4.0], "holdout_error": [0.5, 0.2, 0.25, 0.05]})
    assert time_to(h, 0.2) == 2.0 and time_to(h, 0.05) == 4.0 and math.isnan(time_to(h, 0.01))


def test_a_variant_is_a_label_and_an_algorithm_with_its_settings():
    assert parse_variant("push+pull=weaksync,c=1,pull_fraction=0.75, push_timeout_s=0") == (
        "push+pull", {"name": "weaksync", "c": 1, "pull_fraction": 0.75, "push_timeout_s": 0})
    assert parse_variant("a0=rudra-softsync,n=2,modulate=false")[1] == {"name": "rudra-softsync", "n": 2,
                                                                       "modulate": False}
    assert parse_variant("g=mpca,gamma={target: 1.5, ramp_cycles: 0},shards=2,alpha={peak: 0.4}")[1] == {
        "name": "mpca", "gamma": {"target": 1.5, "ramp_cycles": 0}, "shards": 2, "alpha": {"peak": 0.4}}
    label, lock = parse_variant("lock=mpca,training.lock_step=5,cluster.reduce=ordered,shards=2")
    assert (label, lock) == ("lock", {"name": "mpca", "training.lock_step": 5, "cluster.reduce": "ordered",
                                      "shards": 2})
    settings = run_settings(settings_from(None, stop={"max_cycles": 3}), lock)  # a variant's run settings applied
    assert (settings.training.lock_step, settings.cluster.reduce) == (5, "ordered")
    assert run_settings(settings, {"name": "mpca"}) is settings
    job = run_settings(load_config(["conf/digits.yaml"], ["progress=off"]), lock)  # a job's config stays one
    assert type(job).__name__ == "JobConfig" and job.training.lock_step == 5 and job.run is not None
    with pytest.raises(UserError, match="wait for the driver's model themselves"):
        run_settings(settings_from(None, algorithm="sync", stop={"max_cycles": 3}),
                     {"name": "sync", "training.lock_step": 5})
    for bad, why in [("weaksync", "LABEL=NAME"), ("x=c=3", "LABEL=NAME"), ("x=weaksync,c", "key=value"),
                     ("x=mpca,training.lock_stepp=5", "not a run setting"), ("x=mpca,nope.key=1", "not a run setting"),
                     ("x=nope", "unknown algorithm"), ("x=weaksync,pull_fraction=2", "pull_fraction"),
                     ("x=mpca,alpha={hold_cycles: 0, target: 1.0", "not a YAML value")]:
        with pytest.raises(ValueError, match=why):
            parse_variant(bad)


def test_compare_writes_table_json_and_plot_for_each_algorithm(spark, tmp_path):
    cfg = load_config(["conf/digits.yaml"], ["progress=off"])
    variants = {"soft:2": {"name": "rudra-softsync", "n": 2, "lr": 0.1}}
    summary = compare(spark, cfg, ["mpca", "single", "mpca:gamma0", "soft:2"], [0.5, 0.2], 10.0, 1, str(tmp_path),
                      "none (test)", variants=variants)
    tab = pd.read_csv(tmp_path / "compare.csv")
    assert list(tab["algorithm"]) == ["mpca", "single", "mpca:gamma0", "soft:2"]
    soft = tab.set_index("algorithm").loc["soft:2"]
    assert soft["updates"] > 10 and soft["mean staleness"] > 0  # the algorithm's own figures, in the table
    assert {"t(50%) s", "t(50%)/single", "t(50%)/mpca", "final error %", "MB moved", "duty cycle",
            "samples/s", "agents' cores"} <= set(tab.columns)
    single = tab.set_index("algorithm").loc["single"]
    assert single["t(50%)/single"] == pytest.approx(1.0) and single["MB moved"] > 0  # observing costs bytes too
    js = json.loads((tmp_path / "compare.json").read_text())
    assert js == json.loads(json.dumps(strict_json(summary), default=str))
    assert set(js["algorithms"]) == {"mpca", "single", "mpca:gamma0", "soft:2"} and js["network"] == "none (test)"
    assert js["algorithms"]["soft:2"]["algorithm"]["n"] == 2 and js["algorithms"]["soft:2"]["figures"]["updates"] > 10
    for label, r in js["algorithms"].items():
        assert r["final_error"] < 0.5, (label, r)  # each learned on the same data
        assert 0 < r["duty_cycle"] <= 1
        assert (r["samples_per_s"] or 0) > 0 and r["cpu"]["agents"] > 0.1, (label, r["samples_per_s"], r["cpu"])  # agents' PIDs were found
        assert 0 < r["cpu"]["machine busy"] <= 1 and r["cpu"]["executor JVMs"] > 0
    assert js["algorithms"]["mpca:gamma0"]["algorithm"]["gamma"] == {"start": 0.0, "target": 0.0}
    m = js["algorithms"]["mpca"]  # start-up, then the pipeline's first hand-off of a joint shard, in the run
    assert 0 < m["agents_up_s"] < m["first_exchange_s"] <= m["first_exchange_job_end_s"] < m["wall_s"], m
    phases = m["startup"]  # each agent's own start-up, medians over the agents: task start, data read, build
    assert 0 < phases["task_started_s"] < phases["task_started_s"] + phases["data_s"] < m["agents_up_s"], m
    assert 0 <= phases["build_s"] < 10 and m["prepare_s"] > 0, m
    assert {"start-up s", "first exchange s", "tasks started s", "first rows s", "all rows s", "driver prep s"} <= set(tab.columns)
    assert js["comm_comp_ratio"] > 0 and (tmp_path / "compare.png").stat().st_size > 10_000
    assert (tmp_path / "mpca" / "history.csv").exists()
    cycles = pd.read_csv(tmp_path / "mpca" / "timeline.csv")  # each cycle's phases and bytes, beside the curve
    assert len(cycles) == m["cycles"] and (cycles["t_end"] >= cycles["t_submit"]).all(), cycles
    record = json.loads((tmp_path / "mpca" / "run.json").read_text())  # written as the run ended
    assert record["time_to"] == m["time_to"] and "history" not in record, record
    assert record["emulation"] == m["emulation"][0] and record["wall_s"] == m["wall_s"], record


def test_an_emulation_the_machine_cannot_hold_is_marked_not_reported(spark, tmp_path):
    """Overloaded on purpose: an emulated device step of 0.1 ms, shorter than any real step, so every step is
    late; the table and compare.json say the run is not a result."""
    cfg = load_config(["conf/digits.yaml"], ["progress=off", "emulation.device_step_s=0.0001"])
    compare(spark, cfg, ["mpca"], [0.5], 6.0, 1, str(tmp_path), "none (test)")
    row = pd.read_csv(tmp_path / "compare.csv").set_index("algorithm").loc["mpca"]
    assert row["emulated devices"].startswith("INVALID: agents fell behind T"), row
    (check,) = json.loads((tmp_path / "compare.json").read_text())["algorithms"]["mpca"]["emulation"]
    assert check["holds"] is False and check["late_fraction"] > 0.5 and check["real_step_s"] > 0.0001


def test_a_regime_tunes_each_algorithm_on_its_grid_then_repeats_the_best(spark, tmp_path):
    """Each setting of sync's grid runs once (a ratio of 0.2 gives H = 1 and 2; H = 4, 8 while the best lies
    on the upper edge), the best one is then run twice afresh; the grid, the choice and the repeats' min–max reach compare.json and the table."""
    from mpca.bench.regimes import Regime

    cfg = load_config(["conf/digits.yaml"], ["progress=off"])
    compare(spark, cfg, ["sync"], [0.5], 5.0, 2, str(tmp_path), "none (test)",
            regime=Regime("test", "none", 0.01, 0.2, "a test"), tune_grid=True)
    js = json.loads((tmp_path / "compare.json").read_text())
    sync = js["algorithms"]["sync"]
    settings = [p["setting"] for p in sync["grid"]]
    assert settings[:2] == ["every=1", "every=2"] and js["regime"]["ratio"] == 0.2
    assert settings[2:] in ([], ["every=4"], ["every=4", "every=8"])  # past the edge while the best is on it
    chosen = next(p for p in sync["grid"] if p["setting"] == sync["setting"])
    assert sync["algorithm"] == chosen["algorithm"] and sync["repeats"] == 2
    assert all((tmp_path / d / "history.csv").exists() for d in [f"sync-{x}" for x in settings] + ["sync-r0",
                                                                                                 "sync-r1"])
    lo, hi = sync["time_range"]["0.5"]
    assert lo <= sync["time_to"]["0.5"] <= hi
    row = pd.read_csv(tmp_path / "compare.csv").set_index("algorithm").loc["sync"]
    assert row["setting"] == sync["setting"] and row["t(50%) min-max"] == f"{lo:.3g}-{hi:.3g}"
