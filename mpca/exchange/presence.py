"""The presence book: who is in a run as the driver sees it — the agents it expects, which of them it counts
absent (a cycle's bounded wait ran out on them: hung, or their executor lost), which replacements wait for the
joint model, which agents of an elastic run have not come up yet, which left — the bounded wait for a silent
agent, and the ``training.min_agents`` rule.  Written once, kept by the Spark runtime's roster
(:class:`mpca.runtime.roster.AgentRoster`, wall-clock times) and the simulator's presence
(:class:`mpca.sim.presence.Presence`, virtual times): the driver passes ``now``; the book has no clock of its own.
No torch: the exchange tasks' modules import it.
"""
from __future__ import annotations

import collections
import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Set

from mpca.errors import RunFailedError

SILENT_WAIT_CYCLES, SILENT_WAIT_MIN_S, SILENT_WAIT_MAX_S = 5, 2.0, 10.0
DEADLINE_WAITS, DEADLINE_CYCLES, DEADLINE_AFTER, DEADLINE_BACKOFF_MAX = 2, 4, 5, 6


def silent_agent_wait_s(configured: Optional[float], recent_cycles_s: Sequence[float]) -> float:
    """How long a cycle waits for an agent that does not answer before the run goes on without it (counted
    absent: hung, or its executor lost) — ``cluster.agent_wait_s`` when set, else 5 × the median recent cycle
    within 2–10 s (10 s before any cycle ended)."""
    if configured is not None:
        return configured
    if not recent_cycles_s:
        return SILENT_WAIT_MAX_S
    return min(SILENT_WAIT_MAX_S, max(SILENT_WAIT_MIN_S, SILENT_WAIT_CYCLES * statistics.median(recent_cycles_s)))


def cycle_deadline_s(configured: Optional[float], recent_cycles_s: Sequence[float],
                     silent_wait_s: float) -> Optional[float]:
    """How long a cycle's exchange may run before the driver abandons it (None: no bound) —
    ``cluster.cycle_deadline_s`` when set (0: never), else, once 5 cycles have ended, 2 × the bounded wait for a
    silent agent (a task's own wait, and a correction's) + 4 × the median recent cycle.

    A cycle that runs past it is waiting on a task that cannot start or report: its executor is cut off (its link
    down, its host stopped) but not yet lost to Spark (``spark.network.timeout``), so the cycle would wait for the
    link and every agent's exchange with it.  A silent *agent* cannot hold a cycle that long: its task gives up
    after the bounded wait."""
    if configured is not None:
        return None if configured == 0 else float(configured)
    if len(recent_cycles_s) < DEADLINE_AFTER:
        return None
    return DEADLINE_WAITS * silent_wait_s + DEADLINE_CYCLES * statistics.median(recent_cycles_s)


