"""The benchmark's fair-baseline grid, its choice of the best setting, the repeats' spread, the named regimes
and the sweep over K: rules checked against hand-computed values (no process started)."""
import json
import math

import pytest

from mpca.bench.compare import spread
from mpca.bench.regimes import REGIMES, off_by, regime
from mpca.bench.sweep import per_k_argv, sweep_table
from mpca.bench.tuning import best, grid, periods

NAN = math.nan


def test_periods_follow_the_one_to_five_rule_and_its_neighbours():
    assert periods(12) == [30, 60, 120]  # H = 5 r, H / 2, 2 H
    assert periods(100) == [250, 500, 1000]
    assert periods(0.1) == [1, 2]  # never below one step


def test_each_algorithm_gets_its_grid_and_the_others_their_defaults():
    assert [s for s, _ in grid("sync", 12, 4)] == ["every=30", "every=60", "every=120"]
    assert grid("sync", 12, 4)[1][1] == {"name": "sync", "every": 60}
    assert [a["every"] for _, a in grid("easgd", 12, 4)] == [30, 48, 60, 120]  # + the paper's bound K r
    diloco = [a for _, a in grid("diloco", 12, 4)]
    assert [a["every"] for a in diloco] == [30, 60, 120, 60, 60]
    assert [a.get("outer_lr") for a in diloco] == [None, None, None, 0.5, 1.0]
    assert [a["alpha"]["target"] for _, a in grid("mpca", 12, 4)] == [0.025, 0.05, 0.1]
    assert [a for _, a in grid("delayed_diloco", 12, 4)] == [{**a, "name": "delayed_diloco"} for a in diloco]
    streaming = [a for _, a in grid("streaming_diloco", 12, 4)]
    assert [a["every"] for a in streaming] == [30, 60, 120, 60, 60, 60, 60]
    assert [{k: v for k, v in a.items() if k not in ("name", "every")} for a in streaming[3:]] == \
        [{"outer_lr": 0.5}, {"outer_lr": 1.0}, {"mix": 1.0, "overlap": 0}, {"fragment_layout": "bytes"}]
    assert grid("ddp", 12, 4) == [("defaults", {"name": "ddp"})] and len(grid("single", 100, 8)) == 1


def test_every_grid_point_is_a_valid_algorithm():
    from mpca.algorithm import build_algorithm

    for name in ("sync", "easgd", "diloco", "streaming_diloco", "delayed_diloco", "mpca"):
        for r in REGIMES.values():
            for _, algo in grid(name, r.ratio, 4):
                build_algorithm(algo)


def test_the_best_setting_reaches_more_targets_then_sooner_then_lower():
    a = ({0.3: 10.0, 0.2: NAN}, 0.25, True)
    b = ({0.3: 20.0, 0.2: 50.0}, 0.19, True)  # reaches both: best though slower to 30%
    c = ({0.3: 15.0, 0.2: 40.0}, 0.19, False)  # faster, but its emulation did not hold
    d = ({0.3: 20.0, 0.2: 50.0}, 0.18, True)  # as b, lower final error
    assert best([a, b]) == 1 and best([a, b, c]) == 1 and best([a, b, c, d]) == 3
    assert best([({0.3: NAN}, 0.5, True), ({0.3: NAN}, 0.4, True)]) == 1  # none reached: lower error
    assert best([a, a]) == 0  # a tie: the first


def test_repeats_more_than_twice_apart_or_missed_by_some_are_flagged():
    ranges, flags = spread([{0.3: 1.0, 0.2: 4.0, 0.1: NAN}, {0.3: 2.0, 0.2: NAN, 0.1: NAN},
                            {0.3: 3.0, 0.2: 5.0, 0.1: NAN}], [0.3, 0.2, 0.1])
    assert ranges[0.3] == (1.0, 3.0) and ranges[0.2] == (4.0, 5.0) and all(map(math.isnan, ranges[0.1]))
    assert flags == ["30%: 3.0x between repeats", "20%: reached in 2 of 3 repeats"]
    assert spread([{0.3: 2.0}, {0.3: 4.0}], [0.3])[1] == []  # exactly 2x: not flagged


def test_regimes_name_the_paper_s_ratios_and_a_measured_ratio_is_compared_with_them():
    assert {r.ratio for r in REGIMES.values()} == {12.0, 100.0}
    assert regime("resnet110-gbe").link == "100mbit"
    with pytest.raises(ValueError, match="unknown regime 'x'; choose from"):
        regime("x")
    assert off_by(24, 12) == 2.0 and off_by(6, 12) == 2.0 and off_by(None, 12) == math.inf


