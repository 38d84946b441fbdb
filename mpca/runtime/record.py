"""What one exchange job returns: every task's :class:`ExchangeRecord`, merged by Spark's treeReduce.

A reduce task adds its agent's weighted shard to ``partial`` (a partial sum of Eq. 9: Σ wᵢ xᵢ and Σ wᵢ) — or,
with ``cluster.reduce: ordered``, keeps it apart in ``by_agent``, added in agent order by :meth:`reduced` — and
its report to ``agents``; a deliver task adds its report to ``delivered``; a task that found no agent on its
executor adds the executor to ``misplaced``.  :meth:`ExchangeRecord.merge` is associative, so the tree's
shape does not matter, and an agent counted twice is kept in ``duplicates`` (two processes acting as one agent,
which the driver refuses).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from mpca.exchange.partials import Partial, combine, empty, in_agent_order
from mpca.runtime.reports import AgentReport


@dataclass
class ExchangeRecord:
    partial: Partial = field(default_factory=empty)
    agents: Dict[int, AgentReport] = field(default_factory=dict)  # answered a reduce (or control) task
    delivered: Dict[int, AgentReport] = field(default_factory=dict)  # handed the broadcast
    misplaced: List[str] = field(default_factory=list)  # executors where a task found no unclaimed agent
    duplicates: List[int] = field(default_factory=list)  # agents that answered twice
    rows: Dict[int, Tuple[dict, bytes]] = field(default_factory=dict)  # rows asked of agents (their holdout)
    by_agent: Dict[int, Partial] = field(default_factory=dict)  # cluster.reduce: ordered — each agent's partial

    def merge(self, other: "ExchangeRecord") -> "ExchangeRecord":
        """Both records in one (treeReduce's function): partial sums added, reports united."""
        dups = self.duplicates + other.duplicates
        return ExchangeRecord(combine(self.partial, other.partial), _union(self.agents, other.agents, dups),
                              _union(self.delivered, other.delivered, dups), self.misplaced + other.misplaced, dups,
                              {**self.rows, **other.rows}, {**self.by_agent, **other.by_agent})

    def reduced(self) -> Partial:
        """The reduction: the tree's sum, and the partials kept apart added in agent order."""
        return combine(self.partial, in_agent_order(self.by_agent)) if self.by_agent else self.partial

    def errors(self) -> Dict[int, str]:
        """The agents that answered with an error, and the error."""
        return {a: e.error for part in (self.agents, self.delivered) for a, e in part.items() if e.error}


def merge_records(a: ExchangeRecord, b: ExchangeRecord) -> ExchangeRecord:
    return a.merge(b)


def _union(a: Dict[int, AgentReport], b: Dict[int, AgentReport], dups: List[int]) -> Dict[int, AgentReport]:
    out = dict(a)
    for k, v in b.items():
        if k in out:
            dups.append(k)
        out[k] = v
    return out
