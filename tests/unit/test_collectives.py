"""lab.collectives' table: medians, spread and each alternative's ratio to the built default of its direction."""
import pytest

from lab import collectives


def test_the_table_gives_medians_spread_and_ratios_to_each_directions_default():
    times = {"up, tree": [2.0, 2.2, 3.0], "up, reduce-scatter": [1.5, 1.1, 1.4],
             "down, broadcast": [2.0, 1.9, 2.1], "down, all-gather": [1.0, 3.0, 1.5]}
    out = collectives.table(times, "30mbit", 4, 1000)
    assert "4 executors behind 30mbit ports" in out and "medians of 3 rounds" in out
    assert "| up, tree | 2.20 | 2.00–3.00 | 1.00 |" in out
    assert "| up, reduce-scatter | 1.40 | 1.10–1.50 | 0.64 |" in out  # 1.4 / 2.2
    assert "| down, all-gather | 1.50 | 1.00–3.00 | 0.75 |" in out  # 1.5 / 2.0


def test_bad_arguments_are_refused_before_any_cluster():
    with pytest.raises(SystemExit):
        collectives.main(["--workers", "1"])
