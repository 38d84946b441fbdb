"""The agent's answers to the driver's exchange tasks (a part of :class:`mpca.runtime.agent.Agent`, which holds
the state they use): every request on its channel (:data:`mpca.runtime.protocol.AGENT_OPS`, checked first) —
hello and claim, the holdout's rows, a join from the joint model, a delivered shard, a yielded contribution
(settling the ones the driver never counted), stop — each under the step lock between two training steps."""
from __future__ import annotations

import logging
import time
from typing import List, Optional, Tuple

import numpy as np
import torch

from mpca.exchange.agent_step import finite, wire_bytes
from mpca.exchange.device import DeviceClock
from mpca.exchange.timeouts import TASK_TIMEOUT_S
from mpca.runtime import protocol
from mpca.runtime.protocol import AGENT_OPS, SERVICE_OPS

log = logging.getLogger("mpca.agent")


class ExchangeAnswers:
    """The exchange half of an agent; :class:`~mpca.runtime.agent.Agent` mixes it in with its training loop
    (:class:`~mpca.runtime.agent_loop.TrainingLoop`)."""

    def _settle(self, cycle: Optional[int], counted: Optional[List[int]]) -> None:
        """Contributions yielded before ``cycle`` that the driver did not count (``counted``: its recent
        counted cycles for this agent) were lost on the way: their weight goes back to the rule."""
        if cycle is None or counted is None:
            return
        done = set(counted)
        for c in [c for c in self._unsettled if c < cycle]:
            shard, extra = self._unsettled.pop(c)
            if c not in done:
                self.lost += 1
                log.warning("agent %s: its contribution of cycle %d (shard %d) never reached the reduction; "
                            "its weight carries over to the next one", self.id, c, shard)
                self.rule.contribution_lost(shard, extra)

    def _joint_pieces(self, payload: bytearray) -> Tuple[List[List[torch.Tensor]], torch.Tensor]:
        """A join's payload (the whole joint model, exact, in the layout's wire dtype, then the driver rule's join
        state) as pieces per shard and the state."""
        vec = torch.from_numpy(np.frombuffer(payload, dtype=_np_dtype(self.spec.layout.wire_dtype)))
        shards, state = self.spec.layout.split_join(vec)
        return [self.shards.split(s, part) for s, part in enumerate(shards)], state  # the rule places it

    def _join_service(self, rebuilt_other: bool) -> None:
        """A replacement of an agent-initiated algorithm (Spark retried its task), an elastic run's agent or one
        that rebuilt other initial weights (``rebuilt_other``): before its rule is built, the local model becomes
        the parameter service's current model (the driver rule's join vectors, exact)."""
        _, payload = self.service.request(protocol.header(SERVICE_OPS, "join", agent=self.id, attempt=self.attempt,
                                                          rebuilt_other=rebuilt_other))
        pieces, _ = self._joint_pieces(payload)  # its rule is not built yet: the service's rules keep no join state
        with torch.no_grad():
            for s, p in enumerate(pieces):
                torch._foreach_copy_(self.shards.views(s), p)
        log.info("agent %s (attempt %d) starts from the parameter service's current model", self.id, self.attempt)

    def _join(self, payload: bytearray, params: dict, cycle: Optional[int] = None) -> None:
        """Start from the driver's joint model (every shard) of ``cycle``, with a fresh optimizer and fresh
        counters: deliveries of that cycle or older are not taken after it, and what it yielded before is
        settled (a Connect run's coordinator that Spark started again counts its cycles from its checkpoint)."""
        pieces, state = self._joint_pieces(payload)
        with self._served():
            if cycle is not None:
                self._delivered_cycle = [int(cycle)] * self.spec.layout.num_shards
            self._unsettled.clear()
            with torch.no_grad():
                for s, p in enumerate(pieces):
                    torch._foreach_copy_(self.shards.views(s), p)
                    self._anchor[s] = p
                self.rule.joined(pieces, params, state)
            self.optimizer = self.spec.optimizer_fn(self.model.parameters())
            self.rule.ctx.optimizer = self.optimizer
            self.rule.on_reset()
            self.joining = False
            self.joins += 1
            if self.pace is not None:
                self.pace.reset()
        log.info("agent %s (attempt %d) joined from the joint model", self.id, self.attempt)

    def handle(self, header: dict, payload: bytearray):
        """Answer one request of the driver's tasks (:data:`~mpca.runtime.protocol.AGENT_OPS`, checked first)."""
        try:
            op = protocol.check(AGENT_OPS, header).name
        except ValueError as e:
            return {"error": f"bad request {header.get('op')!r}: {e}"}, None
        self.last_contact = time.time()
        if op == "hello":
            return self.report().to_dict(), None
        if op == "holdout":  # the rows it set aside (mpca.data.holdout): first their hashes, then rows up to one
            if self.loading is not None and not self.loading.done:
                return {"loading": True}, None
            if self.holdout is None:
                return {"rows": 0, "label_dtype": "int64"}, None
            if "up_to" not in header:  # its smallest hashes, int64, as the payload
                hashes = self.holdout.hashes()
                return {"rows": len(hashes)}, hashes.tobytes()
            return self.holdout.rows_up_to(int(header["up_to"]))
        if op == "claim":
            token = str(header["token"])
            with self._served():
                if token in self.claimed_tokens:
                    return {"ok": False, "agent": self.id}, None
                self.claimed_tokens.append(token)
            extra = {"labels": self.label_counts, "startup": self.startup(),
                     "initial_model": self.initial_model} if header.get("for") == "hello" else {}
            return {"ok": True, **self.report(**extra).to_dict()}, None
        params = header.get("params") or {}
        cycle = header.get("cycle")
        if params:
            self.last_params = params  # the latest cycle's (a rule's parameters are per cycle, not per shard)
        if op == "join":
            if self.joining:
                self._join(payload, params, cycle)
            return {"ok": True}, None
        if op == "deliver":
            s = self._shard(header)
            vec = torch.from_numpy(self.codec.decode(payload, self.spec.layout.shard_numel(s)))
            if not bool(torch.isfinite(vec).all()):  # the driver broadcasts finite joint models only
                raise ValueError(f"shard {s} holds non-finite values (corrupted on the way): not taken")
            pieces = self.shards.split(s, vec)  # conversion and host→device copy outside the lock
            with self._served():
                if cycle is not None:
                    if int(cycle) <= self._delivered_cycle[s]:  # a late hand-off of an older broadcast
                        return {"ok": True, "stale": True}, None
                    self._delivered_cycle[s] = int(cycle)

                def receive(s=s, pieces=pieces, params=params):
                    self.rule.receive(s, pieces, params)
                    self._anchor[s] = self.rule.reset_target(s, pieces)  # the latest joint shard: where a reset goes

                if self.pace is None:
                    receive()
                else:  # in lock step: received right after this cycle's yield
                    self.pace.deliver(None if cycle is None else int(cycle), receive)
            return {"ok": True}, None
        if op == "yield":
            s = self._shard(header)
            if header.get("rejoin") and not self.joining:  # the driver knew another process as this agent
                with self._served():
                    self.joining = True
                log.warning("agent %s: a replacement (its first process was lost); waiting for the joint model",
                            self.id)
            if self.joining:  # nothing of its own to give yet
                vec = torch.zeros(self.spec.layout.shard_numel(s), dtype=self.spec.layout.wire_dtype)
                return self.report(weight=0.0).to_dict(), vec.numpy().tobytes()
            timeout_s = float(header.get("timeout_s", TASK_TIMEOUT_S))
            if self.pace is not None and not self.pace.ready(None if cycle is None else int(cycle), timeout_s):
                raise TimeoutError(f"agent {self.id} had not taken its lock-step window's {self.pace.gate.steps} "
                                   f"steps after {timeout_s:.0f}s (step {self.steps})")
            self.rule.yield_ready(s, params, timeout_s)
            with self._served():  # materialize the shard between two steps
                self._settle(cycle, header.get("counted"))
                vec, weight, extra = self.rule.contribution(s, params)
                if self.pace is not None:
                    self.pace.yielded(None if cycle is None else int(cycle), bool(header.get("broadcasts")))
                if cycle is not None:
                    self._unsettled[int(cycle)] = (s, extra)
                    while len(self._unsettled) > 64:  # the driver confirms within a cycle or two
                        self._unsettled.pop(min(self._unsettled))
                counters = self._counters()
                resets = self.resets
            vec, weight, ok = finite(vec, weight)  # never let NaN/Inf reach the joint model (checked unlocked)
            if not ok:
                with self._served():
                    if self.resets == resets:  # not already reset since the read (the step loop checks too)
                        self._reset(f"non-finite values in shard {s}")
            rep = self.report(weight=weight, extra=extra, **{k: counters[k] for k in
                                                           ("steps_per_s", "loss", "exchange_s", "alive_s",
                                                            *DeviceClock.FIELDS)})
            return rep.to_dict(), wire_bytes(self.feedback, s, vec, weight)
        if op == "stop":
            self.stop_requested = True
            return {"ok": True, **self.report().to_dict()}, None
        return {"error": f"unknown op {op!r}"}, None

    def _shard(self, header: dict) -> int:
        s = int(header["shard"])
        if not 0 <= s < self.spec.layout.num_shards:
            raise ValueError(f"no shard {s}")
        return s


def _np_dtype(dtype: torch.dtype):
    return {torch.float32: np.float32, torch.float64: np.float64}[dtype]
