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

from mpca.algorithm import DriverRule
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.runtime.reports import AgentReport
from mpca.runtime.service import ParameterService


class DriverService:
    """Answers agents' requests with ``rule.serve`` (after checking the agent and that the payload is finite) and
    keeps each agent's latest report for the driver's observing cycles."""

    def __init__(self, rule: DriverRule, secret: bytes, codec: Codec, max_payload: int, host: str,
                 port: int, agents: int):
        self.rule, self.agents = rule, agents
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
        self._joins_seen: Dict[int, int] = {}  # as of the last observation
        self.bytes_in = self.bytes_out = 0  # payloads received from / sent to agents
        self.cond = threading.Condition()
        self.server = ParameterService(secret, self._handle, max_payload=max_payload, bind_host=host, port=port,
                                       advertise_host=host).start()

    @property
    def address(self):
        return self.server.address

    def _handle(self, header: dict, payload: bytearray):
        agent = int(header["agent"])
        if not 0 <= agent < self.agents:
            raise ValueError(f"no agent {agent} in this run")
        if header.get("op") == "leave":  # its last exchange is in: it stops
            with self.cond:
                self.left.add(agent)
                self.cond.notify_all()
            return {"ok": True}, None
        if header.get("op") == "join":  # a replacement agent: the model it starts from, exact
            vec = torch.cat([v.reshape(-1) for v in self.rule.join_vectors()])
            data = np.ascontiguousarray(vec.numpy(), dtype=self.codec.dtype).tobytes()
            with self.cond:
                self.bytes_out += len(data)
                self.last_call[agent] = time.time()
                if self.observed or int(header.get("attempt", 1)) > 0:  # not an elastic run's agent at its start
                    self.joins[agent] = self.joins.get(agent, 0) + 1
            return {"ok": True, "n": vec.numel()}, data
        n = int(header.get("n", len(payload) // np.dtype(self.codec.dtype).itemsize))
        vec = torch.from_numpy(self.codec.decode(payload, n))
        if not bool(torch.isfinite(vec).all()):
            raise ValueError(f"agent {agent} sent NaN/Inf; refused (the joint model stays finite)")
        reply, out = self.rule.serve(agent, header, vec)
        if agent in self.leaving:
            reply = {**reply, "leave": True}  # it exchanges once more (hands in), then stops
        data = None if out is None else self.feedback.encode(agent, out.numpy())
        with self.cond:
            self.reports[agent] = AgentReport.from_dict({**header, "agent": agent})
            self.requests[agent] = self.requests.get(agent, 0) + 1
            self.last_call[agent] = time.time()
            self.bytes_in += len(payload)
            self.bytes_out += 0 if data is None else len(data)
            self.cond.notify_all()
        return ({**reply, "n": out.numel()} if out is not None else reply), data

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
