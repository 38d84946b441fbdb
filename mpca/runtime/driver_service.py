"""The parameter service as the driver hosts it: bound to the algorithm's driver rule, and what it learns of the
agents (the transport is :mod:`mpca.runtime.service`; the agents' side is their rule's
:meth:`~mpca.algorithm.ServiceAgent.call_service`).

Agents of agent-initiated algorithms call it on their own clock; each request's header carries the
agent's counters, which become the cycle reports the driver's observation cycles return.
"""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Set, Tuple

import numpy as np
import torch

from mpca.algorithm import DriverRule, WeightedSum
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.service import serve
from mpca.runtime import protocol
from mpca.runtime.protocol import SERVICE_OPS
from mpca.runtime.reports import AgentReport
from mpca.runtime.service import ParameterService


class DriverService:
    """Answers agents' requests with ``rule.serve`` (after checking the agent and that the payload is finite) and
    keeps each agent's latest report for the driver's observing cycles.

    With ``serves=False`` (driver-initiated algorithms on a cluster that decommissions executors) it only tells
    agents whether to leave (``op: poll``) and takes their last contributions as they go (``op: leave`` with
    one exact vector per shard): a decommissioning executor runs no new task, so the exchange cannot reach them.
    """

    def __init__(self, rule: DriverRule, secret: bytes, codec: Codec, max_payload: int, host: str,
                 port: int, agents: int, serves: bool = True):
        self.rule, self.agents, self.serves = rule, agents, serves
        self.codec = codec
        self.feedback = ErrorFeedback(codec)  # the answers' residual, one stream per agent
        self.reports: Dict[int, AgentReport] = {}
        self.requests: Dict[int, int] = {}
        self.joins: Dict[int, int] = {}  # replacements that fetched the current model, per agent
        self.last_call: Dict[int, float] = {}  # when each agent last called (its model or a join)
        self.started = time.time()
        self.observed = False  # first agents (attempt 0) joining before the first observation: an elastic start
        self.leaving: Set[int] = set()  # agents asked to leave (their executor is being decommissioned)
        self.left: Set[int] = set()  # agents that handed in their last exchange and said so
        self._left_taken: Set[int] = set()
        self._handed_in: List[Tuple[int, int, WeightedSum, dict]] = []  # (agent, shard, contribution, extra)
        self._joins_seen: Dict[int, int] = {}  # as of the last observation
        self.bytes_in = self.bytes_out = 0  # payloads received from / sent to agents
        self.cond = threading.Condition()
        self.server = ParameterService(secret, self._handle, max_payload=max_payload, bind_host=host, port=port,
                                       advertise_host=host).start()

    @property
    def address(self):
        return self.server.address

    def _handle(self, header: dict, payload: bytearray):
        protocol.check(SERVICE_OPS, header, algorithm_ops=True)  # an algorithm's own request: its rule checks more
        op, agent = header["op"], int(header["agent"])
        if not 0 <= agent < self.agents:
            raise ValueError(f"no agent {agent} in this run")
        if op == "poll":  # a driver-initiated algorithm's agent asks whether to leave
            with self.cond:
                return {"ok": True, "leave": agent in self.leaving}, None
        if op == "leave":  # its last exchange is in (or comes with this request): it stops
            contributions = self._contributions(agent, header, payload) if payload else []
            with self.cond:
                self._handed_in.extend(contributions)
                self.bytes_in += len(payload or b"")
                self.left.add(agent)
                self.cond.notify_all()
            return {"ok": True}, None
        if not self.serves:
            raise ValueError(f"op {op!r}: this run's algorithm has no parameter service")
        if op == "join":  # a replacement agent: the model it starts from, exact
            vec = self.rule.join_payload()
            data = np.ascontiguousarray(vec.numpy(), dtype=self.codec.dtype).tobytes()
            with self.cond:
                self.bytes_out += len(data)
                self.last_call[agent] = time.time()
                # not an elastic run's agent at its start, unless it could not rebuild the initial model
                if self.observed or int(header.get("attempt", 1)) > 0 or header.get("rebuilt_other"):
                    self.joins[agent] = self.joins.get(agent, 0) + 1
            return {"ok": True, "n": vec.numel()}, data
        reply, data = serve(self.rule, self.codec, self.feedback, agent, header, payload)
        if agent in self.leaving:
            reply = {**reply, "leave": True}  # it exchanges once more (hands in), then stops
        with self.cond:
            self.reports[agent] = AgentReport.from_dict({**header, "agent": agent})
            self.requests[agent] = self.requests.get(agent, 0) + 1
            self.last_call[agent] = time.time()
            self.bytes_in += len(payload)
            self.bytes_out += 0 if data is None else len(data)
            self.cond.notify_all()
        return reply, data

    def _contributions(self, agent: int, header: dict, payload: bytearray) -> List[Tuple[int, int, WeightedSum, dict]]:
        """A leaving agent's last contributions: one exact vector per shard in ``shards``, weighted by ``weights``
        (each checked: a shard of this run, its size, finite, weight ≥ 0)."""
        shards, weights = [int(s) for s in header["shards"]], [float(w) for w in header["weights"]]
        extras = header.get("extras") or [{} for _ in shards]
        sizes = [self.rule.shard_numel(s) if 0 <= s < self.rule.num_shards else -1 for s in shards]
        if len(weights) != len(shards) or len(extras) != len(shards) or min(sizes, default=0) < 0:
            raise ValueError(f"agent {agent}: a hand-in must name shards of this run, one weight and report each")
        vec = np.frombuffer(payload, dtype=self.codec.dtype)
        if vec.size != sum(sizes):
            raise ValueError(f"agent {agent}: handed in {vec.size} values for shards of {sum(sizes)}")
        if not np.isfinite(vec).all() or min(weights, default=0.0) < 0:
            raise ValueError(f"agent {agent} handed in NaN/Inf or a negative weight; refused")
        parts = np.split(vec, np.cumsum(sizes)[:-1])
        return [(agent, s, WeightedSum.of(torch.from_numpy(p.copy()), w), dict(e))
                for s, w, p, e in zip(shards, weights, parts, extras)]

    def take_handed_in(self) -> List[Tuple[int, int, WeightedSum, dict]]:
        """The contributions leaving agents handed in since the last call: (agent, shard, contribution, report)."""
        with self.cond:
            out, self._handed_in = self._handed_in, []
            return out

    def take_left(self) -> List[int]:
        """The agents that left since the last call."""
        with self.cond:
            new = sorted(self.left - self._left_taken)
            self._left_taken |= set(new)
            return new

    def observe(self, period_s: float) -> Tuple[Dict[int, AgentReport], List[int]]:
        """Wait until every agent has called since the last observation (at most ``period_s``); their reports,
        and the replacement agents that fetched the current model since the last observation."""
        deadline = time.time() + period_s
        with self.cond:
            seen = dict(self.requests)
            while time.time() < deadline and any(self.requests.get(a, 0) <= seen.get(a, 0) for a in range(self.agents)):
                self.cond.wait(max(0.0, deadline - time.time()))
            joined = sorted(a for a, n in self.joins.items() if n > self._joins_seen.get(a, 0))
            self._joins_seen = dict(self.joins)
            self.observed = True
            return {a: AgentReport.from_dict(r.to_dict()) for a, r in self.reports.items()}, joined

    def silent(self, for_s: float) -> List[int]:
        """Agents that have not called for ``for_s`` seconds (never: since the service started); those that
        left are not missing."""
        now = time.time()
        with self.cond:
            return [a for a in range(self.agents)
                    if a not in self.left and now - self.last_call.get(a, self.started) > for_s]

    def ask_to_leave(self, agents) -> None:
        """The next answer to each of ``agents`` asks it to leave (after one last exchange: its hand-in)."""
        with self.cond:
            self.leaving.update(agents)

    def close(self) -> None:
        self.server.close()
