"""The exchange jobs of one run: what their tasks do (an :class:`~mpca.runtime.exchange.ExchangePlan` with the
run's identity and the roster's bounded wait), how many tasks reach the agents, and one Spark job per part of a
call — each tree-reduced to an :class:`~mpca.runtime.record.ExchangeRecord`, or reduce-scattered over the
executors (:mod:`mpca.runtime.scatter`), concurrent parts merged — counted by purpose under the run's job group."""
from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Dict, Sequence

from mpca.algorithm.wire import Codec
from mpca.exchange.timeouts import TASK_TIMEOUT_S
from mpca.runtime import scatter
from mpca.runtime.exchange import ExchangePlan, exchange_partition
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.roster import AgentRoster

PARTIAL_OPS = ("reduce", "cycle")  # the plans whose tasks carry a partial sum of Eq. 9


class ExchangeJobs:
    abandons = True  # a job running past the cycle deadline can be cancelled (cancel ends it at once)

    def __init__(self, sc, run_id: str, secret: bytes, roster: AgentRoster, codec: Codec, executors: int = 1,
                 task_timeout_s: float = TASK_TIMEOUT_S, reduce: str = "tree"):
        self.sc = sc
        self.run_id = run_id
        self.secret = secret
        self.roster = roster
        self.codec = codec
        self.executors = max(1, executors)
        self.task_timeout_s = task_timeout_s
        self.scatter = reduce == "scatter"  # cluster.reduce: a cycle's partial sums reduce-scattered (scatters)
        self.ordered = reduce == "ordered"  # cluster.reduce: each agent's partial kept apart, added in agent order
        self.counts: Dict[str, int] = {"cycle": 0, "deliver": 0, "correction": 0, "control": 0}  # jobs, by purpose
        self.job_group = f"mpca-{run_id}-exchange"
        # long-lived threads: PySpark's pinned thread mode gives each Python thread its own JVM thread and does not
        # end it when the Python thread ends, so a thread per job would leave one behind per cycle
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mpca-job")

    def spread(self, agents: int, attempt: int = 1) -> int:
        """Tasks for a job that must reach ``agents`` agents: exactly ``agents`` on a first attempt, otherwise
        over-provisioned (2 per executor and agent) so that some task lands on every executor."""
        return agents if attempt == 0 else 2 * agents * self.executors

    def plan(self, token: str, op: str, **kw) -> ExchangePlan:
        """What every task of one job does (``op``), with the run's identity and the roster's wait."""
        kw.setdefault("agent_wait_s", self.roster.wait_s())
        kw.setdefault("ordered", self.ordered)
        return ExchangePlan(self.run_id, self.secret, token, op, codec=self.codec,
                            timeout_s=self.task_timeout_s, absent=tuple(sorted(self.roster.absent)), **kw)

    def run(self, plan: ExchangePlan, tasks: int, bc, description: str, purpose: str = "control") -> ExchangeRecord:
        return self.run_parts([(plan, tasks, bc)], description, purpose)

    def run_parts(self, parts: Sequence[tuple], description: str, purpose: str) -> ExchangeRecord:
        """One Spark job per ``(plan, tasks, broadcast or None)`` part, each tree-reduced, run concurrently and
        submitted in the order given (Spark's FIFO scheduler offers free task slots to the earlier job first);
        their records merged.

        Separate jobs, not one job of their union: a part without a broadcast never waits for another part's
        download — neither for its tasks' start (each part is its own Python function, and only a task whose
        function references a broadcast fetches it before it starts) nor at a stage barrier (a union of more
        than a few partitions gets a treeReduce level, whose shuffle waits for every task of the stage, deliver
        tasks included).  A cycle's deliver job is counted apart (``deliver``), so ``cycle`` stays one per
        cycle.  A cycle's part whose tasks carry partial sums is reduce-scattered where :meth:`scatters`."""
        if len(parts) == 1:
            return self._job(*parts[0], description, purpose)
        futures = []
        for i, (plan, tasks, bc) in enumerate(parts):
            seen = self._last_job_id()
            futures.append(self._pool.submit(self._job, plan, tasks, bc, description, purpose))
            if i + 1 < len(parts):
                self._until_submitted(seen)
        wait(futures)  # every job has ended before one's error is raised
        return functools.reduce(merge_records, [f.result() for f in futures])

    def pieces(self, tasks: int) -> int:
        """Pieces of a reduce-scatter over ``tasks`` tasks: one per executor that runs one (1: nothing to
        scatter, the tree it is)."""
        return max(1, min(tasks, self.executors))

    def scatters(self, plan: ExchangePlan, tasks: int, purpose: str = "cycle") -> bool:
        """Whether a job of ``tasks`` tasks doing ``plan`` reduce-scatters its partial sums over the executors
        (:mod:`mpca.runtime.scatter`): with ``cluster.reduce: scatter``, for a cycle's job whose tasks carry
        partial sums, over more than one executor; corrective and control jobs keep the tree."""
        return self.scatter and purpose == "cycle" and plan.op in PARTIAL_OPS and self.pieces(tasks) > 1

    def _job(self, plan: ExchangePlan, tasks: int, bc, description: str, purpose: str) -> ExchangeRecord:
        self.counts["deliver" if purpose == "cycle" and plan.op == "deliver" else purpose] += 1
        if plan.op == "deliver":
            description = f"{description} (deliver)"
        self.sc.setJobGroup(self.job_group, description, interruptOnCancel=True)  # per thread (pinned threads)
        rdd = self.sc.parallelize(range(tasks), tasks).mapPartitions(functools.partial(exchange_partition, plan, bc))
        if not self.scatters(plan, tasks, purpose):
            return rdd.treeReduce(merge_records, depth=2)
        pieces = self.pieces(tasks)
        keyed = rdd.flatMap(functools.partial(scatter.split, pieces=pieces))
        return scatter.join(keyed.reduceByKey(merge_records, pieces, scatter.partition).collect())

    def _last_job_id(self) -> int:
        return max(self.sc.statusTracker().getJobIdsForGroup(self.job_group) or [-1])

    def _until_submitted(self, seen: int, wait_s: float = 0.5) -> None:
        """Wait (bounded) until the run's exchange group has a job newer than ``seen``: the part just handed to
        a thread is submitted before the next one, so that the FIFO scheduler keeps their order."""
        deadline = time.monotonic() + wait_s
        while self._last_job_id() <= seen and time.monotonic() < deadline:
            time.sleep(0.002)

    def cancel(self) -> None:
        """Cancel the run's exchange jobs still running (e.g. a start handshake whose agents' job ended)."""
        self.sc.cancelJobGroup(self.job_group)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
