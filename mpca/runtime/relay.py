"""The exchange of a Spark Connect run, driven from its coordinator task: the same plans, the same task body
(:func:`mpca.runtime.exchange.exchange_task`), the same records and merge as a classic driver's Spark jobs, with the
coordinator's threads in place of Spark tasks and the agents' TCP listeners in place of their executors' Unix
sockets.

Connect takes away the client-side SparkContext, its broadcast variables and ``treeReduce``, so a cycle's
"job" is one relay task per agent, run at once in the coordinator: a reduce task yields the agent's shard (its
partial sum of Eq. 9 merged with :meth:`~mpca.runtime.record.ExchangeRecord.merge`, as treeReduce merges them),
a deliver task hands it the staged projection — a star into the coordinator's port, every agent's shard on its
own connection.  The 3-phase schedule, the roster, corrections, joins and the control jobs are the runtime's own
(:mod:`mpca.runtime.pipeline`, :mod:`mpca.runtime.control`): only how a job reaches its agents differs.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

from mpca.algorithm.wire import Codec
from mpca.runtime.rundir import AGENTS_ENDED, COORDINATOR, RunDir
from mpca.runtime.broadcasts import Broadcasts
from mpca.runtime.channel import Channel
from mpca.runtime.exchange import Connector, ExchangePlan, exchange_task
from mpca.runtime.jobs import ExchangeJobs
from mpca.runtime.record import ExchangeRecord, merge_records
from mpca.runtime.roster import AgentRoster

REGISTRY_REFRESH_S = 0.5  # the agents' announcements read again at most this often, while one is not reached
RELAY_THREADS = 64


class Held:
    """A staged payload the coordinator holds in memory for its relay tasks (a broadcast variable's ``value``)."""

    def __init__(self, data: bytes):
        self.value = data

    def destroy(self, blocking: bool = False) -> None:
        self.value = b""


class HeldBroadcasts(Broadcasts):
    """The run's broadcasts as payloads in the coordinator's memory: each relay task sends its agent the bytes
    (encoded with the driver's error feedback per shard, as Spark's broadcasts are)."""

    def __init__(self, codec: Codec):
        super().__init__(None, codec)

    def publish(self, data: bytes) -> Held:
        return Held(data)


class AgentDirectory:
    """Where each agent listens, from its announcement in the run directory (read again when one is missing or
    was not reached, at most every :data:`REGISTRY_REFRESH_S`)."""

    def __init__(self, rundir: RunDir, secret: bytes, max_payload: int):
        self.rundir, self.secret, self.max_payload = rundir, secret, max_payload
        self._known: Dict[int, Tuple[str, int]] = {}
        self._read_at = 0.0
        self._lock = threading.Lock()

    def refresh(self, force: bool = False) -> None:
        with self._lock:
            if not force and time.monotonic() - self._read_at < REGISTRY_REFRESH_S:
                return
            self._read_at = time.monotonic()
            self._known = {a: (str(v["host"]), int(v["port"])) for a, v in self.rundir.agents().items()}

    def agents(self) -> List[int]:
        return sorted(self._known)

    def connector(self, agent: int) -> Optional[Connector]:
        where = self._known.get(agent)
        if where is None:
            return None
        return functools.partial(_connect, where, self.secret, self.max_payload)

    def candidates(self, agent: int, plan: ExchangePlan) -> List[Tuple[int, Connector]]:
        """The one agent a relay task is for, where it listens (nothing while it has not announced itself)."""
        connect = self.connector(agent)
        if connect is None:
            self.refresh()
            connect = self.connector(agent)
        return [] if connect is None else [(agent, connect)]


def _connect(where: Tuple[str, int], secret: bytes, max_payload: int, timeout: float) -> Channel:
    return Channel.connect_tcp(where[0], where[1], secret, timeout=timeout, max_payload=max_payload)


class RelayJobs(ExchangeJobs):
    """:class:`~mpca.runtime.jobs.ExchangeJobs` run by the coordinator: a job's tasks are threads, one per agent
    it must reach (its plan's ``only_agents``, else every agent announced or on the roster)."""

    abandons = False  # its tasks end within their own waits: there is no job to cancel

    def __init__(self, directory: AgentDirectory, run_id: str, secret: bytes, roster: AgentRoster, codec: Codec,
                 task_timeout_s: float, attempt: int = 0, ordered: bool = False):
        """``attempt``: the coordinator task's attempt, in every claim token — the agents remember the tokens
        they answered, and a coordinator started again counts its cycles from its checkpoint; ``ordered``:
        ``cluster.reduce: ordered`` (scatter is a shuffle, which a relay's threads have not: their sums are the
        tree's)."""
        super().__init__(None, run_id, secret, roster, codec, executors=max(1, len(roster.agents)),
                         task_timeout_s=task_timeout_s, reduce="ordered" if ordered else "tree")
        self.directory = directory
        self.attempt = attempt
        self._relay = ThreadPoolExecutor(max_workers=RELAY_THREADS, thread_name_prefix="mpca-relay")

    def plan(self, token: str, op: str, **kw) -> ExchangePlan:
        return super().plan(f"{self.attempt}:{token}", op, **kw)

    def spread(self, agents: int, attempt: int = 1) -> int:
        return agents  # one relay task per agent: none lands where its agent is not

    def scatters(self, plan: ExchangePlan, tasks: int, purpose: str = "cycle") -> bool:
        return False  # the partial sums meet in the coordinator

    def run_parts(self, parts: Sequence[tuple], description: str, purpose: str) -> ExchangeRecord:
        """Every part's relay tasks at once (no task slots to share: each is a thread), their records merged."""
        if len(parts) == 1:
            return self._job(*parts[0], description, purpose)
        with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="mpca-relay-part") as pool:
            records = list(pool.map(lambda part: self._job(*part, description, purpose), parts))
        return functools.reduce(merge_records, records)

    def _job(self, plan: ExchangePlan, tasks: int, bc, description: str, purpose: str) -> ExchangeRecord:
        self.counts["deliver" if purpose == "cycle" and plan.op == "deliver" else purpose] += 1
        self.directory.refresh()
        targets = sorted(plan.only_agents) if plan.only_agents is not None else \
            sorted(set(self.directory.agents()) | set(self.roster.agents))
        if not targets:  # nobody announced yet: one task that waits for the first as a Spark task would
            targets = [0]
        t0 = time.time()
        futures = [self._relay.submit(exchange_task, plan, bc, t0, functools.partial(self.directory.candidates, a),
                                      f"agent {a}'s relay") for a in targets]
        return functools.reduce(merge_records, [f.result() for f in futures])

    def cancel(self) -> None:
        """Nothing to cancel: a relay task ends within its plan's waits."""

    def close(self) -> None:
        super().close()
        self._relay.shutdown(wait=False)


