"""The driver's 3-phase pipeline (§4.2, Fig. 8): stage → broadcast → reduce, one Spark job per cycle.

Cycle ``c`` reduces the shard the algorithm's driver rule names (``c mod S``).
With S ≥ 3 the shard reduced in cycle ``c - 1`` is *staged* (the driver rule's
:meth:`~mpca.algorithm.DriverRule.on_reduced` — for MPCA Eqs. 9 → 8 → 4 → 5 —
and a new broadcast variable) on the driver while job ``c`` runs, and
broadcast by job ``c + 1``: after warm-up one shard is being reduced, one
broadcast and one staged at every moment.  With S = 2 (Fig. 7) and S = 1
(Fig. 6) staging happens between jobs and the shard reduced in ``c - 1`` is
broadcast by job ``c``.

Agent-initiated algorithms (``exchange = "service"``) exchange through the
parameter service instead; their cycles run no Spark job and only observe.

The pipeline is only this schedule.  Who is present, absent or joining is the
:class:`~mpca.runtime.roster.AgentRoster`'s; the broadcasts' lifetimes are
:class:`~mpca.runtime.broadcasts.Broadcasts`'; what a job returns is an
:class:`~mpca.runtime.record.ExchangeRecord`; what each task does is
:mod:`mpca.runtime.exchange`'s.
"""
from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from mpca.algorithm import Algorithm, DriverRule, WeightedSum
from mpca.errors import RunFailedError
from mpca.runtime.broadcasts import Broadcasts
from mpca.runtime.exchange import ExchangePlan, exchange_partition
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.reports import AgentReport
from mpca.runtime.roster import AgentRoster
from mpca.runtime.timeline import CycleRecord, Timeline

log = logging.getLogger("mpca.pipeline")

MAX_CORRECTIONS = 5


def _finite(cycle: int, shard: int, partial: WeightedSum) -> Optional[WeightedSum]:
    """The treeReduce result (numpy) as torch for the driver rule, or None when it holds NaN/Inf (agents
    reject their own non-finite shards; this keeps the joint model finite whatever reaches the driver)."""
    total = None if partial.total is None else torch.from_numpy(np.asarray(partial.total))
    if total is not None and not bool(torch.isfinite(total).all()):
        log.warning("cycle %d: the reduction of shard %d holds NaN/Inf; not applied to the joint model", cycle, shard)
        return None
    return WeightedSum(total, partial.weight)


