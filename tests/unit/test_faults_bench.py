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
