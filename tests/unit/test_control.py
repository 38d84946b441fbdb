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
    (its executor killed, its replacement loading) and any agent out of reach while not in ``up`` (None: all
    are); each agent's rows hashed 10·a + i; every request of a job noted in ``asked``."""

    def __init__(self, lost: int = 0):
        import types

        self.roster = types.SimpleNamespace(agents=[0, 1], absent={})
        self.lost, self.jobs, self.up, self.asked = lost, 0, None, []

    def plan(self, token, op, only_agents, params):
        return (only_agents, params)

    def spread(self, agents, attempt=1):
        return agents

    def run(self, plan, tasks, bc, description):
        import types

        import numpy as np

        only, params = plan
        self.jobs += 1
        self.asked.append((tuple(only), params.get("up_to")))
        reached = [a for a in only if (a == 0 or self.jobs > self.lost) and (self.up is None or a in self.up)]
        if "up_to" in params:
            rows = {a: ({"rows": a, "up_to": params["up_to"]}, b"rows-of-%d" % a) for a in reached}
        else:
            rows = {a: ({}, np.arange(10 * a, 10 * a + 3, dtype=np.int64).tobytes()) for a in reached}
        return types.SimpleNamespace(rows=rows)


def test_the_holdout_waits_for_an_agent_whose_executor_was_replaced_rather_than_failing_the_run():
    """control.holdout: an agent killed before it handed its holdout rows over is missing from the jobs until its
    replacement listens — not yet (None) while the wait lasts, its rows once it answers; never a failed run.
    With max_rows 4 the cut-off is the 4th smallest hash (10), so both agents hold rows."""
    from mpca.runtime.control import STOP_ATTEMPTS, HoldoutGathered, holdout

    assert holdout(_Jobs(lost=10 * STOP_ATTEMPTS), HoldoutGathered(4), wait_s=0.0) is None
    jobs = _Jobs(lost=STOP_ATTEMPTS + 2)  # back within the wait: the first round of jobs missed it
    assert holdout(jobs, HoldoutGathered(4), wait_s=30.0) == [({"rows": 0, "up_to": 10}, b"rows-of-0"),
                                                               ({"rows": 1, "up_to": 10}, b"rows-of-1")]
    assert jobs.jobs > STOP_ATTEMPTS


def test_what_an_agent_handed_over_is_kept_so_agents_never_up_together_still_give_the_holdout():
    """control.holdout with HoldoutGathered: in the 2026-12-02 DDP campaign (82 faults in 13 min) there was never
    a moment when both agents could answer, and the run ended without its holdout.  Each answer is now kept:
    agent 0's hashes, then agent 1's (the cut-off 10 known: its rows at once), then agent 0's rows.  An agent the
    roster counts absent, or still loading, is not asked after a cycle (wait 0); one kept is never asked again."""
    from mpca.runtime.control import HoldoutGathered, holdout

    jobs, kept = _Jobs(), HoldoutGathered(4)
    jobs.up = {0}
    assert holdout(jobs, kept, 0.0) is None and sorted(kept.hashes) == [0]
    jobs.up = {1}
    assert holdout(jobs, kept, 0.0) is None and sorted(kept.hashes) == [0, 1] and sorted(kept.rows) == [1]
    assert kept.rows[1][0] == 10
    jobs.up, jobs.asked = {0}, []
    assert holdout(jobs, kept, 0.0) == [({"rows": 0, "up_to": 10}, b"rows-of-0"),
                                        ({"rows": 1, "up_to": 10}, b"rows-of-1")]
    assert jobs.asked == [((0,), 10)]  # only agent 0's rows: nothing kept asked again

    away, kept = _Jobs(), HoldoutGathered(4)
    away.roster.absent = {1: 100.0}
    assert holdout(away, kept, 0.0) is None and away.asked == [((0,), None)]
    assert holdout(away, kept, 0.0) is None and away.asked == [((0,), None)]  # agent 0 kept, agent 1 away
    loading = _Jobs()
    assert holdout(loading, HoldoutGathered(4), 0.0, loaded=lambda a: a == 1) is None
    assert loading.asked == [((1,), None)]


def test_at_the_runs_end_the_holdout_is_the_rows_of_the_agents_that_handed_theirs_over_and_the_others_named():
    """control.partial_holdout: agent 1 never answered; the driver scores on agent 0's rows of smallest hash —
    its 3 hashes 0, 1, 2 give the cut-off 2 over agent 0 alone — and names agent 1."""
    from mpca.runtime.control import HoldoutGathered, holdout, partial_holdout

    jobs, kept = _Jobs(), HoldoutGathered(4)
    jobs.up = {0}
    assert holdout(jobs, kept, 0.5) is None
    assert partial_holdout(jobs, kept) == ([({"rows": 0, "up_to": 2}, b"rows-of-0")], [1])
    assert partial_holdout(_Jobs(), HoldoutGathered(4)) == ([], [0, 1])  # no hashes at all: nothing, both named
