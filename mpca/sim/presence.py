"""Agents that go away and come back, in virtual time — what ``lab.faults`` does to the runtime's agents.

* ``hang``: the agent's process stops at ``at_s`` and resumes ``for_s`` later with its state (SIGSTOP, a long
  GC pause, a stalled host); meanwhile it neither steps nor answers, and the broadcasts it would have received
  are missed.
* ``lost``: the process is gone at ``at_s`` (its executor lost), with its model and optimizer; Spark's retried
  task brings a replacement up ``for_s`` later (scheduling, data read, build), which joins from the driver's
  joint model (``DriverRule.join_vectors``) with a fresh rule and optimizer, as the runtime's replacements do.

The runtime's rules, which the pipeline (:mod:`mpca.sim.cycles`) applies with the exchange core's presence book
(:class:`~mpca.exchange.presence.PresenceBook`, kept here in virtual time): a cycle waits for an agent whose
process does not answer its task at most :func:`~mpca.exchange.presence.silent_agent_wait_s` (``cluster.agent_wait_s``,
else 5 × the median recent cycle within 2–10 s), then goes on without it and counts it *absent*; an agent that
answered but is mid-round is waited for, and a lost one fails its task at once; later cycles do not wait for
absent agents but take their contribution if it comes in time (the agent is back), and while an absent agent is
stopped each job's handshake with it costs ``NetworkConstants.absent_claim_s``; a replacement that is up joins at
the end of the next cycle, by a join job that broadcasts the whole joint model to it; the driver rule's
``on_membership`` hears the number of agents present whenever it changes.  Not modelled: the runtime's
corrective jobs (tasks that landed where no agent was) — a simulated task always finds its agent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from mpca.exchange.presence import PresenceBook

KINDS = ("hang", "lost")
CHANGES = ("lost", "joined")


@dataclass(frozen=True)
class Absence:
    """Agent ``agent`` away from ``at_s`` for ``for_s`` virtual seconds: ``hang`` or ``lost`` (see the module)."""

    agent: int
    at_s: float
    for_s: float
    kind: str = "hang"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"an absence is one of {KINDS}, got {self.kind!r}")
        if self.agent < 0 or not self.at_s >= 0 or not self.for_s > 0:
            raise ValueError(f"an absence needs agent >= 0, at_s >= 0 and for_s > 0, got {self}")

    @classmethod
    def parse(cls, text: str, kind: str) -> "Absence":
        """``AGENT:AT:FOR`` (e.g. ``1:20:8``: agent 1, 20 s into the run, for 8 s)."""
        parts = text.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            return cls(int(parts[0]), float(parts[1]), float(parts[2]), kind)
        except ValueError:
            raise ValueError(f"an absence is AGENT:AT:FOR in seconds, e.g. 1:20:8, got {text!r}") from None


@dataclass(frozen=True)
class MembershipChange:
    """A change of the run's agents at a cycle's boundary, as a run's timeline records it (a replay): ``lost`` —
    agent ``agent``'s process is gone before cycle ``cycle`` opens (or, in an elastic run, not up yet); ``joined``
    — its replacement (or the late agent) joins from the joint model as cycle ``cycle`` ends."""

    cycle: int
    agent: int
    kind: str

    def __post_init__(self):
        if self.kind not in CHANGES or self.cycle < 0 or self.agent < 0:
            raise ValueError(f"a membership change is one of {CHANGES} at a cycle >= 0 of an agent >= 0, got {self}")


def replayed(missing: Sequence[Iterable[int]], joined: Sequence[Iterable[int]]) -> Tuple[MembershipChange, ...]:
    """A run's membership from its cycles (``missing[c]``: the agents cycle ``c`` went without, ``joined[c]``: those
    handed the joint model after it), as the changes that make a simulation go through the same: an agent missing
    from a cycle it was present in before is lost before it; a join follows its cycle."""
    changes, away = [], set()
    for c, (miss, joins) in enumerate(zip(missing, joined)):
        for a in sorted(set(miss) - away):
            changes.append(MembershipChange(c, a, "lost"))
            away.add(a)
        for a in sorted(joins):
            changes.append(MembershipChange(c, a, "joined"))
            away.discard(a)
    return tuple(changes)


class Presence(PresenceBook):
    """One simulation's agents: the driver's presence book (:class:`~mpca.exchange.presence.PresenceBook`: whom the
    pipeline counts absent, the bounded wait) and what the simulator plays of their processes — each one's
    generation (a loss starts the next, and the old process's pending events are dropped), until when it is stopped
    (a hang), which replacements are up and waiting to join."""

    def __init__(self, agents: int, absences: Iterable[Absence] = (), agent_wait_s: Optional[float] = None):
        super().__init__(range(agents), agent_wait_s)
        self.absences: Tuple[Absence, ...] = tuple(absences)
        bad = [a.agent for a in self.absences if a.agent >= agents]
        if bad:
            raise ValueError(f"absences name agents {bad}, but the run has agents 0..{agents - 1}")
        self.K = agents
        self.generation = [0] * agents
        self.stopped_until = [0.0] * agents
        self.gone: Set[int] = set()  # lost, replacement not up yet
        self.up_to_join: Dict[int, float] = {}  # replacement up (since when), not joined yet

    def _running(self, agent: int) -> bool:
        """Its process exists and has joined (not lost, not a replacement waiting to join)."""
        return agent not in self.gone and agent not in self.up_to_join

    def acts(self, agent: int, t: float) -> bool:
        """Whether the agent's process can step, answer or receive at ``t``."""
        return self._running(agent) and t >= self.stopped_until[agent]

    def stopped(self, agent: int, t: float) -> bool:
        """Its process is stopped at ``t`` (a hang): alive, its socket accepting, not answering."""
        return self._running(agent) and t < self.stopped_until[agent]

    def stop(self, absence: Absence) -> None:
        """The absence begins: a hang stops the process until its end; a loss ends the process."""
        a = absence.agent
        if absence.kind == "hang":
            self.stopped_until[a] = max(self.stopped_until[a], absence.at_s + absence.for_s)
        else:
            self.generation[a] += 1
            self.gone.add(a)

    def replacement_up(self, agent: int, t: float) -> None:
        self.gone.discard(agent)
        self.up_to_join[agent] = t

    def ready_to_join(self, t: float) -> List[int]:
        """Replacements up by ``t``: the cycle ending at ``t`` hands them the joint model."""
        return sorted(a for a, up in self.up_to_join.items() if up <= t)

    def joined(self, agents: Iterable[int]) -> None:
        """Replacements that received the joint model: running again, present."""
        agents = list(agents)
        for a in agents:
            self.up_to_join.pop(a, None)
        super().joined(agents)
