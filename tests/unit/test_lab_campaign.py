"""lab.campaign's rules, without Spark: the seeded schedule, when a fault counts as recovered, the summary."""
import math
import random

import pytest

from lab.campaign import Fault, recovered_after, resource_table, schedule, summary


def test_the_schedule_is_the_seeds_gaps_kinds_agents_and_holds():
    faults = schedule(7, 60.0, ["kill", "stop"], agents=3, gap_s=(5.0, 9.0), stop_s=(6.0, 8.0), start_s=10.0)
    rng = random.Random(7)  # the draws, in the order the schedule takes them
    t, expected = 10.0, []
    while True:
        t += rng.uniform(5.0, 9.0)
        if t >= 60.0:
            break
        kind, agent = rng.choice(["kill", "stop"]), rng.randrange(3)
        expected.append((round(t, 3), kind, agent, round(rng.uniform(6.0, 8.0), 3) if kind == "stop" else 0.0))
    assert [(f.t, f.kind, f.agent, f.hold_s) for f in faults] == expected
    assert 5 <= len(faults) <= 10  # 50 s of gaps of 5–9 s
    assert all(5.0 - 1e-3 <= b.t - a.t <= 9.0 + 1e-3 for a, b in zip(faults, faults[1:]))
    assert faults == schedule(7, 60.0, ["kill", "stop"], 3, (5.0, 9.0), (6.0, 8.0))  # the same seed, the same faults
    assert faults != schedule(8, 60.0, ["kill", "stop"], 3, (5.0, 9.0), (6.0, 8.0))
    with pytest.raises(ValueError, match="unknown fault"):
        schedule(0, 60.0, ["unplug"], 2, (5.0, 9.0), (6.0, 8.0))
    with pytest.raises(ValueError, match="ordered"):
        schedule(0, 60.0, ["kill"], 2, (9.0, 5.0), (6.0, 8.0))


def test_a_fault_is_recovered_at_the_end_of_the_first_cycle_submitted_after_it_that_counts_the_agent():
    cycles = [{"t_submit": 100.0, "t_end": 101.0, "weight": {0: 3.0, 1: 3.0}},  # before the fault
              {"t_submit": 101.5, "t_end": 104.0, "weight": {0: 3.0}},  # agent 1 missing
              {"t_submit": 104.5, "t_end": 105.0, "weight": {0: 2.0, 1: 0.0}},  # it joined: nothing of its own yet
              {"t_submit": 105.5, "t_end": 106.5, "weight": {0: 2.0, 1: 4.0}}]  # counted again
    fault = Fault(t=0.0, kind="kill", agent=1, injected_at=101.2)
    assert recovered_after(fault, cycles) == pytest.approx(106.5 - 101.2)
    assert recovered_after(Fault(0.0, "kill", 0, injected_at=101.2), cycles) == pytest.approx(104.0 - 101.2)
    assert recovered_after(Fault(0.0, "kill", 1), cycles) is None  # never injected
    assert recovered_after(Fault(0.0, "kill", 1, injected_at=106.0), cycles) is None  # no cycle after it


def test_the_summary_counts_per_kind_and_the_resources_give_first_last_and_peak():
    faults = [Fault(1.0, "kill", 0, injected_at=1.0, recovered_s=4.0), Fault(2.0, "kill", 1, injected_at=2.0,
                                                                               recovered_s=10.0),
              Fault(3.0, "kill", 1, injected_at=3.0), Fault(4.0, "nan", 0), Fault(5.0, "nan", 1, injected_at=5.0,
                                                                                   recovered_s=1.0)]
    rows = {r["kind"]: r for r in summary(faults)}
    assert rows["kill"] == {"kind": "kill", "scheduled": 3, "injected": 3, "recovered": 2, "median_s": 7.0,
                            "max_s": 10.0}
    assert rows["nan"]["injected"] == 1 and rows["nan"]["median_s"] == 1.0
    assert math.isnan(summary([Fault(1.0, "stop", 0)])[0]["median_s"])
    samples = [{"t": 0, "driver": {"rss_mb": 100.0, "fds": 10, "threads": 5}, "agent0": None, "checkpoint_entries": 0},
               {"t": 2, "driver": {"rss_mb": 130.0, "fds": 12, "threads": 5}, "agent0": {"rss_mb": 50.0, "fds": 3,
                                                                                         "threads": 2},
                "checkpoint_entries": 2},
               {"t": 4, "driver": {"rss_mb": 120.0, "fds": 11, "threads": 6}, "agent0": None, "checkpoint_entries": 1}]
    table = {(r["process"], r["figure"]): (r["first"], r["last"], r["peak"]) for r in resource_table(samples)}
    assert table[("driver", "rss_mb")] == (100.0, 120.0, 130.0)
    assert table[("driver", "threads")] == (5, 6, 6)
    assert table[("agent0", "fds")] == (3, 3, 3)  # only the samples where its process was there
    assert table[("checkpoint dir", "entries")] == (0, 1, 2)
