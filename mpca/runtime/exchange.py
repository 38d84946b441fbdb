"""The exchange task: one per agent in every cycle's Spark job (§5.2, Fig. 12).

Running beside its agent on the same executor, the task

1. claims an agent of its executor for this cycle (each agent answers exactly
   one claim per cycle, so it can never be counted twice);
2. starts handing the new broadcast shard to the agent in the background (the
   paper's Future: the agent integrates it without stopping its training);
3. yields the agent's local shard with the weight its algorithm's agent rule
   gives it (MPCA: τ) only when Spark's treeReduce asks for it (the paper's
   YieldContext), as a partial of Eq. 9.

A task that finds no unclaimed agent on its executor reports itself
``misplaced``; the driver then runs a corrective job for the agents it is
missing (see :mod:`mpca.runtime.pipeline`).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import numpy as np

from mpca.algorithm.rules import WeightedSum
from mpca.runtime import placement
from mpca.runtime.channel import Channel, ChannelError
from mpca.runtime.reports import AgentReport


EXCHANGE_NICENESS = 10


@dataclass(frozen=True)
class ExchangePlan:
    """What every task of one exchange job does."""

    run_id: str
    secret: bytes
    token: str  # claim token: one agent answers one task per token
    op: str  # "cycle" | "hello" | "stop"
    reduce_shard: Optional[int] = None
    bcast_shard: Optional[int] = None
    params: Optional[Dict[str, Any]] = None  # the algorithm's cycle parameters (JSON), sent with deliver and yield
    wire_dtype: str = "float32"
    timeout_s: float = 120.0
    wait_for_agent_s: float = 0.0  # how long to wait for an agent socket to appear (agents still starting)


def empty_record() -> Dict[str, Any]:
    return {"partial": WeightedSum(None, 0.0), "agents": {}, "misplaced": [], "duplicates": []}


def merge_records(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Associative merge used by treeReduce: sums the Eq. 9 partials and unions the agent reports."""
    agents = dict(a["agents"])
    dups = list(a["duplicates"]) + list(b["duplicates"])
    for k, v in b["agents"].items():
        if k in agents:
            dups.append(k)
        agents[k] = v
    return {"partial": a["partial"].combine(b["partial"]), "agents": agents,
            "misplaced": list(a["misplaced"]) + list(b["misplaced"]), "duplicates": dups}


def _claim(plan: ExchangePlan):
    """Connect to an agent of this executor that has not answered ``plan.token`` yet."""
    deadline = time.time() + plan.wait_for_agent_s
    while True:
        sockets = placement.agent_sockets_here(plan.run_id)
        for path in sockets:
            try:
                ch = Channel.connect(path, plan.secret, timeout=plan.timeout_s)
            except (OSError, ChannelError):
                continue
            header, _ = ch.request({"op": "claim", "token": plan.token}, timeout=plan.timeout_s)
            if header.get("ok"):
                return ch, header, path
            ch.close()
        if sockets or time.time() > deadline:
            return None, None, None
        time.sleep(0.2)  # the agent may still be loading its data


def _deliver(plan: ExchangePlan, path: str, bcast, entry: AgentReport) -> None:
    """Background receive of the broadcast shard and hand-off to the agent (the Future)."""
    try:
        vec = np.frombuffer(bcast.value, dtype=plan.wire_dtype)
        entry.t_bc_loaded = time.time()
        ch = Channel.connect(path, plan.secret, timeout=plan.timeout_s)
        try:
            header, _ = ch.request({"op": "deliver", "shard": plan.bcast_shard, "params": plan.params or {}},
                                   memoryview(vec), timeout=plan.timeout_s)
        finally:
            ch.close()
        if not header.get("ok"):
            entry.error = f"deliver refused: {header}"
        entry.t_bc = time.time()
    except Exception as e:  # reported to the driver, which fails the run with this message
        entry.error = f"broadcast hand-off failed: {e!r}"


def _run_niced(fn, *args):
    """Run ``fn`` in a thread of lower CPU priority and return its result.

    On Linux the nice value is per thread, so the exchange work yields the CPU to the agent's training when
    cores are scarce, while the (reused) Python worker itself keeps its priority for later tasks.
    """
    out: Dict[str, Any] = {}

    def work():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EXCHANGE_NICENESS)
        except (OSError, AttributeError):
            pass
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the task's own thread
            out["error"] = e

    t = threading.Thread(target=work, name="mpca-exchange", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def exchange_partition(plan: ExchangePlan, bcast, _rows: Iterator) -> Iterator[Dict[str, Any]]:
    """mapPartitions body of an exchange job (lazy: runs when treeReduce pulls the record)."""
    yield _run_niced(_exchange, plan, bcast)


def _exchange(plan: ExchangePlan, bcast) -> Dict[str, Any]:
    """Claim an agent, hand it the broadcast in the background, yield its shard and τ (steps 1–3 above)."""
    t_start = time.time()
    rec = empty_record()
    ch, info, path = _claim(plan)
    if ch is None:
        rec["misplaced"].append(placement.executor_id())
        return rec
    entry = AgentReport.from_dict(info)
    entry.t_start = t_start
    try:
        bg = None
        if plan.op == "cycle" and plan.bcast_shard is not None and bcast is not None:
            bg = threading.Thread(target=_deliver, args=(plan, path, bcast, entry), daemon=True)
            bg.start()
        if plan.op == "cycle" and plan.reduce_shard is not None:
            header, payload = ch.request({"op": "yield", "shard": plan.reduce_shard, "params": plan.params or {},
                                          "timeout_s": plan.timeout_s}, timeout=plan.timeout_s + 10)
            entry.t_yield = time.time()
            if "agent" not in header:  # the agent answered with an error instead of its shard
                entry.error = f"agent {entry.agent} could not yield shard {plan.reduce_shard}: {header.get('error')}"
            else:
                vec = np.frombuffer(payload, dtype=plan.wire_dtype)
                rec["partial"] = WeightedSum.of(vec, float(header["weight"]))
                entry.update(header)
        elif plan.op == "stop":
            header, _ = ch.request({"op": "stop"}, timeout=plan.timeout_s)
            entry.update(header)
        if bg is not None:
            bg.join(plan.timeout_s)
    finally:
        ch.close()
    entry.t_end = time.time()
    rec["agents"][entry.agent] = entry
    return rec
