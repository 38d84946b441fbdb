"""Who is in the run: the agents the driver expects, which of them stopped answering (hung, or their executor
lost), which are replacements waiting for the joint model, whose contributions reached a reduction, and the
bounded wait for a silent agent.  The pipeline asks; this module keeps the book."""
from __future__ import annotations

import collections
import logging
import time
from typing import Dict, Iterable, Optional, Set, Tuple

from mpca.errors import RunFailedError
from mpca.runtime.record import ExchangeRecord
from mpca.runtime.timeline import CycleRecord
from mpca.stopping import silent_agent_wait_s

log = logging.getLogger("mpca.pipeline")


class AgentRoster:
    """The agents of one run and their presence.

    ``agent_wait_s``: how long a cycle waits for a silent agent (None: 5 × the median recent cycle, within
    2–10 s); fewer than ``min_agents`` answering for ``agent_lost_timeout_s`` fails the run."""

    def __init__(self, agents: Iterable[int], agent_wait_s: Optional[float] = None, min_agents: int = 1,
                 agent_lost_timeout_s: float = 120.0):
        self.agents = sorted(agents)
        self.agent_wait_s = agent_wait_s
        self.min_agents = min_agents
        self.agent_lost_timeout_s = agent_lost_timeout_s
        self.absent: Dict[int, float] = {}  # agents that stopped answering: since when; left out of corrections
        self.joining: Set[int] = set()  # replacements (Spark retried their task) waiting for the joint model
        self.pids: Dict[int, int] = {}  # the process of each agent; another process answering is a replacement
        self.not_started: Set[int] = set()  # an elastic run's agents whose task has not had room yet
        self.left: Set[int] = set()  # agents that left the run (decommissioned executors)
        self._short_since: Optional[float] = None  # since when fewer than min_agents answer
        self._durations: collections.deque = collections.deque(maxlen=20)
        self._counted: Dict[int, collections.deque] = {a: collections.deque(maxlen=64) for a in self.agents}

    def reset(self, agents: Iterable[int], later: Iterable[int] = ()) -> None:
        """The agents that came up (after the hello), and those of an elastic run expected later: absent until
        they answer (then they join from the joint model, as replacements do)."""
        later = set(later)
        self.agents = sorted(set(agents) | later)
        self.not_started = later
        now = time.time()
        self.absent.update({a: now for a in later})
        self._counted = {a: self._counted.get(a, collections.deque(maxlen=64)) for a in self.agents}

    def wait_s(self) -> float:
        """The bounded wait for a silent agent: configured, or 5 × the median recent cycle within 2–10 s."""
        return silent_agent_wait_s(self.agent_wait_s, self._durations)

    def cycle_took(self, seconds: float) -> None:
        self._durations.append(seconds)

    def counted(self) -> Dict[int, Tuple[int, ...]]:
        """Per agent, the recent cycles whose contribution reached the reduction (sent with the yield)."""
        return {a: tuple(d) for a, d in self._counted.items()}

    def missing_from(self, answered: Dict[int, object]) -> list:
        """Agents expected to answer but not in ``answered``, leaving out those counted absent."""
        return [a for a in self.agents if a not in answered and a not in self.absent]

    def came_up(self, agents: Iterable[int]) -> None:
        """Agent-initiated algorithms: which agents have called the parameter service (an elastic run's late
        ones come up this way; the cycle algorithms' come through :meth:`track`)."""
        for a in self.not_started & set(agents):
            self.not_started.discard(a)
            log.warning("agent %s came up %.1fs into the run (elastic): it starts from the server's current model",
                        a, time.time() - self.absent.pop(a, time.time()))

    def remove(self, agents: Iterable[int]) -> None:
        """Agents that left: no longer expected, waited for, or counted."""
        for a in agents:
            self.absent.pop(a, None)
            self.joining.discard(a)
            self.left.add(a)
            if a in self.agents:
                self.agents.remove(a)

    def joined(self, agents: Iterable[int], pids: Dict[int, int]) -> None:
        """Replacements that received the joint model: they contribute from their next yield on."""
        agents = list(agents)
        self.joining -= set(agents)
        self.pids.update({a: pids[a] for a in agents})

    def track(self, rec: CycleRecord, result: ExchangeRecord) -> None:
        """Who answered in cycle ``rec.cycle``: absent agents and replacements, counted contributions, and the
        ``min_agents`` rule (:class:`RunFailedError` once too few answered for too long)."""
        now = time.time()
        answered = result.agents
        rec.missing = [a for a in self.agents if a not in answered or answered[a].joining]
        for a in self.agents:
            if a in answered:
                if a in self.not_started:
                    self.not_started.discard(a)
                    log.warning("agent %s came up %.1fs into the run (elastic): it joins from the joint model", a,
                                now - self.absent.pop(a))
                elif a in self.absent:
                    log.warning("agent %s answers again after %.1fs%s", a, now - self.absent.pop(a),
                                " (a replacement: it joins from the joint model)" if answered[a].joining else "")
                if answered[a].joining:
                    self.joining.add(a)
                elif answered[a].t_yield:
                    self._counted[a].append(rec.cycle)  # its contribution reached the reduction
            elif a not in self.absent:
                self.absent[a] = now
                log.warning("agent %s did not answer in cycle %d within %.1fs (hung, or its executor lost); the "
                            "cycles go on without it and its weight carries over", a, rec.cycle, self.wait_s())
        present = len(self.agents) - len(self.absent)
        if present >= self.min_agents:
            self._short_since = None
            return
        self._short_since = self._short_since or now
        if now - self._short_since > self.agent_lost_timeout_s:
            raise RunFailedError(
                f"only {present} of {len(self.agents)} agents answered for {now - self._short_since:.0f}s "
                f"(absent: {sorted(self.absent)}); training.min_agents={self.min_agents}: check the executors' "
                f"logs, or lower training.min_agents to go on with fewer")
