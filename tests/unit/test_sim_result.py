"""What a simulation reports of its cycles (mpca.sim.result), against figures computed by hand."""
import json
import math

from mpca.sim.result import CycleStat, HistoryRow, SimResult


def _result(cycles):
    return SimResult(algorithm="mpca", agents=3, wire="fp32", constants={}, settings={}, cycles=cycles,
                     history=[HistoryRow(t=1.0, steps=10, holdout_error=0.4, holdout_loss=1.0),
                              HistoryRow(t=2.0, steps=20, holdout_error=0.25, holdout_loss=0.7)])


def test_mean_cycle_missed_cycles_and_joins_by_hand():
    res = _result([
        CycleStat(0, 0.0, 0.5, 0, None, 10, 20, 30),
        CycleStat(1, 0.5, 0.5, 1, 0, 10, 20, 30),  # took no time: not in the mean
        CycleStat(2, 0.5, 2.0, 2, 1, 10, 20, 30, missing=[1]),
        CycleStat(3, 2.0, 3.0, 0, 2, 10, 20, 30, missing=[1, 2], joined=[1]),
    ])
    assert math.isclose(res.mean_cycle_s, (0.5 + 1.5 + 1.0) / 3)
    assert res.missed_cycles == {1: 2, 2: 1}
    assert res.joins == [(1, 3.0)]
    assert res.bytes_on_driver_port == 4 * (10 + 20)
    doc = json.loads(res.to_json())
    assert (doc["cycle_count"], doc["final_error"], doc["missed_cycles"], doc["joins"]) == (4, 0.25, {"1": 2, "2": 1},
                                                                                           [[1, 3.0]])
    assert "agent 1 missing from 2 cycle(s); agent 2 missing from 1 cycle(s); agent 1 joined from the joint model " \
           "at 3.0 s" in res.table()


def test_a_service_run_has_no_mean_cycle():
    res = _result([])
    assert math.isnan(res.mean_cycle_s) and res.missed_cycles == {} and res.joins == []
    head, cells = res.table().split("\n")
    assert dict(zip(head.split(" | "), cells.split(" | ")))["mean cycle s"] == "—"
    assert "agents away" not in res.table()
