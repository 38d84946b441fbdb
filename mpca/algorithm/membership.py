"""Who is in DDP's process group: generations of membership agreed through the driver's TCPStore.

A torch.distributed process group is fixed when it forms.  When a rank is lost (its executor gone, so the
collective raises on the others) or a replacement arrives (Spark retried the lost agent's task), the members
form a new group — a new **generation** — under a store prefix of its own, as torchft re-forms its quorum
(there at every step; here only when membership changes):

1. every participant registers *ready* for generation g with its step count;
2. the ready set settles: it reaches the number expected (a join: the old members plus the newcomers), or
   it stops growing for ``settle_s`` (a loss: nobody knows how many are left);
3. the first participant to decide writes the members atomically (``compare_set``); everyone reads that
   one record, so every member agrees on the ranks, the world size and the **source** — the member furthest
   ahead, whose model and optimizer state every member adopts (:func:`decide`).

A participant that finds itself left out of a decided generation (it came late) asks to join the next one.
A newcomer registers, then raises the store's ``joins`` counter; the members see it between two steps
(:meth:`Membership.joins`, polled about once a second and agreed on through DDP's own all-reduce) and re-form
with it.  Generation 0 is the run's first K arrivals, by agent id, as before; an elastic run (fewer agents
at the start than it may have) decides generation 1 from whoever is up first, like a join.

Only decisions and counters go through the store (JSON and integers); the state itself travels over the new
group's own collectives (:mod:`mpca.algorithm.ddp`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple


@dataclass(frozen=True)
class Generation:
    """One agreed membership of the process group."""

    number: int
    members: Tuple[int, ...]  # agent ids, in rank order
    source: int  # the agent whose model and optimizer state every member adopts
    steps: int  # the source's step count
    joins: int  # newcomers' requests counted when it was decided

    @property
    def world(self) -> int:
        return len(self.members)

    def rank(self, agent: int) -> int:
        return self.members.index(agent)

    def to_json(self) -> str:
        return json.dumps({"number": self.number, "members": list(self.members), "source": self.source,
                           "steps": self.steps, "joins": self.joins})

    @classmethod
    def from_json(cls, text) -> "Generation":
        d = json.loads(text)
        return cls(int(d["number"]), tuple(int(a) for a in d["members"]), int(d["source"]), int(d["steps"]),
                   int(d["joins"]))


def first_generation(agents: int) -> Generation:
    """Generation 0: agents 0 … K − 1 as ranks 0 … K − 1, all from the run's first model."""
    return Generation(0, tuple(range(agents)), source=0, steps=0, joins=0)


def decide(number: int, ready: Dict[int, int], joins: int) -> Generation:
    """Generation ``number`` from the participants ready for it (agent id → its step count): every one of
    them, ranked by agent id; the source is the one with the most steps (the lowest id among equals), so a
    newcomer (0 steps) adopts the survivors' replica and survivors one step apart end identical."""
    if not ready:
        raise ValueError("a generation needs at least one ready participant")
    steps = max(ready.values())
    source = min(a for a, s in ready.items() if s == steps)
    return Generation(number, tuple(sorted(ready)), source, steps, joins)


