"""The exchange tasks: every cycle's Spark job runs a *reduce* task and a *deliver* task per agent (§5.2, Fig. 12).

PySpark hands a task its broadcast variables before the task's Python code starts, so a task that both
received the new broadcast and yielded the local shard could yield only after the download: reduce and
broadcast would follow each other on the wire.  The cycle's job is therefore the union of two kinds of
tasks (still one Spark job), each running beside its agent on the same executor:

* a **deliver** task references the cycle's broadcast; once Spark has fetched it, the task claims an agent
  of its executor and hands it the projected shard (the paper's Future: the agent integrates it between
  two steps without stopping its training);
* a **reduce** task references no broadcast and starts at once: it claims an agent of its executor and
  yields the agent's local shard with the weight its algorithm's agent rule gives it (MPCA: τ) when Spark's
  treeReduce asks for it (the paper's YieldContext), as a partial of Eq. 9.

So an agent's shard goes up while the next broadcast comes down, given a free task slot for each (exchange
tasks are I/O-bound and run at low CPU priority: declare executor cores for them).  Every agent answers
exactly one claim per token, and each kind of task has its own token, so no agent is ever counted twice.
A task that finds no unclaimed agent on its executor reports itself ``misplaced``; the driver then runs a
corrective job for what it is missing (see :mod:`mpca.runtime.pipeline`).
"""
from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from mpca.algorithm.wire import Codec
from mpca.exchange.timeouts import TASK_TIMEOUT_S
from mpca.exchange.partials import contribution
from mpca.runtime import placement, protocol
from mpca.runtime.protocol import AGENT_OPS
from mpca.runtime.channel import Channel, ChannelError
from mpca.runtime.record import ExchangeRecord
from mpca.runtime.reports import AgentReport


EXCHANGE_NICENESS = 10
ABSENT_CLAIM_S = 0.5  # handshake wait for an agent the driver counts as absent: a live agent answers in ms


@dataclass(frozen=True)
class ExchangePlan:
    """What every task of one exchange job does."""

    run_id: str
    secret: bytes = field(repr=False)
    token: str  # claim token: one agent answers one task per token
    op: str  # "reduce" | "deliver" | "cycle" (both in one task) | "join" | "hello" | "stop" | "holdout"
    cycle: Optional[int] = None  # sequence number: an agent ignores deliveries older than what it holds
    reduce_shard: Optional[int] = None
    bcast_shard: Optional[int] = None
    broadcasts: bool = False  # a reduce plan whose cycle also broadcasts (its other job delivers): agents in lock step
    # wait for that broadcast before their next window (mpca.exchange.lock_step)
    ordered: bool = False  # cluster.reduce: ordered — each agent's partial kept apart, added in agent order
    params: Optional[Dict[str, Any]] = None  # the algorithm's cycle parameters (JSON), sent with deliver and yield
    codec: Codec = Codec()  # the wire format of shards going up and down (fp32: the layout's wire dtype)
    reduce_numel: int = 0  # values of the reduced shard (to decode a lossy contribution)
    timeout_s: float = TASK_TIMEOUT_S  # cluster.task_timeout_s
    wait_for_agent_s: float = 0.0  # how long to wait for an agent socket to appear (agents still starting)
    agent_wait_s: float = 10.0  # how long a silent agent may keep a task waiting (cluster.agent_wait_s)
    only_agents: Optional[Tuple[int, ...]] = None  # claim only these agents (None: any of the run)
    absent: Tuple[int, ...] = ()  # agents the driver counts as hung or lost: tried last, with a short wait
    counted: Optional[Dict[int, Tuple[int, ...]]] = None  # per agent, recent cycles whose contribution counted
    pids: Optional[Dict[int, int]] = None  # each agent's process as the driver knows it: another one (or one the
    # driver never knew: an elastic run's agent that came up late) joins from the joint model

    def wants(self, agent: Optional[int]) -> bool:
        return agent is not None and (self.only_agents is None or agent in self.only_agents)


