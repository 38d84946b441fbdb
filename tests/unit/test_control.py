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


class _Jobs:
    """The holdout's view of the exchange jobs: agents 0 and 1, agent 1 out of reach for its first ``lost`` jobs
    (its executor killed, its replacement loading), each agent's rows hashed 10·a + i."""

    def __init__(self, lost: int):
        import types

        self.roster = types.SimpleNamespace(agents=[0, 1], absent={})
        self.lost, self.jobs = lost, 0

    def plan(self, token, op, only_agents, params):
        return (only_agents, params)

    def spread(self, agents, attempt=1):
        return agents

    def run(self, plan, tasks, bc, description):
        import types

        import numpy as np

        only, params = plan
        self.jobs += 1
        reached = [a for a in only if a == 0 or self.jobs > self.lost]
        if "up_to" in params:
            rows = {a: ({"rows": a}, b"rows-of-%d" % a) for a in reached}
        else:
            rows = {a: ({}, np.arange(10 * a, 10 * a + 3, dtype=np.int64).tobytes()) for a in reached}
        return types.SimpleNamespace(rows=rows)


def test_the_holdout_waits_for_an_agent_whose_executor_was_replaced_rather_than_failing_the_run():
    """control.holdout: an agent killed before it handed its holdout rows over is missing from the jobs until its
    replacement listens — not yet (None) while the wait lasts, its rows once it answers; never a failed run.
    With max_rows 4 the cut-off is the 4th smallest hash (10), so both agents hold rows."""
    from mpca.runtime.control import STOP_ATTEMPTS, holdout

    assert holdout(_Jobs(lost=10 * STOP_ATTEMPTS), max_rows=4, wait_s=0.0) is None
    jobs = _Jobs(lost=STOP_ATTEMPTS + 2)  # back within the wait: the first round of jobs missed it
    assert holdout(jobs, max_rows=4, wait_s=30.0) == [({"rows": 0}, b"rows-of-0"), ({"rows": 1}, b"rows-of-1")]
    assert jobs.jobs > STOP_ATTEMPTS
    away = _Jobs(lost=0)
    away.roster.absent = {1: 100.0}  # the roster counts agent 1 absent: after a cycle, no job is run for it
    assert holdout(away, max_rows=4, wait_s=0.0) is None and away.jobs == 0
