"""The driver's 3-phase pipeline (§4.2, Figs. 6–8) run with Spark: stage → broadcast → reduce, one reduce job per
cycle and, concurrent with it, a deliver job for the broadcast shard.

The schedule — which shard cycle ``c`` reduces (``c mod S``), which staged shard its job broadcasts, when a
reduction is staged (while the next job runs with S ≥ 3, between jobs with S ≤ 2, the first at once), what leaving
agents handed in — is the exchange core's :class:`~mpca.exchange.schedule.PhaseSchedule`, which the simulator
drives too; a staged shard is published here as a Spark broadcast variable.  MPCA stages every reduction between
jobs by default (``algorithm.mpca.stage: between``, :meth:`mpca.algorithm.mpca.MPCADriver.stage_lag`): its
projections reach the agents a cycle sooner, for a cycle longer by the staging.

Agent-initiated algorithms (``exchange = "service"``) exchange through the
parameter service instead; their cycles run no Spark job and only observe.

This module runs the schedule's cycles as Spark jobs.  Who is present, absent or joining is the
:class:`~mpca.runtime.roster.AgentRoster`'s; the broadcasts' lifetimes are
:class:`~mpca.runtime.broadcasts.Broadcasts`'; submitting a job is
:class:`~mpca.runtime.jobs.ExchangeJobs`'; what a job returns is an
:class:`~mpca.runtime.record.ExchangeRecord`; what each task does is
:mod:`mpca.runtime.exchange`'s; the start handshake and the stop are
:mod:`mpca.runtime.control`'s.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Tuple

import torch

from mpca.algorithm import Algorithm, DriverRule, WeightedSum
from mpca.errors import RunFailedError, UserError
from mpca.exchange.schedule import PhaseSchedule, StageOutcome
from mpca.runtime.broadcasts import Broadcasts
from mpca.runtime.exchange import ExchangePlan
from mpca.runtime.jobs import ExchangeJobs
from mpca.runtime.layout import ExchangeLayout
from mpca.runtime.record import ExchangeRecord
from mpca.runtime.reports import AgentReport
from mpca.runtime.roster import AgentRoster
from mpca.runtime.timeline import CycleRecord, Timeline

log = logging.getLogger("mpca.pipeline")

MAX_CORRECTIONS = 5
CANCELLED_WAIT_S = 30.0  # how long an abandoned cycle's cancelled job may take to end before the next one goes on


def agent_failure(agent: int, message: str, user_error: bool) -> Exception:
    """What an agent's error becomes on the driver: the user's one line (e.g. labels its model cannot take,
    found as its rows arrived), else a failed run naming the agent."""
    return UserError(message) if user_error else RunFailedError(f"agent {agent} failed: {message}")

class ExchangePipeline:
    """Runs exchange cycles against the live agents of ``roster``; the driver rule keeps the joint model.

    ``algorithm`` says how it exchanges (``exchange``) and how often (``cycle_interval_s``); ``observe`` gathers
    the parameter service's reports (and its replacements' joins) for agent-initiated algorithms, ``silent`` the
    agents that have not called it for a given time;
    ``split_tasks``: executors have two free task slots per agent; a cycle that broadcasts then runs a reduce
    job and a deliver job (:meth:`~mpca.runtime.jobs.ExchangeJobs.run_parts`) and the reduce tasks never wait
    for the broadcast's download.  With one free slot per agent either one task per agent does both, after the
    download, or the two jobs share the slot, reduce first (``exchange_jobs``: ``one``, ``two`` or ``auto``,
    :class:`~mpca.runtime.layout.ExchangeLayout`); where the rule's agents need the delivery before they can
    yield (``deliver_before_yield``: rounds) one task does both.  ``reduce``: the contributions tree-reduced into
    the driver (``tree``) or reduce-scattered over the executors first (``scatter``, :mod:`mpca.runtime.scatter`)."""

    def __init__(self, jobs: ExchangeJobs, broadcasts: Broadcasts, rule: DriverRule, algorithm: Algorithm,
                 timeline: Optional[Timeline] = None, *,
                 observe: Optional[Callable[[float], Tuple[Dict[int, AgentReport], List[int]]]] = None,
                 silent: Optional[Callable[[float], List[int]]] = None,
                 split_tasks: bool = False, exchange_jobs: str = "auto",
                 cycle_deadline_s: Optional[float] = None):
        """``jobs`` submits the exchange jobs (Spark's, or a Connect coordinator's relay,
        :class:`mpca.runtime.relay.RelayJobs`) against its roster; ``broadcasts`` publishes the staged shards;
        ``cycle_deadline_s``: ``cluster.cycle_deadline_s`` (:meth:`_within_deadline`)."""
        self.rule = rule
        self.exchange = algorithm.exchange
        self.cycle_interval_s = algorithm.cycle_interval_s
        self.jobs = jobs
        self.roster: AgentRoster = jobs.roster
        self.observe = observe
        self.split_tasks = split_tasks
        self.layout = ExchangeLayout(exchange_jobs)
        self.cycle_deadline_s = cycle_deadline_s
        self.codec = jobs.codec
        self.broadcasts = broadcasts
        self.timeline = timeline or Timeline()
        self.S = rule.num_shards
        self.schedule: PhaseSchedule = PhaseSchedule(rule, lambda shard, vec: self.broadcasts.create(vec, shard),
                                                     self.broadcasts.destroy)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpca-exchange")
        self.last_agent_reports: Dict[int, AgentReport] = {}
        self.silent = silent

    def job_with_corrections(self, reduce: ExchangePlan, deliver: Optional[ExchangePlan], bc, description: str,
                             rec: CycleRecord) -> ExchangeRecord:
        """Run the cycle's job (reduce and deliver tasks; deliver first where the rule needs it); if tasks
        landed where no unclaimed agent was, run corrective jobs for the agents still missing either — within
        the bounded wait, and never for agents already counted absent (hung or lost)."""
        roster = self.roster
        K = len(roster.agents)
        # extra tasks find absent agents that came back elsewhere; with fewer agents than executors some
        # executor has none, and K tasks would often land there: reach every executor at once
        first = self.jobs.spread(K) if K < self.jobs.executors else K + len(roster.absent) * self.jobs.executors
        parts = [(deliver, first, bc), (reduce, first, None)] if deliver else [(reduce, first, bc)]
        if deliver and not self.rule.deliver_before_yield:
            parts.reverse()  # reduce tasks first: they need no download and yield at once
        t0 = time.time()
        rec.scatter = self.jobs.scatters(reduce, first)
        result = self.jobs.run_parts(parts, description, "cycle")
        rec.misplaced += len(result.misplaced)
        for attempt in range(MAX_CORRECTIONS):
            to_reduce = roster.missing_from(result.agents)
            to_deliver = roster.missing_from(result.delivered) if deliver else []
            if not to_reduce and not to_deliver or time.time() - t0 > roster.wait_s():
                break
            rec.corrections += 1
            log.info("cycle %s: %d task(s) misplaced, correcting for agents %s (reduce) %s (deliver)", reduce.token,
                     len(result.misplaced), to_reduce, to_deliver)
            only = tuple(sorted(set(to_reduce) | set(to_deliver)))
            spread = self.jobs.spread
            parts = ([(replace(deliver, only_agents=only), spread(len(to_deliver)), bc)] if to_deliver else []) + \
                    ([(replace(reduce, only_agents=only), spread(len(to_reduce)), None if deliver else bc)]
                     if to_reduce else [])
            more = self.jobs.run_parts(parts, f"{description} (correction {attempt + 1})", "correction")
            rec.misplaced += len(more.misplaced)
            result = replace(result, misplaced=[]).merge(more)
        if result.duplicates:
            raise RunFailedError(f"agents {sorted(set(result.duplicates))} answered twice in cycle {reduce.token}: "
                                 "two processes run as one agent (Spark resubmitted the agents' stage after "
                                 "losing shuffle data it depends on; give the training data at least as many "
                                 "partitions as agents, from files or a table, so none is needed)")
        errors = result.errors()
        if errors:
            a, msg = sorted(errors.items())[0]
            raise agent_failure(a, msg, {**result.delivered, **result.agents}[a].user_error)
        roster.track(rec, result)
        return result

    def join(self, rec: CycleRecord) -> None:
        """Hand every replacement agent the joint model (the driver rule's join payload: its join vectors, all
        shards, and its join state) in a control job; it starts training from there and contributes from its next
        yield on.  A join that failed is said and tried again after the next cycle."""
        if not self.roster.joining:
            return
        bc = self.broadcasts.create(self.rule.join_payload(), exact=True)
        try:
            only = tuple(sorted(self.roster.joining))
            plan = self.jobs.plan(f"join{rec.cycle}", "join", cycle=rec.cycle, only_agents=only,
                                  params=self.rule.cycle_params(rec.cycle))
            res = self.jobs.run(plan, self.jobs.spread(len(only)), bc,
                                f"mpca: agents {list(only)} join the joint model")
        finally:
            self.broadcasts.destroy(bc)
        for a, error in sorted(res.errors().items()):
            log.warning("agent %s could not join (tried again after the next cycle): %s", a, error)
        rec.joined = sorted(a for a in res.delivered if a in self.roster.joining and not res.delivered[a].error)
        self.roster.joined(rec.joined, {a: res.delivered[a].pid for a in rec.joined})
        if rec.joined:
            log.info("agents %s started from the joint model of cycle %d", rec.joined, rec.cycle)

    def hand_in(self, agent: int, shard: int, contribution: WeightedSum, extra: dict) -> None:
        """A leaving agent's last contribution of ``shard`` (over the driver's service: no task reaches a
        decommissioning executor): added to the next reduction of that shard the driver rule takes it in."""
        self.schedule.hand_in(agent, shard, contribution, extra)

    # ------------------------------------------------------------------ phases
    @staticmethod
    def _staged(rec: CycleRecord, staging: Callable[[], Optional[StageOutcome]]) -> None:
        """Stage phase (:class:`~mpca.exchange.schedule.PhaseSchedule`), timed into the cycle's record."""
        t0 = time.time()
        outcome = staging()
        if outcome is None:
            return
        rec.stage_shard, rec.stage_start, rec.stage_end = outcome.shard, t0, time.time()
        rec.rejected = outcome.rejected
        rec.handed_in.extend(outcome.handed_in)

    def _observe(self, c: int) -> CycleRecord:
        """A cycle of an agent-initiated algorithm: no Spark job, the parameter service's latest reports."""
        rec = CycleRecord(c, None, None, t_submit=time.time())
        rec.agents, rec.joined = self.observe(max(0.2, self.cycle_interval_s))
        if rec.joined:
            log.info("agents %s (replacements) started from the parameter service's current model", rec.joined)
        rec.t_end = time.time()
        # membership: an agent that has not called the service for the roster's bounded wait is missing, and so is
        # an elastic run's agent that has not come up yet
        self.roster.came_up(set(rec.agents))
        silent = self.silent(self.roster.wait_s()) if self.silent else []
        rec.missing = sorted(set(silent) | self.roster.not_started)
        self.last_agent_reports.update(rec.agents)
        errors = {a: e.error for a, e in rec.agents.items() if e.error}
        if errors:
            a, msg = sorted(errors.items())[0]
            raise agent_failure(a, msg, rec.agents[a].user_error)
        self.timeline.add(rec)
        return rec

    def cycle(self, c: int) -> CycleRecord:
        if self.exchange == "service":
            return self._observe(c)
        opened = self.schedule.open(c)
        r, staged, params = opened.shard, opened.staged, opened.params
        counted, pids, plan = self.roster.counted(), dict(self.roster.pids), self.jobs.plan
        numel = self.rule.shard_numel
        two_jobs = bool(staged) and (self.split_tasks or (not self.rule.deliver_before_yield
                                                          and self.layout.two_jobs()))
        if two_jobs or not staged:
            reduce = plan(f"c{c}/r", "reduce", cycle=c, reduce_shard=r, reduce_numel=numel(r), params=params,
                          counted=counted, pids=pids, broadcasts=staged is not None)
            deliver = plan(f"c{c}/b", "deliver", cycle=c, bcast_shard=staged.shard, params=params) if staged else None
        else:
            reduce = plan(f"c{c}", "cycle", cycle=c, reduce_shard=r, bcast_shard=staged.shard if staged else None,
                          reduce_numel=numel(r), params=params, counted=counted, pids=pids)
            deliver = None
        desc = f"mpca cycle {c}: reduce shard {r}" + (f", broadcast shard {staged.shard}" if staged else "")
        rec = CycleRecord(c, r, staged.shard if staged else None, t_submit=time.time(), jobs=2 if two_jobs else 1)
        bc = staged.payload if staged else None
        fut = self._pool.submit(self.job_with_corrections, reduce, deliver, bc, desc, rec)
        self._staged(rec, self.schedule.overlap)  # concurrent with job c
        result = self._within_deadline(fut, rec)
        rec.t_end = time.time()
        if rec.abandoned:
            self.roster.cycle_abandoned()
        else:  # an abandoned cycle's time says nothing of the exchange's
            self.roster.cycle_took(rec.t_end - rec.t_submit)
            if not self.split_tasks and not self.rule.deliver_before_yield:  # corrections included: a layout's cost
                self.layout.observe(two_jobs if staged is not None else None, rec.t_end - rec.t_submit)
        if staged is not None:
            self.broadcasts.destroy(staged.payload)
        rec.agents = dict(result.agents)
        rec.delivered = dict(result.delivered)
        self.last_agent_reports.update(rec.agents)
        rec.bytes_up = sum(e.bytes_up or 0 for e in rec.agents.values() if e.t_yield)  # as sent, wire format
        rec.bytes_down = sum(e.bytes_down or 0 for e in rec.delivered.values() if e.t_bc) if staged else 0
        yields = [e.t_yield for e in rec.agents.values() if e.t_yield]
        bcs = [e.t_bc for e in rec.delivered.values() if e.t_bc]
        rec.reduce_start = min(yields) if yields else None
        rec.bcast_end = max(bcs) if bcs else None
        self._staged(rec, lambda: self.schedule.close(opened, None if rec.abandoned else result.reduced()))
        self.join(rec)
        self.timeline.add(rec)
        return rec

    def _within_deadline(self, fut: Future, rec: CycleRecord) -> ExchangeRecord:
        """The cycle's exchange, or — once it has run past the cycle deadline
        (:meth:`~mpca.exchange.presence.PresenceBook.cycle_deadline_s`) — none: its jobs are cancelled and the
        cycle counts nobody (``rec.abandoned``).  Each agent learns with its next yield that the contribution it
        gave was not counted, and its weight carries over (the agents' ``counted`` rule), as after any lost
        contribution; the cycle's broadcast shard reaches the agents with that shard's next one.  The task that
        held the cycle keeps its cut-off executor's slot, so the next cycles' tasks run on the other executors,
        and the agent there is counted absent after the bounded wait."""
        deadline = self.roster.cycle_deadline_s(self.cycle_deadline_s) if self.jobs.abandons else None
        if deadline is None:
            return fut.result()
        try:
            return fut.result(timeout=max(0.0, rec.t_submit + deadline - time.time()))
        except FutureTimeout:
            pass
        log.warning("cycle %d: its exchange ran past the cycle deadline (%.1fs, cluster.cycle_deadline_s): a task "
                    "Spark cannot start or hear from, on an executor cut off from the driver (a link down, a host "
                    "stopped); abandoned, and its contributions carry over to the next cycle", rec.cycle, deadline)
        self.jobs.cancel()
        try:
            return fut.result(timeout=CANCELLED_WAIT_S)  # it may have ended meanwhile: then it counts
        except FutureTimeout:  # still not ended: the next cycles must not queue behind its thread
            self._pool.shutdown(wait=False)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpca-exchange")
        except Exception as e:  # noqa: BLE001 - the cancelled job's error
            log.info("cycle %d: its cancelled job ended: %s", rec.cycle, str(e).splitlines()[0] if str(e) else e)
        rec.abandoned = True
        return ExchangeRecord()

    def pending_state(self) -> Optional[Dict[str, object]]:
        """The reduction received but not staged yet, for checkpoints (:meth:`PhaseSchedule.pending_state`)."""
        return self.schedule.pending_state()

    def restore_pending(self, state: Optional[Dict[str, object]]) -> None:
        """Take back a checkpoint's pending reduction (:meth:`PhaseSchedule.restore_pending`)."""
        self.schedule.restore_pending(state)

    def flush(self) -> None:
        """Stage whatever was reduced but not staged yet, so the joint model holds every reduction."""
        self.schedule.flush()

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.jobs.close()
