"""Who is in the run, as the Spark runtime keeps it: the exchange core's presence book
(:class:`~mpca.exchange.presence.PresenceBook`: absent, joining, not started, left, the bounded wait, the
``min_agents`` rule) on the wall clock, with what only the runtime needs — the process each agent runs in (another
process answering is a replacement) and whose contributions reached a reduction — and its log lines.  The pipeline
asks; this module keeps the book."""
from __future__ import annotations

import collections
import logging
import time
from typing import Dict, Iterable, Optional, Tuple

from mpca.exchange.presence import PresenceBook
from mpca.runtime.record import ExchangeRecord
from mpca.runtime.timeline import CycleRecord

log = logging.getLogger("mpca.pipeline")


class AgentRoster(PresenceBook):
    """The agents of one run and their presence (:class:`~mpca.exchange.presence.PresenceBook`), on the wall clock.

    ``agent_wait_s``: how long a cycle waits for a silent agent (None: 5 × the median recent cycle, within
    2–10 s); fewer than ``min_agents`` answering for ``agent_lost_timeout_s`` fails the run."""

    def __init__(self, agents: Iterable[int], agent_wait_s: Optional[float] = None, min_agents: int = 1,
                 agent_lost_timeout_s: float = 120.0):
        super().__init__(agents, agent_wait_s, min_agents, agent_lost_timeout_s)
        self.pids: Dict[int, int] = {}  # the process of each agent; another process answering is a replacement
        self._counted: Dict[int, collections.deque] = {a: collections.deque(maxlen=64) for a in self.agents}

    def reset(self, agents: Iterable[int], later: Iterable[int] = ()) -> None:
        """The agents that came up (after the hello), and those of an elastic run expected later: absent until
        they answer (then they join from the joint model, as replacements do)."""
        self.agents, self.not_started = sorted(agents), set()
        self.expect_later(later, time.time())
        self._counted = {a: self._counted.get(a, collections.deque(maxlen=64)) for a in self.agents}

    def counted(self) -> Dict[int, Tuple[int, ...]]:
        """Per agent, the recent cycles whose contribution reached the reduction (sent with the yield)."""
        return {a: tuple(d) for a, d in self._counted.items()}

    def came_up(self, agents: Iterable[int]) -> None:
        """Agent-initiated algorithms: which agents have called the parameter service (an elastic run's late
        ones come up this way; the cycle algorithms' come through :meth:`track`)."""
        for a in sorted(self.not_started & set(agents)):
            log.warning("agent %s came up %.1fs into the run (elastic): it starts from the server's current model",
                        a, self.answered(a, time.time()) or 0.0)

    def joined(self, agents: Iterable[int], pids: Optional[Dict[int, int]] = None) -> None:
        """Replacements that received the joint model, each in process ``pids[agent]``: they contribute from
        their next yield on."""
        agents = list(agents)
        super().joined(agents)
        self.pids.update({a: pids[a] for a in agents} if pids else {})

    def track(self, rec: CycleRecord, result: ExchangeRecord) -> None:
        """Who answered in cycle ``rec.cycle``: absent agents and replacements, counted contributions, and the
        ``min_agents`` rule (:class:`~mpca.errors.RunFailedError` once too few answered for too long)."""
        now = time.time()
        answered = result.agents
        rec.missing = [a for a in self.agents if a not in answered or answered[a].joining]
        for a in self.agents:
            if a in answered:
                late = a in self.not_started
                away = self.answered(a, now)
                if late:
                    log.warning("agent %s came up %.1fs into the run (elastic): it joins from the joint model", a,
                                away or 0.0)
                elif away is not None:
                    log.warning("agent %s answers again after %.1fs%s", a, away,
                                " (a replacement: it joins from the joint model)" if answered[a].joining else "")
                if answered[a].joining:
                    self.joining.add(a)
                elif answered[a].t_yield:
                    self._counted[a].append(rec.cycle)  # its contribution reached the reduction
            elif self.count_absent([a], now):
                log.warning("agent %s did not answer in cycle %d within %.1fs (hung, or its executor lost); the "
                            "cycles go on without it and its weight carries over", a, rec.cycle, self.wait_s())
        self.check_quorum(now)
