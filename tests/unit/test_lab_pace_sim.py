"""lab.pace_sim: each cell's figures from the simulator's JSON, and the table of time against pace."""
import pytest

from lab import pace_sim


def _result(starts, ends, times):
    return {"cycles": [{"start": s, "end": e} for s, e in zip(starts, ends)],
            "time_to_target": {str(k): v for k, v in times.items()}}


def test_a_cell_gives_its_times_cycles_period_and_tau():
    # cycles start every 0.6 s and take 0.2 s: τ = 0.6 × 3 shards / 0.3 s per step = 6 steps
    got = pace_sim.summary(_result([0.0, 0.6, 1.2, 1.8], [0.2, 0.8, 1.4, 2.0], {0.3: 9.0, 0.24: None}))
    assert got["time_to"] == {0.3: 9.0, 0.24: None} and got["cycles"] == 4
    assert got["cycle_s"] == pytest.approx(0.2) and got["period_s"] == pytest.approx(0.6)
    assert got["tau"] == pytest.approx(6.0)


def test_the_table_marks_the_fastest_pace_and_gives_each_ratio_to_unpaced():
    cells = {pace_sim.cell_name(2, 0.1, p): pace_sim.summary(_result([0.0, p or 0.2], [0.1, (p or 0.2) + 0.1],
                                                                      {0.24: t}))
             for p, t in [(0, 40.0), (1.5, 30.0), (3, None)]}
    out = pace_sim.table(cells, [2], [0.1], [0, 1.5, 3], target=0.24)
    lines = out.splitlines()
    assert lines[0].startswith("| K | α | pace s | t(24%) s (min–max) | / unpaced |")
    assert "| 2 | 0.1 | 0 | 40 | 1.00 | 2 | 0.20 | 2.0 |" in lines
    assert "| 2 | 0.1 | 1.5 | **30** | 0.75 | 2 | 1.50 | 15.0 |" in lines  # 30 / 40
    assert "| 2 | 0.1 | 3 | not reached |  | 2 | 3.00 | 30.0 |" in lines
    assert pace_sim.table({}, [4], [0.1], [0], target=0.24).splitlines()[-1] == "| 4 | 0.1 | 0 | not run | | | | |"


def test_a_cells_command_sets_alpha_and_the_pace_only_where_paced():
    args = pace_sim.cell_args(4, 0.4, 0.6, 2, 60, "x.json")
    assert args[:2] == ["simulate", "-q"] and "algorithm.alpha.target=0.4" in args
    assert args[-2:] == ["algorithm.alpha.target=0.4", "algorithm.min_cycle_interval_s=0.6"]  # mpca simulate's
    assert args[args.index("-k") + 1] == "4" and args[args.index("--seed") + 1] == "2"
    assert not [a for a in pace_sim.cell_args(4, 0.4, 0, 0, 60, "x.json") if a.startswith("algorithm.min_cycle")]
    assert pace_sim.cell_name(4, 0.4, 0.6) == "k4-a0.4-p0.6" and pace_sim.cell_name(4, 0.4, 0.6, 2) == "k4-a0.4-p0.6-s2"


def test_over_seeds_the_table_gives_medians_and_spread_a_miss_counting_as_latest():
    def cell(t):
        return pace_sim.summary(_result([0.0, 0.3], [0.1, 0.4], {0.24: t}))

    cells = {pace_sim.cell_name(4, 0.4, 0, s): cell(t) for s, t in enumerate([20.0, 14.0, 16.0])}
    cells.update({pace_sim.cell_name(4, 0.4, 3, s): cell(t) for s, t in enumerate([30.0, None, 24.0])})
    lines = pace_sim.table(cells, [4], [0.4], [0, 3], seeds=3, target=0.24).splitlines()
    assert "| 4 | 0.4 | 0 | **16** (14–20) | 1.00 | 2 | 0.30 | 3.0 |" in lines
    assert "| 4 | 0.4 | 3 | 30 (24–not reached) | 1.88 | 2 | 0.30 | 3.0 |" in lines  # median of 24, 30, miss