class PresenceBook:
    """The agents of one run and their presence.

    ``agent_wait_s``: how long a cycle waits for a silent agent (None: :func:`silent_agent_wait_s`'s rule over
    the last 20 cycles); fewer than ``min_agents`` present for ``agent_lost_timeout_s`` fails the run
    (:meth:`check_quorum`)."""

    def __init__(self, agents: Iterable[int], agent_wait_s: Optional[float] = None, min_agents: int = 1,
                 agent_lost_timeout_s: float = 120.0):
        self.agents: List[int] = sorted(agents)
        self.agent_wait_s = agent_wait_s
        self.min_agents = min_agents
        self.agent_lost_timeout_s = agent_lost_timeout_s
        self.absent: Dict[int, float] = {}  # agents counted absent: since when
        self.joining: Set[int] = set()  # replacements waiting for the joint model
        self.not_started: Set[int] = set()  # an elastic run's agents whose task has not had room yet
        self.left: Set[int] = set()  # agents that left the run (decommissioned executors)
        self._durations: collections.deque = collections.deque(maxlen=20)
        self._abandoned_in_row = 0  # cycles abandoned at the deadline since the last one that ended
        self._short_since: Optional[float] = None  # since when fewer than min_agents are present

    # ------------------------------------------------------------------ the bounded wait
    def wait_s(self) -> float:
        """The bounded wait for a silent agent (:func:`silent_agent_wait_s`)."""
        return silent_agent_wait_s(self.agent_wait_s, self._durations)

    def cycle_took(self, seconds: float) -> None:
        self._durations.append(seconds)
        self._abandoned_in_row = 0

    def cycle_abandoned(self) -> None:
        """A cycle ran past its deadline: the next one's derived deadline is twice as long
        (:meth:`cycle_deadline_s`)."""
        self._abandoned_in_row += 1

    def recent_cycles_s(self) -> List[float]:
        """The last 20 cycles' durations, for a checkpoint: a resumed driver's bounded wait and cycle deadline
        hold from its first cycle (:meth:`resume_cycles`)."""
        return list(self._durations)

    def resume_cycles(self, seconds: Optional[Sequence[float]]) -> None:
        """A checkpoint's recent cycle durations, taken as this book's own: without them a resumed driver set no
        cycle deadline until 5 of its cycles had ended, and its first cycle waited for a cut-off executor's link
        (109 s in the fault campaign's run 14)."""
        self._durations.extend(float(s) for s in seconds or ())

    def cycle_deadline_s(self, configured: Optional[float]) -> Optional[float]:
        """How long the next cycle's exchange may run (:func:`cycle_deadline_s`, over the last 20 cycles); where
        derived (``configured`` None), doubled for each cycle abandoned in a row, up to 64 ×: an abandoned cycle's
        time never enters the statistics, so cycles that all run slower than the deadline (a resumed run's
        cycle times from another cluster, :meth:`resume_cycles`) would otherwise be abandoned for ever."""
        deadline = cycle_deadline_s(configured, self._durations, self.wait_s())
        if deadline is None or configured is not None:
            return deadline
        return deadline * 2 ** min(self._abandoned_in_row, DEADLINE_BACKOFF_MAX)

    # ------------------------------------------------------------------ membership
    def expect_later(self, agents: Iterable[int], now: float) -> None:
        """An elastic run's agents that have no room yet: expected, absent until they answer."""
        later = set(agents)
        self.agents = sorted(set(self.agents) | later)
        self.not_started |= later
        self.absent.update({a: now for a in later})

    def count_absent(self, agents: Iterable[int], now: float) -> List[int]:
        """A cycle's bounded wait ran out on ``agents`` (or their process is gone): the ones newly counted."""
        new = [a for a in agents if a not in self.absent]
        self.absent.update({a: now for a in new})
        return new

    def answered(self, agent: int, now: float) -> Optional[float]:
        """``agent`` answered (its contribution, or a replacement's hello): present again.  How long it was
        counted absent, or None when it was not; an elastic run's late agent has come up."""
        self.not_started.discard(agent)
        since = self.absent.pop(agent, None)
        return None if since is None else now - since

    def joined(self, agents: Iterable[int]) -> None:
        """Replacements that received the joint model: they contribute from their next yield on."""
        for a in agents:
            self.joining.discard(a)
            self.absent.pop(a, None)

    def remove(self, agents: Iterable[int]) -> None:
        """Agents that left: no longer expected, waited for, or counted."""
        for a in agents:
            self.absent.pop(a, None)
            self.joining.discard(a)
            self.left.add(a)
            if a in self.agents:
                self.agents.remove(a)

    def missing_from(self, answered: Iterable[int]) -> List[int]:
        """Agents expected to answer but not among ``answered``, leaving out those counted absent."""
        answered = set(answered)
        return [a for a in self.agents if a not in answered and a not in self.absent]

    def present(self) -> int:
        """Agents the run counts present (the driver rule's ``on_membership``): all but those counted absent."""
        return len(self.agents) - len(self.absent)

    def check_quorum(self, now: float) -> None:
        """The ``training.min_agents`` rule: :class:`RunFailedError` once fewer have been present for longer than
        ``agent_lost_timeout_s``."""
        present = self.present()
        if present >= self.min_agents:
            self._short_since = None
            return
        self._short_since = self._short_since if self._short_since is not None else now
        if now - self._short_since > self.agent_lost_timeout_s:
            raise RunFailedError(
                f"only {present} of {len(self.agents)} agents answered for {now - self._short_since:.0f}s "
                f"(absent: {sorted(self.absent)}); training.min_agents={self.min_agents}: check the executors' "
                f"logs, or lower training.min_agents to go on with fewer")


__all__ = ["PresenceBook", "silent_agent_wait_s"]
