"""Control jobs: the agents' start handshake, a status probe and the stop — light jobs that move no shard."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from mpca.errors import RunFailedError, UserError
from mpca.runtime.jobs import ExchangeJobs
from mpca.runtime.reports import AgentReport

log = logging.getLogger("mpca.pipeline")

STOP_ATTEMPTS = 6
# How long one hello task waits for its executor's agent to listen (it listens once its data is loaded).  A
# task ends the moment its agent answers, so a long wait costs nothing; a short one missed agents that took
# a little longer and paid a whole new job for them — on this 2-core machine with 4 agents, start-up went from
# ~9 s to 16-20 s whenever the agents needed a little over the 10 s this used to be.  The driver watches the
# agents' job meanwhile and cancels the hello as soon as that job ends (an error every agent hit).
HELLO_WAIT_S = 60.0


def task_started_at(startup: dict, received: float, submitted: Optional[float]) -> float:
    """When an agent's Spark task started, on the driver's clock.

    The agent reports its task's start on its executor's clock (``started_at``) and the seconds since then at
    its answer (``since_start_s``).  The hello job's results reach the driver together, when its last task ends
    (the slowest agent's answer), so ``received - since_start_s`` is only an upper bound: every agent that
    answered sooner would read as started as late as the slowest one's wait allows.  The executor's own clock
    is exact where it is the driver's (local-cluster) and close to it where NTP keeps the hosts in step, so it
    is taken, kept within what the driver's clock knows: no later than that bound and no earlier than the
    agents' job was submitted (``submitted``)."""
    latest = received - startup["since_start_s"]
    at = startup.get("started_at")
    if at is None:  # an agent of an older mpca: the bound is all there is
        return latest
    return min(latest, at if submitted is None else max(submitted, at))


def hello(jobs: ExchangeJobs, expected: int, timeout_s: float, agent_job_alive: Callable[[], bool],
          why_ended: Callable[[], str] = lambda: "see the executors' logs", all_agents: Optional[int] = None,
          grace_s: float = 5.0, submitted: Optional[float] = None) -> Dict[int, AgentReport]:
    """Wait until ``expected`` distinct agents answer (they may still be loading their data); they become the
    roster's agents.  Elastic (``all_agents`` > ``expected``): once ``expected`` answered, wait ``grace_s`` more
    for the others (all of them: at once); those still not up are expected later (absent until they come).
    ``submitted``: when the agents' job was submitted, on the driver's clock (:func:`task_started_at`)."""
    seen: Dict[int, AgentReport] = {}
    deadline = time.time() + timeout_s
    attempt = 0
    enough_since: Optional[float] = None
    while len(seen) < (all_agents or expected):
        if len(seen) >= expected:
            enough_since = enough_since or time.time()
            if time.time() - enough_since >= grace_s:
                break
        if time.time() > deadline:
            raise RunFailedError(f"only {len(seen)} of {expected} agents came up within {timeout_s:.0f}s "
                                 f"(agents seen: {sorted(seen)}); check executor logs")
        if not agent_job_alive():
            raise RunFailedError(f"the agents' Spark job ended before all agents came up: {why_ended()}")
        # fewer agents than executors: some executor has none, so reach every executor at once and let the
        # tasks that find no agent give up soon, rather than waiting 10 s on an agent-less executor
        sparse = expected < jobs.executors
        wait = 2.0 if sparse or enough_since else max(2.0, min(HELLO_WAIT_S, deadline - time.time()))
        plan = jobs.plan(f"hello{attempt}", "hello", wait_for_agent_s=wait)
        res = _while_alive(lambda: jobs.run(plan, jobs.spread(expected, 1 if sparse else attempt), None,
                                            f"mpca: waiting for agents (attempt {attempt})"),
                           agent_job_alive, jobs.cancel)
        if res is None:
            raise RunFailedError(f"the agents' Spark job ended before all agents came up: {why_ended()}")
        received = time.time()
        for a, e in res.agents.items():
            if e.startup and "since_start_s" in e.startup:  # its task's start on the driver's clock
                e.startup["task_started_at"] = task_started_at(e.startup, received, submitted)
            if e.error:
                raise UserError(e.error) if e.user_error else RunFailedError(f"agent {a} failed: {e.error}")
            seen[a] = e
            jobs.roster.pids[a] = e.pid
        attempt += 1
    later = [a for a in range(all_agents or 0) if a not in seen]
    if later:
        log.info("elastic start with %d of %d agents; agents %s join when Spark finds their tasks room", len(seen),
                 all_agents, later)
    jobs.roster.reset(seen, later=later)
    return seen


def _while_alive(job: Callable, alive: Callable[[], bool], cancel: Callable[[], None], poll_s: float = 0.2):
    """``job()``'s result, run in a thread while ``alive()`` holds; None (the job cancelled) once it no longer does."""
    out: dict = {}

    def run():
        try:
            out["result"] = job()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, name="mpca-hello", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(poll_s)
        if thread.is_alive() and not alive():
            cancel()
            thread.join(30)
            return None
    if "error" in out:
        raise out["error"]
    return out["result"]


@dataclass
class HoldoutGathered:
    """What the agents handed over of their holdout rows so far (:func:`holdout`), kept across asks; a run's
    :class:`~mpca.runtime.run.AgentRun` holds one.  An agent's replacement loads the same partition and sets the
    same rows aside, so an answer once given stays true after its executor is lost — and in a run whose agents
    are killed again and again there may never be a moment when all of them are up to answer together."""

    max_rows: int
    hashes: Dict[int, np.ndarray] = field(default_factory=dict)  # agent -> its smallest hashes, once it had loaded
    rows: Dict[int, Tuple[int, Tuple[dict, bytes]]] = field(default_factory=dict)  # agent -> (cut-off, its answer)
    _cuts: Dict[Tuple[int, ...], Optional[int]] = field(default_factory=dict, repr=False)  # hashes never change

    def cut_off(self, agents: List[int]) -> Optional[int]:
        """The ``max_rows``-th smallest of the hashes that ``agents`` handed over (None: no row among them);
        sorted once per set of agents (the driver asks after every cycle until the holdout is in)."""
        from mpca.data.holdout import holdout_cut_off

        known = tuple(a for a in agents if a in self.hashes)
        if known not in self._cuts:
            self._cuts[known] = holdout_cut_off(np.concatenate([self.hashes[a] for a in known]) if known else [],
                                                self.max_rows)
        return self._cuts[known]

    def has_rows(self, agent: int, cut: Optional[int]) -> bool:
        return agent in self.rows and self.rows[agent][0] == cut

    def holders(self, agents: List[int]) -> List[int]:
        """Those of ``agents`` that handed over hashes and hold a row up to their cut-off."""
        cut = self.cut_off(agents)
        return [a for a in agents if a in self.hashes and len(self.hashes[a]) and self.hashes[a][0] <= cut]

    def owing(self, agents: List[int]) -> List[int]:
        """Those of ``agents`` whose hashes, or rows up to the cut-off of them all, are not in yet."""
        if any(a not in self.hashes for a in agents):
            return [a for a in agents if a not in self.hashes]
        cut = self.cut_off(agents)
        return [a for a in self.holders(agents) if not self.has_rows(a, cut)]

    def answers(self, agents: List[int]) -> List[Tuple[dict, bytes]]:
        """The rows kept of the holders among ``agents`` (each as it answered)."""
        return [self.rows[a][1] for a in self.holders(agents) if a in self.rows]


def holdout(jobs: ExchangeJobs, gathered: HoldoutGathered, wait_s: float = 0.0,
            loaded: Optional[Callable[[int], bool]] = None) -> Optional[List[Tuple[dict, bytes]]]:
    """The holdout rows the agents set aside as they loaded (:mod:`mpca.data.holdout`), in light jobs: each
    agent's ``max_rows`` smallest row hashes, then from each agent its rows up to the ``max_rows``-th smallest
    of all those — together the ``max_rows`` rows of smallest hash (more only where hashes tie); each holder's
    answer as (header, payload).  What an agent handed over is kept in ``gathered`` and never asked again.
    Only agents the roster counts present — and, where ``loaded`` is given, whose latest report says their rows
    are all in — are asked while ``wait_s`` is 0 (the driver asks after each cycle: no control job every cycle
    for an agent that is away or loading).  None while some agent still owes its rows, after ``wait_s`` of
    asking again (an agent's executor lost and its replacement not listening yet, or still loading)."""
    deadline = time.time() + wait_s
    agents = sorted(jobs.roster.agents)
    while True:
        ask = [a for a in gathered.owing(agents)
               if wait_s or (a not in jobs.roster.absent and (loaded is None or loaded(a)))]
        if ask and all(a in gathered.hashes for a in agents):
            _ask_rows(jobs, gathered, ask, gathered.cut_off(agents))
        elif ask:
            for a, (header, payload) in _ask_every_agent(jobs, ask, "holdout-hashes", {}).items():
                if not header.get("loading"):
                    gathered.hashes[a] = np.frombuffer(payload, dtype=np.int64)  # ascending
            if all(a in gathered.hashes for a in agents):
                continue  # every agent's hashes in: their rows at once
        if not gathered.owing(agents):
            return gathered.answers(agents)
        if time.time() >= deadline:
            return None
        time.sleep(0.2)


def partial_holdout(jobs: ExchangeJobs, gathered: HoldoutGathered) -> Tuple[List[Tuple[dict, bytes]], List[int]]:
    """At a run's end, where some agents never handed their holdout over (:func:`holdout` gave up): the rows of
    smallest hash among the agents that did, asked once more of those whose rows are not in at that cut-off,
    and the agents missing."""
    agents = sorted(jobs.roster.agents)
    missing = [a for a in agents if a not in gathered.hashes]
    known = [a for a in agents if a in gathered.hashes]
    cut = gathered.cut_off(known)
    ask = [a for a in gathered.holders(known) if not gathered.has_rows(a, cut)]
    if ask:
        _ask_rows(jobs, gathered, ask, cut)
    return gathered.answers(known), missing + [a for a in gathered.holders(known) if a not in gathered.rows]


def _ask_rows(jobs: ExchangeJobs, gathered: HoldoutGathered, agents: List[int], cut: Optional[int]) -> None:
    """Ask ``agents`` for their holdout rows up to ``cut``; keep each answer with the cut-off it was given for."""
    for a, answer in _ask_every_agent(jobs, agents, "holdout-rows", {"up_to": cut}).items():
        gathered.rows[a] = (cut, answer)


def _ask_every_agent(jobs: ExchangeJobs, agents: List[int], token: str, params: dict) -> Dict[int, Tuple[dict, bytes]]:
    """The answers to a "holdout" request with ``params`` of those of ``agents`` reached: a job, then more for
    those missed (an agent between executors is missing from it)."""
    got: Dict[int, Tuple[dict, bytes]] = {}
    for attempt in range(STOP_ATTEMPTS):
        left = tuple(a for a in agents if a not in got)
        if not left:
            break
        plan = jobs.plan(f"{token}{time.time()}-{attempt}", "holdout", only_agents=left, params=params)
        got.update(jobs.run(plan, jobs.spread(len(left), attempt), None, "mpca: the holdout rows").rows)
    missing = [a for a in agents if a not in got]
    if missing:
        log.warning("agents %s did not hand over their holdout rows (yet): asked again later", missing)
    return got


def status(jobs: ExchangeJobs) -> Dict[int, AgentReport]:
    """Steps and samples of every agent right now."""
    plan = jobs.plan(f"status{time.time()}", "hello")
    K = len(jobs.roster.agents)
    attempt = 0 if jobs.executors == K else 1  # extra executors: over-provision at once
    return jobs.run(plan, jobs.spread(K, attempt), None, "mpca: agent status").agents


def stop_agents(jobs: ExchangeJobs) -> Dict[int, AgentReport]:
    """Tell every agent to stop (best effort: the caller cancels the agents' job afterwards); their last reports."""
    stopped: Dict[int, AgentReport] = {}
    for attempt in range(STOP_ATTEMPTS):
        left = [a for a in jobs.roster.agents if a not in stopped]
        if not left:
            break
        try:
            res = jobs.run(jobs.plan(f"stop{attempt}", "stop"), jobs.spread(len(left), attempt), None,
                           "mpca: stopping agents")
        except Exception as e:  # noqa: BLE001 - best effort; the agent job is cancelled afterwards
            log.warning("stopping agents failed: %s", e)
            break
        stopped.update(res.agents)
    return stopped