class Membership:
    """One agent's side of the protocol over ``store`` (a torch.distributed store shared by the run).

    ``settle_s``: how long the ready set must stay unchanged before a loss's generation is decided;
    ``join_grace_s``: how long a newcomer waits for members before it decides without them (every earlier
    member gone); ``timeout_s``: how long anyone waits for a decision at all."""

    def __init__(self, store, agent: int, agents: int, *, settle_s: float = 2.0, join_grace_s: float = 30.0,
                 timeout_s: float = 120.0, stopping: Callable[[], bool] = bool, poll_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.store, self.agent, self.agents = store, agent, agents
        self.settle_s, self.join_grace_s, self.timeout_s = settle_s, join_grace_s, timeout_s
        self.stopping, self.poll_s, self.clock, self.sleep = stopping, poll_s, clock, sleep

    # ---------------------------------------------------------------- counters
    def arrive(self, first: Optional[int] = None) -> bool:
        """Count this process in; True for the run's first ``first`` (default K) arrivals: generation 0's
        members, or an elastic run's starters, who decide generation 1 among themselves."""
        return int(self.store.add("arrivals", 1)) <= (first or self.agents)

    def joins(self) -> int:
        """Newcomers' requests to join so far."""
        return int(self.store.add("joins", 0))

    def latest(self) -> int:
        """The highest generation number known decided (0 before any re-forming)."""
        return int(self.store.get("latest")) if self.store.check(["latest"]) else 0

    # ---------------------------------------------------------------- re-forming
    def join(self) -> Optional[Generation]:
        """A newcomer's way in: register for the next generation, ask the members to re-form, wait."""
        return self.next(self.latest(), steps=0, expected=None, newcomer=True)

    def next(self, after: int, steps: int, expected: Optional[int], newcomer: bool = False) -> Optional[Generation]:
        """Register for generation ``after`` + 1 and wait until it is decided; the generation this agent is a
        member of (left out: it asks to join the next one), or None once the driver asks to stop.

        ``expected``: how many participants a join brings (decided as soon as that many are ready);
        None after a loss (decided once the ready set has stayed unchanged for ``settle_s``)."""
        number = after + 1
        deadline = self.clock() + self.timeout_s
        while True:
            while self.store.check([self._key(number, "members")]) and not self._member_of(number):
                number += 1  # decided without this agent before it registered: it asks to join the next one
                newcomer = True
            self.store.set(self._key(number, "ready", self.agent), str(int(steps)))
            self.store.add(self._key(number, "count"), 1)
            if newcomer:  # after the ready key: a counted join is always visible to a decider
                self.store.add("joins", 1)
            # one who asked to join gives the members time to notice and come (unless every one of them is gone)
            gen = self._await(number, expected, deadline, grace=self.join_grace_s if newcomer else 0.0)
            if gen is None or self.agent in gen.members:
                return gen
            number += 1  # came too late for it: the members re-form again, with this agent
            newcomer, expected = True, None

    def _await(self, number: int, expected: Optional[int], deadline: float, grace: float) -> Optional[Generation]:
        key = self._key(number, "members")
        started = self.clock()
        seen, stable_since = -1, started
        while True:
            if self.stopping():
                return None
            if self.store.check([key]):
                return self._read(number)
            count = int(self.store.add(self._key(number, "count"), 0))
            now = self.clock()
            if count != seen:
                seen, stable_since = count, now
            settled = (expected is not None and count >= expected) or now - stable_since >= self.settle_s
            if settled and now - started >= grace:
                return self._decide(number)
            if now > deadline:
                raise RuntimeError(f"ddp: agent {self.agent} waited {self.timeout_s:.0f}s for the process group's "
                                   f"generation {number} to be decided (raise algorithm.timeout_s if the cluster "
                                   "is slow to replace executors)")
            self.sleep(self.poll_s)

    def _decide(self, number: int) -> Generation:
        joins = self.joins()  # before the scan: every join counted here registered ready first
        ready = {}
        for a in range(self.agents):
            key = self._key(number, "ready", a)
            if self.store.check([key]):
                ready[a] = int(self.store.get(key))
        mine = decide(number, ready, joins).to_json()
        agreed = self.store.compare_set(self._key(number, "members"), "", mine)  # the first decision stands
        self.store.set("latest", str(number))
        return Generation.from_json(agreed)

    def _read(self, number: int) -> Generation:
        return Generation.from_json(self.store.get(self._key(number, "members")))

    def _member_of(self, number: int) -> bool:
        return self.agent in self._read(number).members

    @staticmethod
    def _key(number: int, what: str, agent: Optional[int] = None) -> str:
        return f"g{number}/{what}" if agent is None else f"g{number}/{what}/{agent}"
