"""The presence book of the exchange core (mpca.exchange.presence) against hand-worked sequences on a clock the test
passes in: the bounded wait, absent agents and their return, an elastic run's late agents, replacements joining,
agents leaving, and the ``training.min_agents`` rule."""
from __future__ import annotations

import pytest

from mpca.errors import RunFailedError
from mpca.exchange.presence import PresenceBook, silent_agent_wait_s


def test_a_silent_agent_is_waited_for_five_median_cycles_within_two_to_ten_seconds_or_as_configured():
    assert silent_agent_wait_s(None, []) == 10.0  # no cycle has ended yet
    assert silent_agent_wait_s(None, [0.3, 0.2, 0.4]) == 2.0  # 5 × 0.3 = 1.5, at least 2
    assert silent_agent_wait_s(None, [1.0, 0.9, 1.4]) == 5.0  # 5 × the median 1.0
    assert silent_agent_wait_s(None, [3.0]) == 10.0  # 15, at most 10
    assert silent_agent_wait_s(0.5, [3.0]) == 0.5  # cluster.agent_wait_s wins


def test_the_book_waits_on_its_last_twenty_cycles():
    book = PresenceBook(range(3))
    for s in [100.0] * 5 + [0.6] * 20:  # the five long ones have left the window: 5 × 0.6 = 3
        book.cycle_took(s)
    assert book.wait_s() == pytest.approx(3.0)


def test_an_absent_agent_is_counted_once_and_its_return_says_how_long_it_was_away():
    book = PresenceBook(range(3))
    assert book.count_absent([1, 2], now=10.0) == [1, 2] and book.present() == 1
    assert book.count_absent([1], now=12.0) == []  # already absent: since 10, not 12
    assert book.missing_from({0: "answered"}) == []  # absent agents are not waited for
    assert book.answered(1, now=14.5) == 4.5 and book.answered(0, now=14.5) is None
    assert book.present() == 2 and book.missing_from([0]) == [1]


def test_an_elastic_runs_late_agents_are_absent_until_they_answer():
    book = PresenceBook([0])
    book.expect_later([1, 2], now=1.0)
    assert book.agents == [0, 1, 2] and book.not_started == {1, 2} and book.present() == 1
    assert book.answered(2, now=4.0) == 3.0 and book.not_started == {1} and book.present() == 2


def test_replacements_join_present_and_agents_that_left_are_no_longer_expected():
    book = PresenceBook(range(3))
    book.count_absent([1], now=0.0)
    book.joining.add(1)
    book.joined([1])
    assert book.joining == set() and book.present() == 3
    book.remove([2])
    assert book.agents == [0, 1] and book.left == {2} and book.missing_from([]) == [0, 1]


def test_too_few_agents_for_longer_than_the_timeout_fail_the_run_in_one_line():
    book = PresenceBook(range(3), min_agents=2, agent_lost_timeout_s=5.0)
    book.count_absent([1, 2], now=0.0)
    book.check_quorum(now=0.0)  # short since 0
    book.check_quorum(now=5.0)  # not longer than 5 s yet
    with pytest.raises(RunFailedError, match=r"only 1 of 3 agents answered for 6s \(absent: \[1, 2\]\); "
                                             r"training.min_agents=2"):
        book.check_quorum(now=6.0)
    book.answered(1, now=7.0)
    book.check_quorum(now=7.0)  # back to two: the clock restarts
    book.count_absent([1], now=8.0)
    book.check_quorum(now=8.0)
    book.check_quorum(now=12.0)  # short since 8, not since 0
