"""The start handshake and the stop (mpca.runtime.control)."""
from __future__ import annotations


def test_an_agents_task_start_is_its_executors_clock_kept_within_what_the_drivers_clock_allows():
    """control.task_started_at: the hello job's results arrive together, at the slowest agent's answer; an agent
    that answered 3 s sooner must not read as started 3 s late (the bound received - since_start alone did)."""
    from mpca.runtime.control import task_started_at

    # submitted at 100; this agent started at 100.7 on its clock and answered 2 s later (at 102.7), the slowest
    # at 105.7, when the results came: the bound alone says 103.7
    fast = {"since_start_s": 2.0, "started_at": 100.7}
    assert task_started_at(fast, received=105.7, submitted=100.0) == 100.7
    slow = {"since_start_s": 4.0, "started_at": 101.7}  # the slowest: its bound is exact
    assert task_started_at(slow, received=105.7, submitted=100.0) == 101.7
    # an executor clock 2 s ahead cannot place the start after the bound, one behind not before the submission
    assert task_started_at({"since_start_s": 4.0, "started_at": 103.7}, received=105.7, submitted=100.0) == 101.7
    assert task_started_at({"since_start_s": 4.0, "started_at": 98.0}, received=105.7, submitted=100.0) == 100.0
    assert task_started_at({"since_start_s": 4.0}, received=105.7, submitted=100.0) == 101.7  # an older agent
    assert task_started_at({"since_start_s": 4.0, "started_at": 98.0}, received=105.7, submitted=None) == 98.0