Connector = Callable[[float], Channel]  # opens an authenticated channel to one agent within a timeout


def local_agents(plan: ExchangePlan) -> List[Tuple[int, Connector]]:
    """The agents of this run whose Unix sockets are on this executor (a Spark exchange task's candidates)."""
    out = []
    for path in placement.agent_sockets_here(plan.run_id):
        agent = placement.agent_of_socket(path)
        if agent is not None:
            out.append((agent, functools.partial(Channel.connect, path, plan.secret)))
    return out


def _claim(plan: ExchangePlan, candidates: Callable[[ExchangePlan], List[Tuple[int, Connector]]] = local_agents):
    """Connect to an agent among ``candidates`` (those of this executor, or the one a Connect coordinator's relay
    task is for) that has not answered ``plan.token`` yet.  A silent agent (hung, e.g. SIGSTOP) holds the task at
    most ``agent_wait_s`` (absent ones ``ABSENT_CLAIM_S``)."""
    deadline = time.time() + plan.wait_for_agent_s
    while True:
        found = [(a, connect) for a, connect in candidates(plan) if plan.wants(a)]
        found.sort(key=lambda c: c[0] in plan.absent)
        for agent, connect in found:
            wait = ABSENT_CLAIM_S if agent in plan.absent else plan.agent_wait_s
            try:
                ch = connect(wait)
            except (OSError, ChannelError):
                continue
            try:
                header, _ = ch.request(protocol.header(AGENT_OPS, "claim", token=plan.token, **{"for": plan.op}),
                                       timeout=wait)
            except (OSError, ChannelError):
                ch.close()
                continue
            if header.get("ok"):
                return ch, header, connect
            ch.close()
        if found or time.time() > deadline:
            return None, None, None
        time.sleep(0.2)  # the agent may still be loading its data


def _deliver(plan: ExchangePlan, ch: Channel, bcast, entry: AgentReport) -> None:
    """Hand the broadcast shard to the claimed agent (the Future); ``join``: every shard, to a replacement."""
    data = memoryview(bcast.value)  # encoded by the driver (a join: the whole model in the values' own dtype)
    entry.t_bc_loaded = time.time()
    op = "join" if plan.op == "join" else "deliver"
    header, _ = ch.request(protocol.header(AGENT_OPS, op, shard=plan.bcast_shard, cycle=plan.cycle,
                                           params=plan.params or {}), data, timeout=plan.timeout_s)
    entry.bytes_down = len(data)
    if not header.get("ok"):
        entry.error = f"deliver refused: {header}"
    entry.t_bc = time.time()


def _yield(plan: ExchangePlan, ch: Channel, entry: AgentReport, rec: ExchangeRecord) -> None:
    """Ask the claimed agent for its shard and weight (the YieldContext)."""
    counted = (plan.counted or {}).get(entry.agent)
    known = (plan.pids or {}).get(entry.agent)
    header, payload = ch.request(protocol.header(AGENT_OPS, "yield", shard=plan.reduce_shard, params=plan.params or {},
                                                 cycle=plan.cycle, counted=None if counted is None else list(counted),
                                                 rejoin=plan.pids is not None and known != entry.pid,
                                                 timeout_s=plan.timeout_s,
                                                 broadcasts=plan.broadcasts or plan.bcast_shard is not None),
                                 timeout=plan.timeout_s + 10)
    entry.t_yield = time.time()
    if "agent" not in header:  # the agent answered with an error instead of its shard
        entry.error = f"agent {entry.agent} could not yield shard {plan.reduce_shard}: {header.get('error')}"
        return
    entry.update(header)
    entry.bytes_up = len(payload)
    partial = contribution(payload, plan.reduce_numel, float(header["weight"]), plan.codec)
    if plan.ordered:
        rec.by_agent[entry.agent] = partial
    else:
        rec.partial = partial


