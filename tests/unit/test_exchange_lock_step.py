"""The exchange core's lock step (mpca.exchange.lock_step): windows of exactly N steps, the yield after them, the
cycle's broadcast received right after its yield whichever comes first."""
import pytest

from mpca.exchange.lock_step import LockStep


def take(gate, n):
    for _ in range(n):
        assert gate.may_step()
        gate.stepped()


def test_a_window_holds_exactly_its_steps_and_the_yield_waits_for_the_last():
    gate = LockStep(3)
    take(gate, 2)
    assert not gate.ready(0)  # two of three steps: the yield of cycle 0 waits
    gate.stepped()
    assert not gate.may_step() and gate.waiting and gate.ready(0)
    gate.yielded(0, broadcasts=False)  # no broadcast this cycle: the next window opens at once
    assert gate.may_step() and not gate.ready(1)
    take(gate, 3)
    assert gate.ready(1)


def test_a_broadcast_that_comes_before_its_cycles_yield_is_received_right_after_it():
    gate, log = LockStep(2), []
    take(gate, 1)
    gate.deliver(0, lambda: log.append("receive 0"))
    assert log == [] and gate.may_step()  # held: the agent still takes its window's second step without it
    gate.stepped()
    gate.yielded(0, broadcasts=True)
    assert log == ["receive 0"] and gate.may_step()


def test_the_next_window_waits_for_the_cycles_broadcast_after_the_yield():
    gate, log = LockStep(2), []
    take(gate, 2)
    gate.yielded(0, broadcasts=True)
    assert not gate.may_step()  # its broadcast has not come
    gate.deliver(0, lambda: log.append("receive 0"))
    assert log == ["receive 0"] and gate.may_step()


def test_a_yield_of_a_later_cycle_gives_up_the_broadcast_that_never_came():
    gate, log = LockStep(2), []
    take(gate, 2)
    gate.yielded(0, broadcasts=True)
    assert gate.ready(0)  # the same cycle asked again (a corrective job): still ready
    assert not gate.ready(1)  # cycle 1's yield: window 1 opens without cycle 0's broadcast, and waits for its steps
    take(gate, 2)
    assert gate.ready(1)
    gate.deliver(0, lambda: log.append("late 0"))  # the late broadcast: received when it comes
    assert log == ["late 0"]


def test_an_older_broadcast_held_at_a_yield_is_received_and_the_cycles_own_still_awaited():
    gate, log = LockStep(1), []
    take(gate, 1)
    gate.yielded(0, broadcasts=False)
    gate.deliver(2, lambda: log.append("receive 2"))  # ahead of its yield (cycle 1 not yielded yet)
    take(gate, 1)
    gate.yielded(1, broadcasts=True)  # cycle 1 broadcasts too: cycle 2's delivery is not that one
    assert log == ["receive 2"] and not gate.may_step()
    gate.deliver(1, lambda: log.append("receive 1"))
    assert log == ["receive 2", "receive 1"] and gate.may_step()


def test_a_reset_opens_a_fresh_window_and_drops_a_held_broadcast():
    gate, log = LockStep(2), []
    take(gate, 1)
    gate.deliver(0, lambda: log.append("receive 0"))
    gate.reset()  # joined from the joint model: the held broadcast is older than what it holds
    take(gate, 2)
    gate.yielded(0, broadcasts=False)
    assert log == []


def test_a_window_has_at_least_one_step():
    with pytest.raises(ValueError, match="lock_step"):
        LockStep(0)