def test_each_k_runs_the_same_command_with_its_own_agents_cluster_and_output():
    argv = ["--agents", "1,4", "--regime", "resnet110-gbe", "--out=runs/x", "stop.max_seconds=9",
            "cluster.master=local-cluster[2,3,1536]", "training.agents=2"]
    assert per_k_argv(argv, 4, "runs/x") == [
        "--regime", "resnet110-gbe", "stop.max_seconds=9", "--out", "runs/x/K4", "training.agents=4",
        "cluster.master=local-cluster[4,3,1536]"]
    assert per_k_argv(["--agents=8"], 8, "o")[-1] == "cluster.master=local-cluster[8,2,1024]"


def test_the_table_over_k_reads_each_k_s_compare_json(tmp_path):
    for k, t_mpca, t_sync in ((2, 10.0, 15.0), (4, 8.0, None)):
        (tmp_path / f"K{k}").mkdir()
        js = {"targets": [0.3], "comm_comp_ratio": 12.5, "algorithms": {
            "mpca": {"time_to": {"0.3": t_mpca}, "time_range": {"0.3": [t_mpca - 1, t_mpca + 1]},
                     "emulation": [{"holds": True}], "spread": [], "setting": "alpha.target=0.05"},
            "sync": {"time_to": {"0.3": t_sync}, "time_range": {"0.3": [None, None]},
                     "emulation": [{"holds": True}, {"holds": False}], "spread": ["30%: reached in 1 of 3 repeats"]}}}
        (tmp_path / f"K{k}" / "compare.json").write_text(json.dumps(js))
    tab = sweep_table(str(tmp_path), [1, 2, 4]).set_index(["K", "algorithm"])  # K = 1 never ran: no rows
    assert list(tab.index) == [(2, "mpca"), (2, "sync"), (4, "mpca"), (4, "sync")]
    assert tab.loc[(2, "sync"), "t(30%)/mpca"] == 1.5 and math.isnan(tab.loc[(4, "sync"), "t(30%) s"])
    assert tab.loc[(2, "mpca"), "t(30%) min-max"] == "9-11" and tab.loc[(2, "mpca"), "setting"] == "alpha.target=0.05"
    assert tab.loc[(2, "sync"), "emulated devices"] == "INVALID" and tab.loc[(4, "mpca"), "emulated devices"] == "ok"
    assert tab.loc[(4, "sync"), "repeats differ"] == "30%: reached in 1 of 3 repeats"


def test_a_best_setting_on_the_grid_s_edge_gets_the_next_point_past_it():
    from mpca.bench.tuning import beyond

    sync = [{"algorithm": a} for _, a in grid("sync", 12, 4)]  # every = 30, 60, 120
    assert beyond("sync", sync, 0) == ("every=15", {"name": "sync", "every": 15})
    assert beyond("sync", sync, 2) == ("every=240", {"name": "sync", "every": 240})
    assert beyond("sync", sync, 1) is None  # inside the grid: nothing to extend
    diloco = [{"algorithm": a} for _, a in grid("diloco", 12, 4)]
    assert beyond("diloco", diloco, 0) == ("every=15", {"name": "diloco", "every": 15})
    assert beyond("diloco", diloco, 3) is None  # an outer-lr variant: off the main axis
    streaming = [{"algorithm": a} for _, a in grid("streaming_diloco", 12, 4)]
    assert beyond("streaming_diloco", streaming, 2)[0] == "every=240"
    assert beyond("streaming_diloco", streaming, 5) is None and beyond("streaming_diloco", streaming, 6) is None
    mpca = [{"algorithm": a} for _, a in grid("mpca", 12, 4)]  # alpha.target = 0.025, 0.05, 0.1
    assert beyond("mpca", mpca, 2) == ("alpha.target=0.2", {"name": "mpca", "alpha": {"target": 0.2}})
    assert beyond("mpca", mpca, 0)[0] == "alpha.target=0.0125"
    assert beyond("sync", [{"algorithm": {"name": "sync", "every": h}} for h in (1, 2)], 0) is None  # H >= 1
    assert beyond("ddp", [{"algorithm": {"name": "ddp"}}], 0) is None