def run_niced(fn, *args):
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


def exchange_partition(plan: ExchangePlan, bcast, _rows: Iterator) -> Iterator[ExchangeRecord]:
    """mapPartitions body of an exchange task (lazy: runs when treeReduce pulls the record).  ``bcast`` is
    None for every task but the deliver tasks, so only those wait for the broadcast's download."""
    yield run_niced(exchange_task, plan, bcast, time.time())


def exchange_task(plan: ExchangePlan, bcast, t_start: float,
              candidates: Callable[[ExchangePlan], List[Tuple[int, Connector]]] = local_agents,
              where: Optional[str] = None) -> ExchangeRecord:
    """Claim an agent among ``candidates`` (default: of this executor), then do the plan's one thing with it;
    ``where`` names the task's place in a misplaced report and an error (default: this executor's id)."""
    cpu0 = time.thread_time()
    rec = ExchangeRecord()
    ch, info, connect = _claim(plan, candidates)
    if ch is None:
        rec.misplaced.append(where or placement.executor_id())
        return rec
    entry = AgentReport.from_dict(info)
    entry.t_start = t_start
    silent = False
    try:
        if plan.op in ("deliver", "join"):
            _deliver(plan, ch, bcast, entry)
        elif plan.op == "reduce":
            _yield(plan, ch, entry, rec)
        elif plan.op == "cycle":  # one task per agent: hand-off on its own connection while the shard goes up
            _both(plan, ch, connect, bcast, entry, rec)
        elif plan.op == "stop":
            entry.update(ch.request(protocol.header(AGENT_OPS, "stop"), timeout=plan.timeout_s)[0])
        elif plan.op == "holdout":  # the agent's holdout rows up to the driver's cut-off (mpca.data.holdout)
            header, payload = ch.request(protocol.header(AGENT_OPS, "holdout", **(plan.params or {})),
                                         timeout=plan.timeout_s)
            rec.rows[entry.agent] = (header, bytes(payload))
    except (TimeoutError, ConnectionError):  # it stopped answering mid-request (its process stopped, or lost)
        silent = True
    except Exception as e:  # reported to the driver, which fails the run with this message
        entry.error = f"{plan.op} failed on {where or f'executor {placement.executor_id()}'}: {e!r}"
    finally:
        ch.close()
    entry.t_end = time.time()
    entry.exchange_cpu_s = time.thread_time() - cpu0  # this task's Python CPU (not the JVM's download)
    if silent:  # as an agent that never answered: the cycle goes on without it (lab.campaign found a stop mid-
        if plan.op == "cycle" and entry.t_yield is not None:  # request failing the run); its shard went up, only
            rec.agents[entry.agent] = entry  # the hand-off failed: counted, not delivered
        return rec
    if plan.op in ("deliver", "cycle", "join") and bcast is not None:
        rec.delivered[entry.agent] = entry
    if plan.op not in ("deliver", "join"):
        rec.agents[entry.agent] = entry
    return rec


def _both(plan: ExchangePlan, ch: Channel, connect: Connector, bcast, entry: AgentReport, rec: ExchangeRecord) -> None:
    """Where an executor has one free task slot per agent: deliver (in a thread, on a second connection to
    the same agent) and yield in one task — which Spark starts only after the broadcast has arrived."""
    errors: list = []

    def hand_off():
        try:
            second = connect(plan.timeout_s)
            try:
                _deliver(plan, second, bcast, entry)
            finally:
                second.close()
        except Exception as e:  # noqa: BLE001 - reported with the task's record
            errors.append(e)

    bg = threading.Thread(target=hand_off, daemon=True) if bcast is not None else None
    if bg is not None:
        bg.start()
    _yield(plan, ch, entry, rec)
    if bg is not None:
        bg.join(plan.timeout_s)
        if errors:
            raise errors[0]
