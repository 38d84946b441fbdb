"""The fault benchmark's bookkeeping, on hand-made timelines (the faults themselves: integration tests)."""
import types

import pytest

from lab import faults
from mpca.runtime.reports import AgentReport
from mpca.runtime.timeline import CycleRecord, Timeline


def _fit(cycles):
    tl = Timeline()
    for c in cycles:
        tl.add(c)
    return types.SimpleNamespace(timeline=tl)


def _cycle(i, t0, t1, missing=(), joined=(), agents=(0, 1)):
    return CycleRecord(i, 0, None, t_submit=t0, t_end=t1, missing=list(missing), joined=list(joined),
                       agents={a: AgentReport(agent=a) for a in agents})


def test_recovery_counts_the_cycles_without_the_agent_and_when_it_was_back():
    fit = _fit([_cycle(0, 0, 1), _cycle(1, 1, 3, missing=[1], agents=[0]), _cycle(2, 3, 4, missing=[1], agents=[0]),
                _cycle(3, 4, 5, missing=[1], joined=[1]), _cycle(4, 5, 6)])
    r = faults.recovery(fit)
    assert r == {"cycles_without": 3, "longest_cycle_s": 2, "back_after_s": 4}  # joined at the end of cycle 3


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        faults.faulty(lambda: None, "meteor")


def test_the_table_gives_each_faulted_run_its_ratio_to_the_same_algorithms_unfaulted_one():
    def row(algorithm, fault, t, back=None):
        return {"algorithm": algorithm, "fault": fault, "time_to_target_s": t, "final_error": 0.01,
                "cycles_without": 0 if back is None else 3, "longest_cycle_s": 1.0, "back_after_s": back}

    text = faults.table([row("sync", "none", 10.0), row("sync", "kill-executor", 15.0, 12.5),
                         row("ddp", "none", 20.0), row("ddp", "hang", 22.0, 8.0), row("ddp", "kill-executor", float("nan"))],
                        0.05)
    lines = text.splitlines()
    assert "t(5%) s" in lines[0] and "× none" in lines[0]
    assert lines[2].split()[:4] == ["sync", "kill-executor", "15.0", "1.50"] and lines[2].split()[-1] == "12.5"
    assert lines[4].split()[:4] == ["ddp", "hang", "22.0", "1.10"]
    assert lines[5].split()[2:4] == ["nan", "nan"]  # never reached: no ratio
