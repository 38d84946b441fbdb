"""The exchange jobs of one run: what their tasks do (an :class:`~mpca.runtime.exchange.ExchangePlan` with the
run's identity and the roster's bounded wait), how many tasks reach the agents, and one Spark job per call —
the union of its parts, tree-reduced to an :class:`~mpca.runtime.record.ExchangeRecord` — counted by purpose
under the run's job group."""
from __future__ import annotations

import functools
from typing import Dict, Sequence

from mpca.algorithm.wire import Codec
from mpca.runtime.exchange import ExchangePlan, exchange_partition
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.roster import AgentRoster


class ExchangeJobs:
    def __init__(self, sc, run_id: str, secret: bytes, roster: AgentRoster, codec: Codec, executors: int = 1,
                 task_timeout_s: float = 120.0):
        self.sc = sc
        self.run_id = run_id
        self.secret = secret
        self.roster = roster
        self.codec = codec
        self.executors = max(1, executors)
        self.task_timeout_s = task_timeout_s
        self.counts: Dict[str, int] = {"cycle": 0, "correction": 0, "control": 0}  # Spark jobs, by purpose
        self.job_group = f"mpca-{run_id}-exchange"

    def spread(self, agents: int, attempt: int = 1) -> int:
        """Tasks for a job that must reach ``agents`` agents: exactly ``agents`` on a first attempt, otherwise
        over-provisioned (2 per executor and agent) so that some task lands on every executor."""
        return agents if attempt == 0 else 2 * agents * self.executors

    def plan(self, token: str, op: str, **kw) -> ExchangePlan:
        """What every task of one job does (``op``), with the run's identity and the roster's wait."""
        kw.setdefault("agent_wait_s", self.roster.wait_s())
        return ExchangePlan(self.run_id, self.secret, token, op, codec=self.codec,
                            timeout_s=self.task_timeout_s, absent=tuple(sorted(self.roster.absent)), **kw)

    def run(self, plan: ExchangePlan, tasks: int, bc, description: str, purpose: str = "control") -> ExchangeRecord:
        return self.run_parts([(plan, tasks, bc)], description, purpose)

    def run_parts(self, parts: Sequence[tuple], description: str, purpose: str) -> ExchangeRecord:
        """One Spark job made of the union of ``(plan, tasks, broadcast or None)`` parts, tree-reduced.

        Each part is its own Python function, so only the tasks of a part that references a broadcast wait
        for its download; parts come in the order given (Spark offers lower task indices first)."""
        self.counts[purpose] += 1
        self.sc.setJobGroup(self.job_group, description, interruptOnCancel=True)
        rdds = [self.sc.parallelize(range(n), n).mapPartitions(functools.partial(exchange_partition, plan, bc))
                for plan, n, bc in parts]
        rdd = rdds[0] if len(rdds) == 1 else self.sc.union(rdds)
        return rdd.treeReduce(merge_records, depth=2)
