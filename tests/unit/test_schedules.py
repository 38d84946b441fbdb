import pytest

from mpca.algorithm import AlphaSchedule, BetaSchedule, GammaSchedule


def test_alpha_hold_jump_decay_target():
    a = AlphaSchedule(hold_cycles=2, peak=0.5, decay_cycles=2, target=0.125)
    # geometric: 0.5 → 0.25 → 0.125 (factor 1/2 per cycle)
    assert [a(c) for c in range(6)] == [0.0, 0.0, 0.5, 0.25, 0.125, 0.125]


def test_alpha_constant():
    a = AlphaSchedule.constant(0.1)
    assert a(0) == 0.1 and a(1000) == 0.1


def test_beta_ramps_by_constant_factor():
    b = BetaSchedule(start=1.0, target=0.81, ramp_cycles=2)
    assert b(0) == 1.0
    assert b(1) == pytest.approx(0.9)
    assert b(2) == pytest.approx(0.81) and b(50) == pytest.approx(0.81)


def test_beta_default_is_paper():
    b = BetaSchedule()
    assert b(0) == 1.0 and b(20) == pytest.approx(0.9) and 0.9 < b(10) < 1.0


def test_gamma_linear_ramp():
    g = GammaSchedule(start=0.0, target=0.7, ramp_cycles=7)
    assert g(0) == 0.0 and g(1) == pytest.approx(0.1) and g(7) == 0.7 and g(100) == 0.7


def test_alpha_from_zero_start_linear():
    a = AlphaSchedule(hold_cycles=0, peak=0.0, decay_cycles=4, target=0.4)
    assert a(2) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: AlphaSchedule(peak=1.5),
        lambda: AlphaSchedule(hold_cycles=-1),
        lambda: AlphaSchedule(decay_cycles=2.5),
        lambda: BetaSchedule(target=0.0),
        lambda: BetaSchedule(start=1.1),
        lambda: GammaSchedule(target=-0.1),
    ],
)
def test_bad_schedule_arguments_raise(make):
    with pytest.raises(ValueError):
        make()
