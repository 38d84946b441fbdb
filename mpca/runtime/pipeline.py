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
"""
from __future__ import annotations

import collections
import functools
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from mpca.algorithm import DriverRule, WeightedSum
from mpca.errors import RunFailedError
from mpca.runtime.exchange import ExchangePlan, exchange_partition, merge_records
from mpca.runtime.reports import AgentReport
from mpca.runtime.timeline import CycleRecord, Timeline

log = logging.getLogger("mpca.pipeline")

MAX_CORRECTIONS = 5


@dataclass
class _Staged:
    shard: int
    bc: object  # pyspark Broadcast of the projected shard x*


def _finite(cycle: int, shard: int, partial: WeightedSum) -> Optional[WeightedSum]:
    """The treeReduce result (numpy) as torch for the driver rule, or None when it holds NaN/Inf (agents
    reject their own non-finite shards; this keeps the joint model finite whatever reaches the driver)."""
    total = None if partial.total is None else torch.from_numpy(np.asarray(partial.total))
    if total is not None and not bool(torch.isfinite(total).all()):
        log.warning("cycle %d: the reduction of shard %d holds NaN/Inf; not applied to the joint model", cycle, shard)
        return None
    return WeightedSum(total, partial.weight)


class ExchangePipeline:
    """Runs exchange cycles against K live agents; the driver rule keeps the joint model."""

    def __init__(self, sc, run_id: str, secret: bytes, rule: DriverRule, agents: Sequence[int],
                 wire_dtype: torch.dtype, timeline: Optional[Timeline] = None, task_timeout_s: float = 120.0,
                 executors: int = 1, observe: Optional[Callable[[float], Dict[int, AgentReport]]] = None,
                 split_tasks: bool = False, agent_wait_s: Optional[float] = None, min_agents: int = 1,
                 agent_lost_timeout_s: float = 120.0):
        self.sc = sc
        self.run_id = run_id
        self.secret = secret
        self.rule = rule
        self.observe = observe  # agent-initiated algorithms: reports gathered by the parameter service
        # separate deliver and reduce tasks (reduce never waits for the broadcast's download) where executors
        # have two free task slots per agent; else one task per agent does both
        self.split_tasks = split_tasks
        self.agents = sorted(agents)
        self.wire = np.dtype(str(wire_dtype).replace("torch.", ""))
        self.timeline = timeline or Timeline()
        self.task_timeout_s = task_timeout_s
        self.executors = max(1, executors)  # for over-provisioned corrective jobs, see spread()
        self.S = rule.num_shards
        self.lag = 2 if self.S >= 3 else 1
        self._staged: Dict[int, _Staged] = {}
        self._pending = None  # (cycle, shard, record) reduced but not yet staged
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpca-exchange")
        self.last_agent_reports: Dict[int, AgentReport] = {}
        self.jobs = {"cycle": 0, "correction": 0, "control": 0}  # Spark jobs submitted, by purpose
        self.broadcasts = {"created": 0, "destroyed": 0}
        self.job_group = f"mpca-{run_id}-exchange"
        # agents that stopped answering (hung, or their executor lost): since when; left out of corrections
        self.absent: Dict[int, float] = {}
        self.joining: set = set()  # replacements (Spark retried their task) waiting for the joint model
        self.agent_wait_s = agent_wait_s
        self.min_agents = min_agents
        self.agent_lost_timeout_s = agent_lost_timeout_s
        self._short_since: Optional[float] = None  # since when fewer than min_agents answer
        self._durations = collections.deque(maxlen=20)
        self._counted: Dict[int, collections.deque] = {a: collections.deque(maxlen=64) for a in self.agents}
        self.pids: Dict[int, int] = {}  # the process of each agent; another process answering is a replacement

    # ------------------------------------------------------------------ jobs
    def spread(self, agents: int, attempt: int = 1) -> int:
        """Tasks for a job that must reach ``agents`` agents: exactly ``agents`` on a first attempt, otherwise
        over-provisioned (2 per executor and agent) so that some task lands on every executor."""
        return agents if attempt == 0 else 2 * agents * self.executors

    def wait_s(self) -> float:
        """The bounded wait for a silent agent: configured, or 5 x the median recent cycle within 2-10 s."""
        if self.agent_wait_s is not None:
            return self.agent_wait_s
        if not self._durations:
            return 10.0
        return min(10.0, max(2.0, 5 * statistics.median(self._durations)))

    def _plan(self, token: str, op: str, **kw) -> ExchangePlan:
        kw.setdefault("claim_timeout_s", self.wait_s())
        return ExchangePlan(self.run_id, self.secret, token, op, wire_dtype=self.wire.name,
                            timeout_s=self.task_timeout_s, absent=tuple(sorted(self.absent)), **kw)

    def run_job(self, plan: ExchangePlan, tasks: int, bc, description: str, purpose: str = "control") -> dict:
        return self.run_parts([(plan, tasks, bc)], description, purpose)

    def run_parts(self, parts: Sequence[tuple], description: str, purpose: str) -> dict:
        """One Spark job made of the union of ``(plan, tasks, broadcast or None)`` parts, tree-reduced.

        Each part is its own Python function, so only the tasks of a part that references a broadcast wait
        for its download; parts come in the order given (Spark offers lower task indices first)."""
        self.jobs[purpose] += 1
        self.sc.setJobGroup(self.job_group, description, interruptOnCancel=True)
        rdds = [self.sc.parallelize(range(n), n).mapPartitions(functools.partial(exchange_partition, plan, bc))
                for plan, n, bc in parts]
        rdd = rdds[0] if len(rdds) == 1 else self.sc.union(rdds)
        return rdd.treeReduce(merge_records, depth=2)

    def _job_with_corrections(self, reduce: ExchangePlan, deliver: Optional[ExchangePlan], bc, description: str,
                              rec: CycleRecord) -> dict:
        """Run the cycle's job (reduce and deliver tasks; deliver first where the rule needs it); if tasks
        landed where no unclaimed agent was, run corrective jobs for the agents still missing either — within
        the bounded wait, and never for agents already counted absent (hung or lost)."""
        K = len(self.agents)
        # extra tasks find absent agents that came back elsewhere; with fewer agents than executors some
        # executor has none, and K tasks would often land there: reach every executor at once
        first = self.spread(K) if K < self.executors else K + len(self.absent) * self.executors
        parts = [(deliver, first, bc), (reduce, first, None)] if deliver else [(reduce, first, bc)]
        if deliver and not self.rule.deliver_before_yield:
            parts.reverse()  # reduce tasks first: they need no download and yield at once
        t0 = time.time()
        result = self.run_parts(parts, description, "cycle")
        rec.misplaced += len(result["misplaced"])
        for attempt in range(MAX_CORRECTIONS):
            to_reduce = [a for a in self.agents if a not in result["agents"] and a not in self.absent]
            to_deliver = [a for a in self.agents if deliver and a not in result["delivered"] and a not in self.absent]
            if not to_reduce and not to_deliver or time.time() - t0 > self.wait_s():
                break
            rec.corrections += 1
            log.info("cycle %s: %d task(s) misplaced, correcting for agents %s (reduce) %s (deliver)", reduce.token,
                     len(result["misplaced"]), to_reduce, to_deliver)
            only = tuple(sorted(set(to_reduce) | set(to_deliver)))
            parts = ([(replace(deliver, only_agents=only), self.spread(len(to_deliver)), bc)] if to_deliver else []) + \
                    ([(replace(reduce, only_agents=only), self.spread(len(to_reduce)), None if deliver else bc)]
                     if to_reduce else [])
            more = self.run_parts(parts, f"{description} (correction {attempt + 1})", "correction")
            rec.misplaced += len(more["misplaced"])
            result = merge_records({**result, "misplaced": []}, more)
        if result["duplicates"]:
            raise RunFailedError(f"agents {sorted(set(result['duplicates']))} answered twice in cycle {reduce.token}: "
                                 "two processes run as one agent (Spark resubmitted the agents' stage after "
                                 "losing shuffle data it depends on; give the training data at least as many "
                                 "partitions as agents, from files or a table, so none is needed)")
        errors = {a: e.error for part in ("agents", "delivered") for a, e in result[part].items() if e.error}
        if errors:
            a, msg = sorted(errors.items())[0]
            raise RunFailedError(f"agent {a} failed: {msg}")
        self._track_agents(rec, result)
        return result

    def _track_agents(self, rec: CycleRecord, result: dict) -> None:
        """Who answered: absent agents and replacements, counted contributions, and the min_agents rule."""
        now = time.time()
        answered = result["agents"]
        rec.missing = [a for a in self.agents if a not in answered or answered[a].joining]
        for a in self.agents:
            if a in answered:
                if a in self.absent:
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

    def join(self, rec: CycleRecord) -> None:
        """Hand every replacement agent the joint model (the driver rule's join vectors, all shards) in a
        control job; it starts training from there and contributes from its next yield on."""
        if not self.joining:
            return
        vec = torch.cat([v.reshape(-1) for v in self.rule.join_vectors()])
        bc = self.sc.broadcast(np.ascontiguousarray(vec.numpy(), dtype=self.wire).tobytes())
        self.broadcasts["created"] += 1
        try:
            only = tuple(sorted(self.joining))
            plan = self._plan(f"join{rec.cycle}", "join", cycle=rec.cycle, only_agents=only,
                              params=self.rule.cycle_params(rec.cycle))
            res = self.run_job(plan, self.spread(len(only)), bc, f"mpca: agents {list(only)} join the joint model")
        finally:
            self._destroy(bc)
        rec.joined = sorted(a for a in res["delivered"] if a in self.joining)
        self.joining -= set(rec.joined)
        self.pids.update({a: res["delivered"][a].pid for a in rec.joined})
        if rec.joined:
            log.info("agents %s started from the joint model of cycle %d", rec.joined, rec.cycle)

    # ------------------------------------------------------------------ phases
    def _stage(self, cycle: int, shard: int, result: dict, rec: CycleRecord) -> None:
        """Stage phase: the driver rule's update of the reduced shard, then a new broadcast variable."""
        rec.stage_shard, rec.stage_start = shard, time.time()
        partial = _finite(cycle, shard, result["partial"])
        if partial is None:
            rec.rejected = True
            rec.stage_end = time.time()
            return
        out = self.rule.on_reduced(cycle, shard, partial)
        if out is not None:
            # raw bytes, not an ndarray: PySpark's encrypted broadcast path (spark.io.encryption.enabled) cannot
            # write the PickleBuffer that protocol 5 produces for arrays
            bc = self.sc.broadcast(np.ascontiguousarray(out.numpy(), dtype=self.wire).tobytes())
            self.broadcasts["created"] += 1
            self._staged[cycle + self.lag] = _Staged(shard, bc)
        rec.stage_end = time.time()

    def _observe(self, c: int) -> CycleRecord:
        """A cycle of an agent-initiated algorithm: no Spark job, the parameter service's latest reports."""
        rec = CycleRecord(c, None, None, t_submit=time.time())
        rec.agents = self.observe(max(0.2, self.rule.min_cycle_interval_s or 1.0))
        rec.t_end = time.time()
        self.last_agent_reports.update(rec.agents)
        errors = {a: e.error for a, e in rec.agents.items() if e.error}
        if errors:
            a, msg = sorted(errors.items())[0]
            raise RunFailedError(f"agent {a} failed: {msg}")
        self.timeline.add(rec)
        return rec

    def cycle(self, c: int) -> CycleRecord:
        r = self.rule.reduce_shard(c)
        if r is None:
            return self._observe(c)
        staged = self._staged.pop(c, None)
        params = self.rule.cycle_params(c)
        counted = {a: tuple(d) for a, d in self._counted.items()}
        if self.split_tasks:
            reduce = self._plan(f"c{c}/r", "reduce", cycle=c, reduce_shard=r, params=params, counted=counted,
                                pids=dict(self.pids))
            deliver = self._plan(f"c{c}/b", "deliver", cycle=c, bcast_shard=staged.shard,
                                 params=params) if staged else None
        else:
            reduce = self._plan(f"c{c}", "cycle", cycle=c, reduce_shard=r, bcast_shard=staged.shard if staged else None,
                                params=params, counted=counted, pids=dict(self.pids))
            deliver = None
        desc = f"mpca cycle {c}: reduce shard {r}" + (f", broadcast shard {staged.shard}" if staged else "")
        rec = CycleRecord(c, r, staged.shard if staged else None, t_submit=time.time())
        fut = self._pool.submit(self._job_with_corrections, reduce, deliver, staged.bc if staged else None, desc, rec)
        if self.lag == 2 and self._pending is not None:
            self._stage(*self._pending, rec)  # concurrent with job c
            self._pending = None
        result = fut.result()
        rec.t_end = time.time()
        self._durations.append(rec.t_end - rec.t_submit)
        if staged is not None:
            self._destroy(staged.bc)
        rec.agents = dict(result["agents"])
        rec.delivered = dict(result["delivered"])
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
        p = result["partial"]
        total = None if p.total is None else torch.from_numpy(np.array(p.total))
        return {"cycle": c, "shard": r, "total": total, "weight": float(p.weight)}

    def restore_pending(self, state: Optional[Dict[str, object]]) -> None:
        """Take back a checkpoint's pending reduction: staged with the first cycle, as if never interrupted."""
        if state is not None:
            total = state["total"]
            partial = WeightedSum(None if total is None else total.numpy(), float(state["weight"]))
            self._pending = (int(state["cycle"]), int(state["shard"]), {"partial": partial})

    def flush(self) -> None:
        """Stage whatever was reduced but not staged yet, so the joint model holds every reduction."""
        if self._pending is not None:
            c, r, result = self._pending
            self._pending = None
            partial = _finite(c, r, result["partial"])
            if partial is not None:
                self.rule.on_reduced(c, r, partial)
        for st in self._staged.values():
            self._destroy(st.bc)
        self._staged.clear()

    def _destroy(self, bc) -> None:
        """Drop a broadcast no job will read again, so executors' memory stays flat over thousands of cycles."""
        bc.destroy(blocking=False)
        self.broadcasts["destroyed"] += 1

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
            plan = self._plan(f"hello{attempt}", "hello", wait_for_agent_s=2.0 if sparse else 10.0)
            res = self.run_job(plan, self.spread(expected, 1 if sparse else attempt), None,
                               f"mpca: waiting for agents (attempt {attempt})")
            for a, e in res["agents"].items():
                if e.error:
                    raise RunFailedError(f"agent {a} failed: {e.error}")
                seen[a] = e
                self.pids[a] = e.pid
            attempt += 1
        self.agents = sorted(seen)
        return seen

    def stop_agents(self) -> Dict[int, dict]:
        stopped: Dict[int, dict] = {}
        for attempt in range(MAX_CORRECTIONS + 1):
            left = [a for a in self.agents if a not in stopped]
            if not left:
                break
            try:
                res = self.run_job(self._plan(f"stop{attempt}", "stop"), self.spread(len(left), attempt), None,
                                   "mpca: stopping agents")
            except Exception as e:  # noqa: BLE001 - best effort; the agent job is cancelled afterwards
                log.warning("stopping agents failed: %s", e)
                break
            stopped.update(res["agents"])
        self._pool.shutdown(wait=False)
        return stopped