def test_repeats_run_in_rounds_alternating_direction_so_drift_and_predecessors_are_shared():
    from mpca.bench.compare import interleaved

    assert interleaved(["mpca", "sync", "diloco"], 3) == [("mpca", 0), ("sync", 0), ("diloco", 0),
                                                           ("diloco", 1), ("sync", 1), ("mpca", 1),
                                                           ("mpca", 2), ("sync", 2), ("diloco", 2)]
    assert interleaved(["mpca"], 3) == [("mpca", 0), ("mpca", 1), ("mpca", 2)]
    assert interleaved(["mpca", "sync"], 0) == []


def test_time_after_start_up_is_each_run_s_time_to_target_less_its_start_up_then_the_median():
    from mpca.bench.compare import after_start_up

    runs = [{"time_to": {0.24: 39.9}, "agents_up_s": 10.1}, {"time_to": {0.24: 41.3}, "agents_up_s": 17.9},
            {"time_to": {0.24: 35.4}, "agents_up_s": 8.8}]
    assert after_start_up(runs, 0.24) == pytest.approx(26.6)  # 29.8, 23.4, 26.6: not 39.9 - 10.1
    runs[1]["time_to"][0.24] = math.nan  # a repeat that missed the target: no median of the others
    assert math.isnan(after_start_up(runs, 0.24))
    assert math.isnan(after_start_up([{"time_to": {0.24: 30.0}, "agents_up_s": None}], 0.24))


def test_each_wire_format_is_its_own_row_measured_against_mpca_in_the_same_format():
    from mpca.bench.compare import split_wire, table

    assert split_wire("sync@int8") == ("sync", "int8") and split_wire("mpca:gamma0") == ("mpca:gamma0", None)

    def result(t, mb):
        return {"time_to": {0.3: t}, "final_error": 0.2, "bytes": mb * 1e6 * 10, "bytes_per_cycle": mb * 1e6,
                "duty_cycle": 1.0, "agents_up_s": 5.0, "first_exchange_s": 7.0, "cpu": {}}

    rows = table({"mpca@fp32": result(40.0, 8.0), "mpca@int8": result(30.0, 2.0),
                  "sync@fp32": result(60.0, 8.0), "sync@int8": result(45.0, 2.0)}, [0.3]).set_index("algorithm")
    assert rows.loc["sync@int8", "t(30%)/mpca"] == 1.5 and rows.loc["sync@fp32", "t(30%)/mpca"] == 1.5
    assert rows.loc["mpca@int8", "MB per cycle"] == 2.0 and rows.loc["mpca@fp32", "MB per cycle"] == 8.0


def test_diloco_s_outer_learning_rates_are_tried_again_at_the_best_period_found():
    from mpca.bench.tuning import at_best

    diloco = [{"algorithm": a} for _, a in grid("diloco", 12, 4)]  # every = 30, 60, 120; 60 with outer 0.5, 1
    assert at_best("diloco", diloco, 1) == []  # the middle period: its variants are in the grid
    assert at_best("diloco", diloco, 3) == []  # an outer-lr variant is the best: nothing to add
    past = diloco + [{"algorithm": {"name": "diloco", "every": 15}}]
    assert at_best("diloco", past, 5) == [("every=15,outer_lr=0.5", {"name": "diloco", "every": 15, "outer_lr": 0.5}),
                                          ("every=15,outer_lr=1", {"name": "diloco", "every": 15, "outer_lr": 1.0})]
    past.append({"algorithm": {"name": "diloco", "every": 15, "outer_lr": 0.5}})
    assert [s for s, _ in at_best("diloco", past, 5)] == ["every=15,outer_lr=1"]  # only those not tried yet
    sync = [{"algorithm": a} for _, a in grid("sync", 12, 4)]
    assert at_best("sync", sync, 0) == []


