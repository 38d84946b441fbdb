"""The runtime's roster (mpca.runtime.roster): the presence book on the wall clock, fed by what each cycle's job returned."""
from __future__ import annotations

import time

import pytest

from mpca.runtime.roster import AgentRoster
from mpca.runtime.timeline import CycleRecord
from tests.helpers import answered


def test_absent_agents_are_named_once_and_fewer_than_min_agents_fail_the_run_after_the_timeout(caplog):
    from mpca.errors import RunFailedError

    p = AgentRoster([0, 1], min_agents=2, agent_lost_timeout_s=0.3)
    rec = CycleRecord(0, 0, None, t_submit=0.0)
    p.track(rec, answered(0))
    assert rec.missing == [1] and list(p.absent) == [1] and "agent 1 did not answer" in caplog.text
    import time

    time.sleep(0.35)
    with pytest.raises(RunFailedError, match=r"only 1 of 2 agents answered .*absent: \[1\].*min_agents=2"):
        p.track(CycleRecord(1, 0, None, t_submit=0.0), answered(0))


def test_a_returning_agent_is_counted_again_and_a_replacement_waits_to_join():
    p = AgentRoster([0, 1], min_agents=1)
    p.track(CycleRecord(0, 0, None, t_submit=0.0), answered(0))
    assert 1 in p.absent
    rec = CycleRecord(1, 0, None, t_submit=0.0)
    p.track(rec, answered(0, 1, joining=[1]))
    assert not p.absent and p.joining == {1} and rec.missing == [1]  # answers, but contributes nothing yet
    assert list(p.counted()[0]) == [0, 1] and list(p.counted()[1]) == []  # only counted contributions are confirmed


def test_an_elastic_runs_later_agents_are_absent_until_they_come_then_join():
    p = AgentRoster([0, 1, 2], min_agents=1)
    p.reset([0], later=[1, 2])
    assert p.agents == [0, 1, 2] and set(p.absent) == {1, 2} and p.not_started == {1, 2}
    rec = CycleRecord(0, 0, None, t_submit=0.0)
    p.track(rec, answered(0))
    assert rec.missing == [1, 2] and p.missing_from({0: None}) == []  # no wait, no corrective job for them
    rec = CycleRecord(1, 0, None, t_submit=0.0)
    p.track(rec, answered(0, 2, joining=[2]))  # agent 2's task found room: it answers as a newcomer
    assert p.not_started == {1} and set(p.absent) == {1} and p.joining == {2} and rec.missing == [1, 2]


def test_agents_that_left_are_no_longer_expected():
    p = AgentRoster([0, 1, 2], min_agents=1)
    p.track(CycleRecord(0, 0, None, t_submit=0.0), answered(0))
    p.remove([1, 2])
    assert p.agents == [0] and p.left == {1, 2} and not p.absent
    rec = CycleRecord(3, 0, None, t_submit=0.0)
    p.track(rec, answered(0))
    assert rec.missing == [] and not p.absent  # no wait for those that left


def test_an_elastic_runs_service_agent_is_missing_until_it_first_calls():
    p = AgentRoster([0, 1], min_agents=1)
    p.reset([0], later=[1])
    p.came_up({0})
    assert p.not_started == {1} and set(p.absent) == {1}
    p.came_up({0, 1})
    assert p.not_started == set() and not p.absent


def test_the_rosters_bounded_wait_follows_its_cycles_or_the_setting():
    """The roster keeps the presence book's bounded wait (tests/unit/test_exchange_presence.py) on its cycles."""
    roster = AgentRoster([0, 1])
    for s in (1.0, 0.9, 1.4):
        roster.cycle_took(s)
    assert roster.wait_s() == 5.0 and AgentRoster([0], agent_wait_s=1.5).wait_s() == 1.5
