"""The emulated devices' validity check against hand-computed figures."""
import math

from mpca.bench.emulation import device_check, verdict


def _agent(steps, compute_s, cpu_s, late):
    return {"steps": steps, "compute_s": compute_s, "cpu_s": cpu_s, "late_steps": late}


def test_a_run_whose_steps_fit_on_an_idle_machine_holds():
    c = device_check([_agent(100, 1.0, 0.8, 2), _agent(200, 3.0, 2.0, 0)], {"machine busy": 0.55}, 0.04)
    assert c["holds"] is True and c["why"] == ""
    assert math.isclose(c["real_step_s"], 0.0125) and math.isclose(c["cpu_per_step_s"], 0.009)  # medians of 10, 15 ms
    assert math.isclose(c["late_fraction"], 2 / 300) and c["machine_busy"] == 0.55


def test_agents_behind_t_or_a_saturated_machine_mark_the_run():
    late = device_check([_agent(100, 5.0, 4.0, 60)], {"machine busy": 0.5}, 0.04)
    assert late["holds"] is False and "60% of steps took longer than 40 ms" in late["why"]
    busy = device_check([_agent(100, 1.0, 1.0, 0)], {"machine busy": 0.97}, 0.04)
    assert busy["holds"] is False and "machine saturated: 97% busy" in busy["why"]
    assert verdict([late, busy]).startswith("INVALID: agents fell behind T") and verdict([late, busy]).endswith("(+1 more)")
    assert verdict([device_check([_agent(10, 0.1, 0.1, 0)], {"machine busy": 0.2}, 0.04)]) == "ok"


def test_without_emulation_the_run_is_measured_not_judged():
    c = device_check([_agent(100, 1.0, 0.5, 0)], {"machine busy": 0.99}, None)
    assert c["holds"] is None and c["real_step_s"] == 0.01 and verdict([c]) == ""
