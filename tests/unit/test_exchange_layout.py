"""Which layout a broadcasting cycle uses with one exchange slot per agent: guessed from the reduce-only
cycles, then measured against the other one, the faster kept."""
import pytest

from mpca.runtime.layout import ExchangeLayout


def _run(layout, seconds_of, cycles):
    used = []
    for _ in range(cycles):
        two = layout.two_jobs()
        used.append(two)
        layout.observe(two, seconds_of[two])
    return used


def _after_reduce_only(seconds, **kw):
    layout = ExchangeLayout("auto", **kw)
    for s in seconds:
        layout.observe(None, s)
    return layout


T, F = True, False


def test_fixed_choices_never_change():
    assert _run(ExchangeLayout("two"), {T: 9.0, F: 1.0}, 10) == [T] * 10
    assert _run(ExchangeLayout("one"), {T: 1.0, F: 9.0}, 10) == [F] * 10


def test_the_guess_follows_the_reduce_only_cycles():
    assert _after_reduce_only([1.9, 2.1]).guess() is True  # 1.5 MB shards at 30 Mbit, K = 4: two jobs
    assert _after_reduce_only([0.85, 0.56]).guess() is False  # int8's 0.38 MB shards: one task
    assert ExchangeLayout().guess() is True  # nothing seen (a resume starts broadcasting at once)


def test_auto_starts_from_the_guess_rechecks_the_other_and_keeps_the_faster():
    # reduce alone 0.7 s: one task; probe 3, recheck 10: broadcasting cycles 0-6 one task, 7-9 two jobs
    # (measured slower, 1.5 against 0.9 s), 10-16 one task again, 17-19 two jobs, ...
    layout = _after_reduce_only([0.7, 0.7], probe=3, recheck=10)
    assert _run(layout, {T: 1.5, F: 0.9}, 23) == [F] * 7 + [T] * 3 + [F] * 7 + [T] * 3 + [F] * 3


def test_auto_switches_when_the_recheck_finds_the_other_faster_and_follows_a_change():
    layout = _after_reduce_only([0.7, 0.7], probe=3, recheck=10)  # guessed one task ...
    assert _run(layout, {T: 2.2, F: 3.0}, 13) == [F] * 7 + [T] * 3 + [T] * 3  # ... two jobs measured faster
    # the next recheck (cycles 17-19) finds one task faster now (say the link got faster): kept from then on
    assert _run(layout, {T: 2.2, F: 1.0}, 10) == [T] * 4 + [F] * 3 + [F] * 3


def test_the_median_decides_not_one_slow_cycle():
    layout = _after_reduce_only([2.0], probe=3, recheck=6)
    for two, s in [(T, 2.0), (T, 2.1), (T, 9.0), (F, 2.5), (F, 2.6), (F, 2.4)]:
        assert layout.two_jobs() == two
        layout.observe(two, s)
    assert layout.best() is True and layout.two_jobs() is True  # medians 2.1 against 2.5


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="auto, one, two"):
        ExchangeLayout("three")
    with pytest.raises(ValueError, match="recheck > probe"):
        ExchangeLayout("auto", probe=3, recheck=3)


def test_the_guess_takes_the_fills_reduce_only_cycles_before_and_right_after_the_first_broadcast():
    """With S ≥ 3 the first reduction is broadcast by cycle 1 and cycle 2 broadcasts nothing: cycles 0 and 2 are
    the fill's reduce-only cycles; a later one (a rejected reduction, say) is not the guess's evidence."""
    layout = ExchangeLayout("auto")
    layout.observe(None, 1.2)
    assert layout.guess() is True  # cycle 1 decides on cycle 0 alone
    layout.observe(True, 2.0)
    layout.observe(None, 0.5)
    assert layout.reduce_only == [1.2, 0.5] and layout.guess() is False  # median 0.85
    layout.observe(False, 0.9)
    layout.observe(None, 9.0)
    assert layout.reduce_only == [1.2, 0.5]