class ExchangePipeline:
    """Runs exchange cycles against the live agents of ``roster``; the driver rule keeps the joint model.

    ``algorithm`` says how it exchanges (``exchange``) and how often (``cycle_interval_s``); ``observe`` gathers
    the parameter service's reports for agent-initiated algorithms; ``split_tasks``: separate deliver and reduce
    tasks (reduce never waits for the broadcast's download) where executors have two free task slots per agent,
    else one task per agent does both."""

    def __init__(self, sc, run_id: str, secret: bytes, rule: DriverRule, algorithm: Algorithm, roster: AgentRoster,
                 wire_dtype: torch.dtype, timeline: Optional[Timeline] = None, *, executors: int = 1,
                 observe: Optional[Callable[[float], Dict[int, AgentReport]]] = None, split_tasks: bool = False,
                 task_timeout_s: float = 120.0):
        self.sc = sc
        self.run_id = run_id
        self.secret = secret
        self.rule = rule
        self.exchange = algorithm.exchange
        self.cycle_interval_s = algorithm.cycle_interval_s
        self.roster = roster
        self.observe = observe
        self.split_tasks = split_tasks
        self.wire = np.dtype(str(wire_dtype).replace("torch.", ""))
        self.broadcasts = Broadcasts(sc, self.wire)
        self.timeline = timeline or Timeline()
        self.task_timeout_s = task_timeout_s
        self.executors = max(1, executors)  # for over-provisioned corrective jobs, see spread()
        self.S = rule.num_shards
        self.lag = 2 if self.S >= 3 else 1
        self._pending = None  # (cycle, shard, record) reduced but not yet staged
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpca-exchange")
        self.last_agent_reports: Dict[int, AgentReport] = {}
        self.jobs = {"cycle": 0, "correction": 0, "control": 0}  # Spark jobs submitted, by purpose
        self.job_group = f"mpca-{run_id}-exchange"

    # ------------------------------------------------------------------ jobs
    def spread(self, agents: int, attempt: int = 1) -> int:
        """Tasks for a job that must reach ``agents`` agents: exactly ``agents`` on a first attempt, otherwise
        over-provisioned (2 per executor and agent) so that some task lands on every executor."""
        return agents if attempt == 0 else 2 * agents * self.executors

    def plan(self, token: str, op: str, **kw) -> ExchangePlan:
        """What every task of one job does (``op``), with the run's identity and the roster's wait."""
        kw.setdefault("agent_wait_s", self.roster.wait_s())
        return ExchangePlan(self.run_id, self.secret, token, op, wire_dtype=self.wire.name,
                            timeout_s=self.task_timeout_s, absent=tuple(sorted(self.roster.absent)), **kw)

    def run_job(self, plan: ExchangePlan, tasks: int, bc, description: str,
                purpose: str = "control") -> ExchangeRecord:
        return self.run_parts([(plan, tasks, bc)], description, purpose)

    def run_parts(self, parts: Sequence[tuple], description: str, purpose: str) -> ExchangeRecord:
        """One Spark job made of the union of ``(plan, tasks, broadcast or None)`` parts, tree-reduced.

        Each part is its own Python function, so only the tasks of a part that references a broadcast wait
        for its download; parts come in the order given (Spark offers lower task indices first)."""
        self.jobs[purpose] += 1
        self.sc.setJobGroup(self.job_group, description, interruptOnCancel=True)
        rdds = [self.sc.parallelize(range(n), n).mapPartitions(functools.partial(exchange_partition, plan, bc))
                for plan, n, bc in parts]
        rdd = rdds[0] if len(rdds) == 1 else self.sc.union(rdds)
        return rdd.treeReduce(merge_records, depth=2)

    def job_with_corrections(self, reduce: ExchangePlan, deliver: Optional[ExchangePlan], bc, description: str,
                             rec: CycleRecord) -> ExchangeRecord:
        """Run the cycle's job (reduce and deliver tasks; deliver first where the rule needs it); if tasks
        landed where no unclaimed agent was, run corrective jobs for the agents still missing either — within
        the bounded wait, and never for agents already counted absent (hung or lost)."""
        roster = self.roster
        K = len(roster.agents)
        # extra tasks find absent agents that came back elsewhere; with fewer agents than executors some
        # executor has none, and K tasks would often land there: reach every executor at once
        first = self.spread(K) if K < self.executors else K + len(roster.absent) * self.executors
        parts = [(deliver, first, bc), (reduce, first, None)] if deliver else [(reduce, first, bc)]
        if deliver and not self.rule.deliver_before_yield:
            parts.reverse()  # reduce tasks first: they need no download and yield at once
        t0 = time.time()
        result = self.run_parts(parts, description, "cycle")
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
            parts = ([(replace(deliver, only_agents=only), self.spread(len(to_deliver)), bc)] if to_deliver else []) + \
                    ([(replace(reduce, only_agents=only), self.spread(len(to_reduce)), None if deliver else bc)]
                     if to_reduce else [])
            more = self.run_parts(parts, f"{description} (correction {attempt + 1})", "correction")
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
            raise RunFailedError(f"agent {a} failed: {msg}")
        roster.track(rec, result)
        return result

    def join(self, rec: CycleRecord) -> None:
        """Hand every replacement agent the joint model (the driver rule's join vectors, all shards) in a
        control job; it starts training from there and contributes from its next yield on."""
        if not self.roster.joining:
            return
        bc = self.broadcasts.create(torch.cat([v.reshape(-1) for v in self.rule.join_vectors()]))
        try:
            only = tuple(sorted(self.roster.joining))
            plan = self.plan(f"join{rec.cycle}", "join", cycle=rec.cycle, only_agents=only,
                             params=self.rule.cycle_params(rec.cycle))
            res = self.run_job(plan, self.spread(len(only)), bc, f"mpca: agents {list(only)} join the joint model")
        finally:
            self.broadcasts.destroy(bc)
        rec.joined = sorted(a for a in res.delivered if a in self.roster.joining)
        self.roster.joined(rec.joined, {a: res.delivered[a].pid for a in rec.joined})
        if rec.joined:
            log.info("agents %s started from the joint model of cycle %d", rec.joined, rec.cycle)

    # ------------------------------------------------------------------ phases
    def _stage(self, cycle: int, shard: int, result: ExchangeRecord, rec: CycleRecord) -> None:
        """Stage phase: the driver rule's update of the reduced shard, then a new broadcast variable."""
        rec.stage_shard, rec.stage_start = shard, time.time()
        partial = _finite(cycle, shard, result.partial)
        if partial is None:
            rec.rejected = True
            rec.stage_end = time.time()
            return
        out = self.rule.on_reduced(cycle, shard, partial)
        if out is not None:
            self.broadcasts.stage(cycle + self.lag, shard, out)
        rec.stage_end = time.time()

    def _observe(self, c: int) -> CycleRecord:
        """A cycle of an agent-initiated algorithm: no Spark job, the parameter service's latest reports."""
        rec = CycleRecord(c, None, None, t_submit=time.time())
        rec.agents = self.observe(max(0.2, self.cycle_interval_s))
        rec.t_end = time.time()
        self.last_agent_reports.update(rec.agents)
        errors = {a: e.error for a, e in rec.agents.items() if e.error}
        if errors:
            a, msg = sorted(errors.items())[0]
            raise RunFailedError(f"agent {a} failed: {msg}")
        self.timeline.add(rec)
        return rec

    def cycle(self, c: int) -> CycleRecord:
        if self.exchange == "service":
            return self._observe(c)
        r = self.rule.reduce_shard(c)
        staged = self.broadcasts.take(c)
        params = self.rule.cycle_params(c)
        counted, pids = self.roster.counted(), dict(self.roster.pids)
        if self.split_tasks:
            reduce = self.plan(f"c{c}/r", "reduce", cycle=c, reduce_shard=r, params=params, counted=counted, pids=pids)
            deliver = self.plan(f"c{c}/b", "deliver", cycle=c, bcast_shard=staged.shard,
                                params=params) if staged else None
        else:
            reduce = self.plan(f"c{c}", "cycle", cycle=c, reduce_shard=r, bcast_shard=staged.shard if staged else None,
                               params=params, counted=counted, pids=pids)
            deliver = None
        desc = f"mpca cycle {c}: reduce shard {r}" + (f", broadcast shard {staged.shard}" if staged else "")
        rec = CycleRecord(c, r, staged.shard if staged else None, t_submit=time.time())
        fut = self._pool.submit(self.job_with_corrections, reduce, deliver, staged.bc if staged else None, desc, rec)
        if self.lag == 2 and self._pending is not None:
            self._stage(*self._pending, rec)  # concurrent with job c
            self._pending = None
        result = fut.result()
        rec.t_end = time.time()
        self.roster.cycle_took(rec.t_end - rec.t_submit)
        if staged is not None:
            self.broadcasts.destroy(staged.bc)
        rec.agents = dict(result.agents)
        rec.delivered = dict(result.delivered)
        self.last_agent_reports.update(rec.agents)
        nbytes = self.rule.shard_nbytes
        rec.bytes_up = sum(nbytes(r) for e in rec.agents.values() if e.t_yield)
        rec.bytes_down = sum(nbytes(staged.shard) for e in rec.delivered.values() if e.t_bc) if staged else 0
        yields = [e.t_yield for e in rec.agents.values() if e.t_yield]
        bcs = [e.t_bc for e in rec.delivered.values() if e.t_bc]
        rec.reduce_start = min(yields) if yields else None
        rec.bcast_end = max(bcs) if bcs else None
        if self.lag == 1:
            self._stage(c, r, result, rec)
        else:
            self._pending = (c, r, result)
        self.join(rec)
        self.timeline.add(rec)
        return rec

    def pending_state(self) -> Optional[Dict[str, object]]:
        """The reduction received but not staged yet (3-phase pipeline), for checkpoints: without it a resume
        would drop one shard's reduction."""
        if self._pending is None:
            return None
        c, r, result = self._pending
        p = result.partial
        total = None if p.total is None else torch.from_numpy(np.array(p.total))
        return {"cycle": c, "shard": r, "total": total, "weight": float(p.weight)}

    def restore_pending(self, state: Optional[Dict[str, object]]) -> None:
        """Take back a checkpoint's pending reduction: staged with the first cycle, as if never interrupted."""
        if state is not None:
            total = state["total"]
            partial = WeightedSum(None if total is None else total.numpy(), float(state["weight"]))
            self._pending = (int(state["cycle"]), int(state["shard"]), ExchangeRecord(partial=partial))

    def flush(self) -> None:
        """Stage whatever was reduced but not staged yet, so the joint model holds every reduction."""
        if self._pending is not None:
            c, r, result = self._pending
            self._pending = None
            partial = _finite(c, r, result.partial)
            if partial is not None:
                self.rule.on_reduced(c, r, partial)
        self.broadcasts.drop_staged()

    # ------------------------------------------------------------------ control
    def hello(self, expected: int, timeout_s: float, agent_job_alive: Callable[[], bool],
              why_ended: Callable[[], str] = lambda: "see the executors' logs") -> Dict[int, dict]:
        """Wait until ``expected`` distinct agents answer (they may still be loading their data)."""
        seen: Dict[int, dict] = {}
        deadline = time.time() + timeout_s
        attempt = 0
        while len(seen) < expected:
            if time.time() > deadline:
                raise RunFailedError(f"only {len(seen)} of {expected} agents came up within {timeout_s:.0f}s "
                                     f"(agents seen: {sorted(seen)}); check executor logs")
            if not agent_job_alive():
                raise RunFailedError(f"the agents' Spark job ended before all agents came up: {why_ended()}")
            # fewer agents than executors: some executor has none, so reach every executor at once and let the
            # tasks that find no agent give up soon, rather than waiting 10 s on an agent-less executor
            sparse = expected < self.executors
            plan = self.plan(f"hello{attempt}", "hello", wait_for_agent_s=2.0 if sparse else 10.0)
            res = self.run_job(plan, self.spread(expected, 1 if sparse else attempt), None,
                               f"mpca: waiting for agents (attempt {attempt})")
            for a, e in res.agents.items():
                if e.error:
                    raise RunFailedError(f"agent {a} failed: {e.error}")
                seen[a] = e
                self.roster.pids[a] = e.pid
            attempt += 1
        self.roster.reset(seen)
        return seen

    def status(self) -> Dict[int, AgentReport]:
        """Steps and samples of every agent right now (a light control job, no shard moves)."""
        plan = self.plan(f"status{time.time()}", "hello")
        K = len(self.roster.agents)
        attempt = 0 if self.executors == K else 1  # extra executors: over-provision at once
        return self.run_job(plan, self.spread(K, attempt), None, "mpca: agent status").agents

    def stop_agents(self) -> Dict[int, dict]:
        stopped: Dict[int, dict] = {}
        for attempt in range(MAX_CORRECTIONS + 1):
            left = [a for a in self.roster.agents if a not in stopped]
            if not left:
                break
            try:
                res = self.run_job(self.plan(f"stop{attempt}", "stop"), self.spread(len(left), attempt), None,
                                   "mpca: stopping agents")
            except Exception as e:  # noqa: BLE001 - best effort; the agent job is cancelled afterwards
                log.warning("stopping agents failed: %s", e)
                break
            stopped.update(res.agents)
        self._pool.shutdown(wait=False)
        return stopped
