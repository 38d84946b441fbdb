"""The long-run benchmark's arithmetic (the benchmark itself runs Spark for an hour: a command, not a test;
its process accounting: tests/integration/test_longrun.py)."""
from lab import longrun


def test_growth_is_measured_after_the_warm_up_with_medians():
    rows = [{"cycle": c, "m": m} for c, m in [(100, 50.0), (200, 100.0), (500, 105.0), (1000, 110.0)]]
    assert longrun.growth(rows, "m", window=1) == 1.1  # from cycle 200 (after 10% of 1000) to the end
    swinging = [{"cycle": 100 * i, "m": m} for i, m in enumerate([10, 100, 101, 99, 100, 140, 100], start=1)]
    assert longrun.growth(swinging, "m", window=3) == 1.0  # one high sample (a GC swing) is not growth


def test_span_is_from_the_end_of_the_warm_up_to_the_last_sample():
    rows = [{"cycle": 500 * i, "m": 300.0 + i} for i in range(1, 21)]  # cycles 500 ... 10,000
    assert longrun.span(rows, "m") == (1000, 302.0, 10_000, 320.0)  # "from 1,000 to 10,000 cycles"
