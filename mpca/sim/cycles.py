"""The driver's 3-phase pipeline (§4.2, Figs. 6–8) in virtual time: the exchange core's schedule
(:class:`~mpca.exchange.schedule.PhaseSchedule` — which shard a cycle reduces and broadcasts, when a reduction is
staged), driven by the virtual clock, as the runtime's pipeline drives it with Spark jobs.  A staged shard is
published encoded with the driver's error feedback per shard.

A job's times come from the network model (:mod:`mpca.sim.network`): it starts ``job_overhead_s`` after its
submission; the broadcast reaches every agent after :func:`~mpca.sim.network.broadcast_time`, where the
simulator calls ``rule.receive``; each agent's yield request reaches it at once — the runtime's reduce job does
not wait for the deliver job's download (with one task slot per agent its reduce task takes the slot first; the
deliver task's wait for it, a fraction of a second, is not modelled) — or, for a rule that needs the delivery
before its agents yield (``deliver_before_yield``) on one slot per agent (not ``split_tasks``), after the
download, where one task per agent does both; its contribution (``rule.contribution``, encoded as the agent's runtime does) is taken then —
or, for a rule whose ``yield_ready`` is not ready (a round not finished), as soon as it is.  The partials are
combined along treeReduce's levels (``WeightedSum``; a lossy format: ``EncodedSum``, one rounding per level)
and reach the driver at :func:`~mpca.sim.network.tree_reduce_arrival`; the job ends when both are done and the
exchange's CPU is spent (:func:`~mpca.sim.network.exchange_cpu_time`, none unless the constants model it), and the
next cycle starts then, or ``cycle_interval_s`` after this one started.

Agents that hang or are lost (:mod:`mpca.sim.presence`): a job waits for an agent whose process does not answer
its task (the runtime's claim) at most the presence book's bounded wait after it starts running, then
counts it absent and reduces what it has (or nothing) — an agent that answered but has not yielded yet (a round
in progress) is waited for, as the runtime's yield waits, and a lost one fails its task at once.  A job does not
wait for absent agents but takes their contribution while it is open, and while one of them is stopped its tasks'
handshake with it holds the job ``absent_claim_s`` after it starts running.  At its end a join job (``job_overhead_s``
and a broadcast of the whole model to the replacements) hands every replacement that is up the driver rule's
join vectors, before the next cycle starts; ``on_membership`` hears the number of agents present when it
changes.  Corrective jobs are not simulated: a task always finds its agent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple


from mpca.algorithm.base import DriverRule
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.partials import Partial, contribution, fold, in_agent_order
from mpca.exchange.schedule import CycleOpen, PhaseSchedule
from mpca.sim.clock import VirtualClock
from mpca.sim.network import (broadcast_time, driver_copies, driver_partials, exchange_cpu_time, tree_groups,
                              tree_levels, tree_reduce_arrival)
from mpca.sim.constants import NetworkConstants
from mpca.sim.presence import Presence
from mpca.sim.result import CycleStat


@dataclass
class Job:
    opened: CycleOpen
    submitted: float
    yield_at: float
    bcast_end: float
    bcast_bytes: int
    waiting: set = field(default_factory=set)  # agents whose contribution is not taken yet
    partials: Dict[int, Tuple[float, Partial, int]] = field(default_factory=dict)  # agent → (ready, partial, bytes)
    optional: set = field(default_factory=set)  # agents counted absent: taken if they answer, not waited for
    claimed: set = field(default_factory=set)  # agents whose process answered the task (a round may still run)
    closed: bool = False  # reduced (or given up on): no more contributions
    not_before: float = 0.0  # the job cannot end earlier (its tasks' handshake with a stopped absent agent)
    missing: List[int] = field(default_factory=list)  # agents whose contribution did not reach the reduction

    @property
    def bcast_shard(self) -> Optional[int]:
        return self.opened.staged.shard if self.opened.staged else None


def tree_combine(partials: List[Partial]) -> Partial:
    """The partials combined along treeReduce's levels (:func:`~mpca.sim.network.tree_levels`), then on the
    driver in order."""
    items = list(partials)
    for reducers in tree_levels(len(items)):
        items = [fold(group) for group in tree_groups(items, reducers)]
    return fold(items)


class VirtualPipeline:
    """Runs the cycles of a driver-initiated algorithm on ``clock``. ``deliver(agent, shard, data, params, t, cycle)``
    hands an agent an encoded broadcast; ``contribute(agent, shard, params, cycle, broadcasts)`` returns (bytes,
    weight, extra) or None when the agent is not ready to yield (its rule's round, its lock-step window; the
    simulator calls :meth:`offer` after its next step); it is asked only while ``presence`` says the agent's process
    can answer; ``broadcasts``: the cycle hands the agents a broadcast too. ``presence``: who is absent or joining;
    ``join(agents, params, t)`` hands replacements the joint model (``join_bytes``: its size on the wire)."""

    def __init__(self, clock: VirtualClock, rule: DriverRule, agents: int, codec: Codec, net: NetworkConstants,
                 interval_s: float, deliver: Callable, contribute: Callable, numel: Callable[[int], int],
                 presence: Optional[Presence] = None, join: Optional[Callable] = None, join_bytes: int = 0,
                 ordered: bool = False, before_cycle: Optional[Callable[[int, float], None]] = None,
                 after_cycle: Optional[Callable[[int, float], None]] = None):
        self.clock, self.rule, self.K, self.codec, self.net = clock, rule, agents, codec, net
        self.interval_s = interval_s
        self.deliver, self.contribute, self.numel = deliver, contribute, numel
        self.presence = presence if presence is not None else Presence(agents)
        self.join, self.join_bytes = join, join_bytes
        self.ordered = ordered  # cluster.reduce: ordered — the partials added in agent order, not along the tree
        # a scripted membership's changes (mpca.sim.presence.MembershipChange): before a cycle opens, as it ends
        self.before_cycle, self.after_cycle = before_cycle, after_cycle
        self.present = agents  # as the driver rule last heard it (on_membership)
        self.feedback = ErrorFeedback(codec)  # the driver's broadcasts, one residual per shard
        self.schedule: PhaseSchedule[bytes] = PhaseSchedule(
            rule, lambda shard, vec: self.feedback.encode(shard, vec.numpy()))
        self.job: Optional[Job] = None
        self.stats: List[CycleStat] = []
        self.cycle_no = 0

    def start(self, t: float) -> None:
        self.clock.schedule(t, self._cycle)

    @property
    def rejected(self) -> int:
        """Reductions not applied: their sum held NaN/Inf."""
        return self.schedule.rejected

    def _cycle(self, t: float) -> None:
        if self.before_cycle is not None:
            self.before_cycle(self.cycle_no, t)
        opened = self.schedule.open(self.cycle_no)
        staged, params = opened.staged, opened.params
        self.schedule.overlap()  # concurrent with the job
        run = t + self.net.job_overhead_s
        bcast_bytes = len(staged.payload) if staged else 0
        bcast_end = run + broadcast_time(self.K, bcast_bytes, self.net) if staged else run
        waits = staged and self.rule.deliver_before_yield and not self.net.split_tasks  # one task does both
        yield_at = bcast_end if waits else run
        absent = set(self.presence.absent)
        stopped = any(self.presence.stopped(a, run) for a in absent)  # its socket accepts, then the claim times out
        job = Job(opened, t, yield_at, bcast_end, bcast_bytes,
                  waiting=set(range(self.K)) - absent, optional=absent,
                  not_before=run + self.net.absent_claim_s if stopped else 0.0)
        self.job = job
        if staged:
            for a in range(self.K):  # scheduled before the yields: a delivery at the same instant comes first
                self.clock.schedule(bcast_end,
                                    lambda when, a=a: self.deliver(a, staged.shard, staged.payload, params, when,
                                                                   opened.cycle))
        for a in range(self.K):
            self.clock.schedule(yield_at, lambda when, a=a: self.offer(a, when))
        self.clock.schedule(run + self.presence.wait_s(), lambda when: self._give_up(job, when))

    def _give_up(self, job: Job, t: float) -> None:
        """The bounded wait is over: agents whose process never answered the task (the runtime's claim) are
        counted absent and no longer waited for; an agent that answered but has not yielded yet (a round in
        progress) is still waited for.  With nobody left to wait for, the job reduces what it has."""
        silent = job.waiting - job.claimed
        if job.closed or not silent:
            return
        self.presence.count_absent(silent, t)
        job.waiting -= silent
        if not job.waiting:
            self._close_without(job, t)

    def _close_without(self, job: Job, t: float) -> None:
        """Nobody left to wait for: reduce what came, or end the cycle with nothing to reduce."""
        if job.partials:
            self._reduced(job, not_before=max(t, job.not_before))
            return
        job.closed = True  # nobody answered: no reduction this cycle
        job.missing = list(range(self.K))
        end = max(t, job.not_before)
        stat = CycleStat(job.opened.cycle, job.submitted, end, job.opened.shard, job.bcast_shard, bytes_in=0,
                         bytes_out=int(round(driver_copies(self.K, self.net) * job.bcast_bytes)), bytes_up=0,
                         missing=job.missing)
        self.clock.schedule(end, lambda when: self._end(job, None, stat, when))

    def lost(self, agent: int, t: float) -> None:
        """``agent``'s process is gone: a task that holds it fails at once (the runtime's yield sees the channel
        close), so the open job stops waiting for it and the run counts it absent."""
        job = self.job
        self.presence.count_absent([agent], t)
        if job is None or job.closed or agent not in job.waiting:
            return
        job.waiting.discard(agent)
        job.claimed.discard(agent)
        if not job.waiting:
            self._close_without(job, t)

    def offer(self, agent: int, t: float) -> None:
        """Take ``agent``'s contribution to the current job if it is asked for by ``t`` and ready."""
        job = self.job
        if job is None or job.closed or t < job.yield_at or (agent not in job.waiting and agent not in job.optional):
            return
        if not self.presence.acts(agent, t):  # stopped, lost or not joined: it cannot answer the task
            return
        job.claimed.add(agent)
        got = self.contribute(agent, job.opened.shard, job.opened.params, job.opened.cycle, job.opened.staged is not None)
        if got is None:
            return
        data, weight, _ = got
        partial = contribution(data, self.numel(job.opened.shard), weight, self.codec)
        job.partials[agent] = (t, partial, len(data))
        job.waiting.discard(agent)
        job.optional.discard(agent)
        self.presence.answered(agent, t)
        if not job.waiting:  # after the offers due at this instant: an absent agent's answer may be among them
            self.clock.schedule(t, lambda when: self._reduced(job, not_before=job.not_before))

    def _reduced(self, job: Job, not_before: float = 0.0) -> None:
        if job.closed:
            return
        job.closed = True
        job.missing = sorted(set(range(self.K)) - set(job.partials))
        order = sorted(job.partials)
        nbytes = max(b for _, _, b in job.partials.values())
        arrival = tree_reduce_arrival([job.partials[a][0] for a in order], nbytes, self.net)
        end = max(arrival, job.bcast_end, not_before) + exchange_cpu_time(self.K, nbytes + job.bcast_bytes, self.net)
        partial = (in_agent_order({a: job.partials[a][1] for a in order}) if self.ordered
                   else tree_combine([job.partials[a][1] for a in order]))
        stat = CycleStat(job.opened.cycle, job.submitted, end, job.opened.shard, job.bcast_shard,
                         bytes_in=driver_partials(self.K) * nbytes,
                         bytes_out=int(round(driver_copies(self.K, self.net) * job.bcast_bytes)),
                         bytes_up=sum(b for _, _, b in job.partials.values()), missing=job.missing)
        self.clock.schedule(end, lambda when: self._end(job, partial, stat, when))

    def _end(self, job: Job, partial: Optional[Partial], stat: CycleStat, t: float) -> None:
        self.stats.append(stat)
        self.job = None
        self.presence.cycle_took(t - job.submitted)
        self.schedule.close(job.opened, partial)  # None: nobody answered, nothing to stage
        self.cycle_no += 1
        present = self.presence.present()
        if present and present != self.present:  # as the runtime: settings that follow K follow the agents present
            self.present = present
            self.rule.on_membership(present)
        nxt = max(t, job.submitted + self.interval_s)
        if self.after_cycle is not None:
            self.after_cycle(job.opened.cycle, t)
        joiners = self.presence.ready_to_join(t)
        if joiners and self.join is not None:  # the runtime's join job, before the next cycle
            done = t + self.net.job_overhead_s + broadcast_time(len(joiners), self.join_bytes, self.net)
            stat.joined = joiners
            params = self.rule.cycle_params(job.opened.cycle)  # asked again after the staging, as the runtime's join job
            self.clock.schedule(done, lambda when: self.join(joiners, params, when))
            nxt = max(nxt, done)
        if nxt <= job.submitted:
            raise ValueError(f"cycle {job.opened.cycle} took no virtual time, so cycles would never let the agents step: "
                             "give the network a job overhead or a finite rate, or the algorithm a "
                             "min_cycle_interval_s")
        self.clock.schedule(nxt, self._cycle)