class AgentsWatch:
    """The agents' job as the coordinator sees it: the client started it and says in the run directory when it
    ended (and why); their summaries stay with the client."""

    def __init__(self, rundir: RunDir, check_every_s: float = 1.0):
        self.rundir, self.check_every_s = rundir, check_every_s
        self.summaries: List[dict] = []
        self._ended: Optional[dict] = None
        self._checked = 0.0

    def start(self, *args, **kwargs) -> None:
        """The client started the agents' job."""

    def _end(self) -> Optional[dict]:
        if self._ended is None and time.monotonic() - self._checked >= self.check_every_s:
            self._checked = time.monotonic()
            self._ended = self.rundir.read(AGENTS_ENDED)
        return self._ended

    def alive(self) -> bool:
        return self._end() is None

    def failure(self) -> str:
        ended = self._end()
        return str(ended.get("failure")) if ended else "the agents' Spark job ended"

    def join(self, timeout: float) -> bool:
        """Nothing to wait for here: the agents were told to stop, and the client waits for their job to end
        (and interrupts it if it would not)."""
        return True

    def cancel(self) -> None:
        """The client cancels the agents' job once the coordinator's task has returned."""


class RelaySide:
    """What :class:`~mpca.runtime.run.AgentRun` drives its agents through inside a Connect run's coordinator
    task (the classic driver's is :class:`~mpca.runtime.spark_side.SparkSide`)."""

    def __init__(self, rundir: RunDir, settings, run_id: str, secret: bytes, max_payload: int, host: str,
                 attempt: int = 0):
        """``attempt`` > 0: Spark started the coordinator's task again (an earlier attempt was lost); the agents,
        still running, rejoin from its joint model (restored from the last checkpoint): ``resumed``."""
        self.rundir, self.settings = rundir, settings
        self.attempt, self.resumed = attempt, attempt > 0
        # a client cannot see the executors to check their room first: said when the agents fail to come up
        self.start_hint = (f" (a Spark Connect run needs a free task slot for each of its {settings.training.agents}"
                           " agents and one for its coordinator; agents that came up but were not reached: check "
                           "that the coordinator's executor reaches theirs over TCP — their addresses are in "
                           f"{rundir.location}/agent-*.json)")
        self.relay_dir = rundir.location
        self._identity = (run_id, secret)
        self._host = host
        self.directory = AgentDirectory(rundir, secret, max_payload)

    def identity(self) -> Tuple[str, bytes]:
        return self._identity

    @property
    def executors(self) -> int:
        return self.settings.training.agents

    def host(self) -> str:
        return self._host

    def decommission_enabled(self) -> bool:
        return False  # no scheduler to ask from inside the cluster: an agent whose executor goes is lost instead

    def split_tasks(self) -> bool:
        return True  # relay tasks are threads: a cycle's reduce never waits for its delivery

    def agent_job(self, run_id: str) -> AgentsWatch:
        return AgentsWatch(self.rundir)

    def exchange_jobs(self, run_id: str, secret: bytes, roster: AgentRoster, codec: Codec) -> RelayJobs:
        return RelayJobs(self.directory, run_id, secret, roster, codec, self.settings.cluster.task_timeout_s,
                         self.attempt, ordered=self.settings.cluster.reduce == "ordered")

    def broadcasts(self, codec: Codec) -> HeldBroadcasts:
        return HeldBroadcasts(codec)

    def executor_count(self) -> int:
        return self.settings.training.agents

    def decommissioning(self, executors: set) -> set:
        return set()

    def publish(self, service: Optional[Tuple[str, int]], rendezvous: dict) -> None:
        """Where the agents find the coordinator's services (``coordinator.json``)."""
        self.rundir.write(COORDINATOR, {"host": self._host, "service": list(service) if service else None,
                                        "rendezvous": rendezvous, "pid": os.getpid(), "attempt": self.attempt})