def test_mpcas_cycle_pace_is_tried_at_its_best_alpha_in_steps_and_doubled_past_the_slowest_when_that_wins():
    """pace_next: with T = 0.3 s, at the best α (here 0.1, point 2) first 2 T = 0.6 s, then 5 T = 1.5 s; with
    5 T the best, 3 s and then 6 s (EXTEND = 2), no more; with 2 T or unpaced the best, nothing past the grid;
    nothing for another algorithm or without an emulated step time."""
    from mpca.bench.tuning import pace_next

    mpca = [{"algorithm": a} for _, a in grid("mpca", 12, 4)]  # alpha.target 0.025, 0.05, 0.1
    assert pace_next("mpca", mpca, 2, None) is None and pace_next("sync", mpca, 2, 0.3) is None
    label, algo = pace_next("mpca", mpca, 2, 0.3)
    assert (label, algo) == ("alpha.target=0.1,min_cycle_interval_s=0.6",
                             {"name": "mpca", "alpha": {"target": 0.1}, "min_cycle_interval_s": 0.6})
    mpca.append({"algorithm": algo})
    assert pace_next("mpca", mpca, 2, 0.3)[1]["min_cycle_interval_s"] == 1.5
    mpca.append({"algorithm": pace_next("mpca", mpca, 2, 0.3)[1]})
    assert pace_next("mpca", mpca, 2, 0.3) is None  # unpaced is the best: no pace past the grid
    assert pace_next("mpca", mpca, 3, 0.3) is None  # 2 T the best: inside
    assert pace_next("mpca", mpca, 4, 0.3)[1]["min_cycle_interval_s"] == 3.0  # 5 T the best: its double
    mpca.append({"algorithm": pace_next("mpca", mpca, 4, 0.3)[1]})
    assert pace_next("mpca", mpca, 5, 0.3)[1]["min_cycle_interval_s"] == 6.0
    mpca.append({"algorithm": pace_next("mpca", mpca, 5, 0.3)[1]})
    assert pace_next("mpca", mpca, 6, 0.3) is None  # EXTEND points past the grid at most
    assert pace_next("mpca", mpca, 0, 0.3)[1] == {"name": "mpca", "alpha": {"target": 0.025},
                                                   "min_cycle_interval_s": 0.6}  # another α: its own paces
    from mpca.bench.tuning import beyond
    assert beyond("mpca", mpca, 4) is None  # a paced point is off α's axis


def test_the_comm_comp_ratio_comes_from_mpcas_fp32_run_when_the_wire_varies():
    """bench compare --wire fp32,int8 labels its runs mpca@fp32 and mpca@int8: the ratio of one full-model
    exchange is the fp32 run's (it printed "None ... infx off it" before), and {} where no mpca ran."""
    from mpca.bench.compare import ratio_run

    fp32, int8, sync = ({"algorithm": {"name": n}, "comm_comp": c} for n, c in (("mpca", 11.5), ("mpca", 5.0),
                                                                              ("sync", None)))
    assert ratio_run({"mpca@int8": int8, "mpca@fp32": fp32, "sync": sync}) is fp32
    assert ratio_run({"sync": sync, "mpca": int8}) is int8
    assert ratio_run({"mpca": int8, "mpca@fp32": fp32}) is fp32  # mpca's default is int8: fp32 measures the regime
    assert ratio_run({"sync": sync, "mpca:gamma0": int8}) is int8  # an mpca variant alone
    assert ratio_run({"sync": sync}) == {}


def test_each_agents_start_is_its_task_start_plus_its_data_read_and_build_in_agent_order():
    from types import SimpleNamespace

    from mpca.bench.compare import agent_starts

    fit = SimpleNamespace(startup={1: {"task_started_s": 2.5, "data_s": 4.0, "build_s": 0.25},
                                   0: {"task_started_s": 2.0, "data_s": 3.5, "build_s": 0.5}})
    assert agent_starts(fit) == [6.0, 6.75]  # agent 0 first, though reported second
    assert agent_starts(SimpleNamespace(startup={})) == []
    assert agent_starts(SimpleNamespace(startup={0: {"task_started_s": 2.0, "data_s": 3.5}})) == []  # no build


def test_the_start_up_medians_put_each_agents_last_row_on_the_runs_clock():
    from types import SimpleNamespace

    from mpca.bench.compare import startup_medians

    fit = SimpleNamespace(startup={0: {"task_started_s": 2.0, "data_s": 0.5, "build_s": 0.1},
                                   1: {"task_started_s": 3.0, "data_s": 0.7, "build_s": 0.3}},
                          agents=[{"agent": 1, "load_s": 4.0}, {"agent": 0, "load_s": 5.0}])
    # all rows there: agent 0 at 2 + 5 = 7 s, agent 1 at 3 + 4 = 7 s on the run's clock
    assert startup_medians(fit) == {"task_started_s": 2.5, "data_s": 0.6, "build_s": 0.2, "rows_there_s": 7.0}
    m = startup_medians(SimpleNamespace(startup={0: {"task_started_s": 2.0, "data_s": 0.5, "build_s": 0.1}},
                                        agents=[{"agent": 0}]))  # no load_s (a run read in one go, or older)
    assert math.isnan(m["rows_there_s"]) and m["data_s"] == 0.5
