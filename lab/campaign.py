"""A fault campaign: one long run with faults injected again and again on a seeded schedule, and what each cost.

    python -m lab.campaign [-c conf/digits.yaml] [--algorithm mpca] [--minutes 10]
                           [--faults kill:4,stop:4,nan:4,corrupt:4,driver:1] [--gap-s 6:14] [--stop-s 6:15]
                           [--link 1gbit [--cut-s 5:60]] [--clock wall|up] [--seed 0] [--reference]
                           [--json OUT] [overrides…]
                           (with --link the kinds may add cut:W and decommission:W)

Unlike :mod:`lab.faults` (one fault per run, fired from inside agent 1), the faults come from outside, at times
drawn from ``--seed`` (:func:`schedule`; ``KIND:WEIGHT`` makes a kind that much likelier), on whichever agent the
draw names:

* ``kill``: SIGKILL of the agent's executor JVM (a replacement task starts on a new executor and joins);
* ``stop``: SIGSTOP of the agent's process for ``--stop-s`` seconds (longer than the bounded wait), then SIGCONT;
* ``nan``: the agent's next forward pass returns NaN (its loss is non-finite; it resets to the joint model);
* ``corrupt``: one broken connection to the agent's channel, a variant of :mod:`lab.bad_frames` drawn from the
  seed (junk or a stall without the secret; with it a truncated, malformed, oversized, wrong-sized or NaN frame);
* ``driver``: SIGKILL of the driver (its Python process and its JVM at once, as when its host dies); the campaign
  starts it again at once, as a job scheduler would, and it resumes from the newest checkpoint;
* ``cut`` (with ``--link``): the port of the agent's worker host on the emulated cluster's switch goes down for
  ``--cut-s`` seconds (nothing passes either way), then up again;
* ``decommission`` (with ``--link``): SIGPWR to the agent's Spark worker, Spark's graceful decommissioning (the
  workers and the application get ``spark.decommission.enabled``), as a spot instance's notice: the agent hands
  in its last contribution and leaves.  mpca does not bring a decommissioned agent back within a run, so these
  come only in the run's last quarter, at most K − 1 of them (one whose agent is being replaced is tried again
  each second for a minute); recovered once a cycle says the agent left.  :data:`REPLACE_AFTER_S` later the
  campaign plays the cluster manager: the decommissioned worker is stopped and a fresh one starts on its host
  (:meth:`lab.netcluster.NetCluster.replace_worker`), so a driver started again after it finds the cluster whole.

With ``--link RATE`` the campaign runs on an emulated cluster (:mod:`lab.netcluster`: network namespaces, one
worker host per agent, a standalone master; root), the drivers on its driver host; without it on
``local-cluster`` (``cluster.master`` of the config).  Every process is on this machine either way, where the
campaign can signal it.

The schedule's times are seconds since the campaign's start (``--clock wall``, the default: a recorded campaign
replays as it ran) or seconds during which some agent process was up (``--clock up``): then no fault falls into
the startup or a driver's resume, where nothing runs that it could hit, and a slow machine gets as many faults
into the run as a fast one (on CI's slowest machine the first agent came up 37 s in, and 22 of 33 faults fell
where none was up).

The driver runs as its own process (:mod:`lab.campaign_driver`, one *incarnation* per start) so that it can be
killed; its agents announce their processes (their pids, in the incarnation's directory) when their models are
built, so the campaign signals the current process of the agent it drew, a replacement included.  A fault is
*recovered* when a cycle submitted after it counted the agent's contribution again (weight > 0; a
parameter-service algorithm's agent: when it next called the service) — for ``driver``, when the resumed driver's
first cycle ended.  The table gives per kind the faults injected, recovered, and the
median and longest time to recovery.  Meanwhile a sampler records the driver's (Python and JVM) and every agent's
resident memory, open file descriptors and threads, the checkpoint directory's entries and the executor and
Python worker processes on this machine (an orphan of a killed driver would show there), every ``--sample-s``:
the table gives first, last and peak, so a leak per fault shows.  ``--reference`` runs the same length without
faults first and compares the final holdout errors.

The table also gives each figure's median over the run's second and last quarter (flat: their ratio near 1), and
Spark's storage memory in use over every block manager — its broadcast blocks — as the drivers saw it after each
cycle.

The model_fn wrapper runs on executors, which cannot import ``lab``: this module is pickled by value.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import glob
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pyspark import cloudpickle
from torch import nn

from lab import bad_frames
from lab.faults import executor_of, parent_of, stat_fields

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import lab/
KINDS = ("kill", "stop", "nan", "corrupt", "driver", "cut", "decommission")
DECOMMISSION_FROM = 0.75  # decommissions come in the run's last quarter: their agents leave the run for good
DECOMMISSION_RETRY_S = 60.0  # a decommission whose agent has no process is tried again each second this long
REPLACE_AFTER_S = 30.0  # a decommissioned worker is replaced by a fresh one on its host this long after its notice
DRIVER = -1  # the agent field of a driver fault
CLOCKS = ("wall", "up")  # a schedule's times: seconds since the start, or seconds during which some agent was up
UP_POLL_S = 0.1  # the up clock looks this often whether an agent process is up
ENDED = "the run had ended"  # the skip reason of a fault the run did not live to


@dataclass
class Fault:
    t: float  # seconds after the campaign's start (with the up clock: the schedule's time until it falls)
    kind: str
    agent: int  # DRIVER for a driver fault
    hold_s: float = 0.0  # stop: how long the process stays stopped; cut: how long the link stays down
    variant: str = ""  # corrupt: which broken message (lab.bad_frames.VARIANTS)
    injected_at: Optional[float] = None  # wall time it was injected (None: the agent had no process then)
    pid: Optional[int] = None
    incarnation: Optional[int] = None  # the driver's incarnation it hit
    outcome: Optional[str] = None  # corrupt: what the agent did with the message; cut, decommission: the host
    recovered_s: Optional[float] = None  # from injection to the end of the first cycle counting the agent again
    replacement_up_s: Optional[float] = None  # kill: from injection to its replacement executor's JVM starting
    cycles_after_up: Optional[int] = None  # kill: cycles that ended from then to its recovery, that one included
    agent_up_s: Optional[float] = None  # kill: from injection to its replacement agent's model being built
    cycles_after_agent_up: Optional[int] = None  # kill: cycles that ended from then to its recovery
    replaced_s: Optional[float] = None  # decommission: from injection to a fresh worker on its host being ALIVE
    skipped: Optional[str] = None  # not injected: why (its agent or the driver had no process then, ...)
    drawn_agent: Optional[int] = None  # the agent the schedule drew, where it had no process and ``agent`` took it
    up_t: Optional[float] = None  # the up clock: the schedule's time, in seconds with an agent up (``t``: when it fell)


def parse_kinds(text: str) -> Dict[str, float]:
    """``"kill:4,stop,driver:0.5"`` → {kind: weight} (weight 1 where none is given)."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        kind, _, weight = item.partition(":")
        out[kind] = float(weight) if weight else 1.0
    return out


def schedule(seed: int, duration_s: float, kinds: Union[Sequence[str], Mapping[str, float]], agents: int,
             gap_s: Tuple[float, float], stop_s: Tuple[float, float], start_s: float = 10.0,
             cut_s: Tuple[float, float] = (5.0, 60.0)) -> List[Fault]:
    """Faults from ``start_s`` to ``duration_s`` (exclusive), the gaps between them uniform in ``gap_s``, each of a
    kind drawn with ``kinds``' weights (a list: equal weights), on an agent drawn uniformly (none for ``driver``),
    a stop held for a time uniform in ``stop_s``, a link cut for one uniform in ``cut_s``, a corrupt message of a
    variant drawn uniformly; the same seed, the same schedule.  A decommissioned agent leaves the run for good, so
    ``decommission`` is drawn only in the run's last quarter (:data:`DECOMMISSION_FROM`), at most ``agents`` − 1
    times, each on an agent not drawn for one before."""
    weights = dict(kinds) if isinstance(kinds, Mapping) else {k: 1.0 for k in kinds}
    unknown = sorted(set(weights) - set(KINDS))
    if unknown or not weights or min(weights.values()) <= 0:
        raise ValueError(f"unknown fault kind(s) {unknown} or a weight ≤ 0; choose from {', '.join(KINDS)}")
    if not 0 < gap_s[0] <= gap_s[1] or not 0 <= stop_s[0] <= stop_s[1] or not 0 <= cut_s[0] <= cut_s[1]:
        raise ValueError(f"gaps {gap_s}, stop times {stop_s} and cut times {cut_s} must be ordered, gaps positive")
    rng = random.Random(seed)
    names = list(weights)
    out, t = [], start_s
    while True:
        t += rng.uniform(*gap_s)
        if t >= duration_s:
            return out
        gone = [f.agent for f in out if f.kind == "decommission"]
        allowed = [n for n in names if n != "decommission" or (t >= DECOMMISSION_FROM * duration_s
                                                               and len(gone) < agents - 1)]
        if not allowed:
            continue
        kind = rng.choices(allowed, [weights[n] for n in allowed])[0]
        if kind == "decommission":
            agent = rng.choice([a for a in range(agents) if a not in gone])
        else:
            agent = DRIVER if kind == "driver" else rng.randrange(agents)
        hold = round(rng.uniform(*{"stop": stop_s, "cut": cut_s}[kind]), 3) if kind in ("stop", "cut") else 0.0
        variant = rng.choice(bad_frames.VARIANTS) if kind == "corrupt" else ""
        out.append(Fault(round(t, 3), kind, agent, hold, variant))


def recovered_after(fault: Fault, cycles: Sequence[dict]) -> Optional[float]:
    """Seconds from ``fault``'s injection to the end of the first cycle submitted after it that counted the
    agent's contribution (weight > 0) — for a driver fault, that any agent's counted: the resumed driver's first
    useful cycle; None if none did (or it was never injected).  ``cycles``: the rows of the drivers' cycles
    (``t_submit``, ``t_end``, ``weight``: {agent: weight}), in order.

    A parameter-service algorithm's agents contribute by calling the driver's service, not in cycles (their
    weight is None): there, to the agent's first call after the fault (``calls``: {agent: when it last called}) —
    after the fault ended, for a stop or a cut (a request already on its way when the agent stopped or the link
    went down is not a recovery); for a driver fault, to any agent's first call to the resumed driver.

    A decommissioned agent does not come back: it has recovered once it left gracefully — to the end of the
    first cycle that says it left (``left``)."""
    if fault.injected_at is None:
        return None
    if fault.kind == "decommission":
        return next((c["t_end"] - fault.injected_at for c in cycles
                     if c["t_submit"] >= fault.injected_at and fault.agent in c.get("left", ())), None)
    since = fault.injected_at + (fault.hold_s if fault.kind in ("stop", "cut") else 0.0)
    for c in cycles:
        if c["t_submit"] < fault.injected_at:
            continue
        weights = c.get("weight") or {}
        w = max((v for v in weights.values() if v is not None), default=None) if fault.agent == DRIVER \
            else weights.get(fault.agent)
        if w is not None and w > 0:
            return c["t_end"] - fault.injected_at
        calls = [t for a, t in (c.get("calls") or {}).items() if fault.agent in (DRIVER, a) and t > since]
        if calls:
            return min(calls) - fault.injected_at
    return None


# --------------------------------------------------------------------------- inside the agents
class Announced(nn.Module):
    """``inner``, whose process writes ``<directory>/agent-<partition>`` (its pid; atomically replaced) when
    built — and appends its agent, pid and the time to ``<directory>/announced.jsonl`` — and whose next forward
    pass returns NaN once ``<directory>/nan-<partition>`` exists (it removes it)."""

    def __init__(self, inner: nn.Module, directory: str):
        super().__init__()
        from pyspark import TaskContext

        self.inner, self.directory = inner, directory
        tc = TaskContext.get()
        self.agent = tc.partitionId() if tc is not None else None
        if self.agent is not None:
            tmp = os.path.join(directory, f".agent-{self.agent}-{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(str(os.getpid()))
            os.replace(tmp, os.path.join(directory, f"agent-{self.agent}"))
            with open(os.path.join(directory, "announced.jsonl"), "a") as f:  # one short line: one write
                f.write(json.dumps({"agent": self.agent, "pid": os.getpid(), "t": time.time()}) + "\n")

    def forward(self, x):
        out = self.inner(x)
        if self.agent is not None:
            trigger = os.path.join(self.directory, f"nan-{self.agent}")
            if os.path.exists(trigger):
                try:
                    os.remove(trigger)
                except FileNotFoundError:
                    return out
                return out * float("nan")
        return out


def _build(model_fn: Callable, directory: str) -> nn.Module:
    return Announced(model_fn(), directory)


def announced(model_fn: Callable, directory: str) -> Callable:
    return functools.partial(_build, model_fn, directory)


# --------------------------------------------------------------------------- on the campaign's machine
def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def started_at(pid: int) -> Optional[float]:
    """When process ``pid`` started, wall-clock seconds, to 1/100 s (from /proc; None if it is gone)."""
    try:
        ticks = int(stat_fields(pid)[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def process_figures(pid: int) -> Optional[Dict[str, float]]:
    """Resident MB, open file descriptors and threads of ``pid`` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
                "threads": int(status["Threads"])}
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return None


def _processes():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                yield int(p), parent_of(int(p)), _cmdline(int(p))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue


def driver_jvm(driver: int) -> Optional[int]:
    """The JVM child of the driver process ``driver`` (the Spark driver's), or None."""
    return next((pid for pid, parent, cmd in _processes() if parent == driver and b"java" in cmd), None)


def spark_processes() -> Dict[str, int]:
    """Executor JVMs and PySpark daemon / worker processes on this machine (a killed driver's orphans count)."""
    executors = workers = 0
    for _, _, cmd in _processes():
        executors += b"CoarseGrainedExecutorBackend" in cmd
        workers += b"pyspark.daemon" in cmd or b"pyspark/daemon" in cmd
    return {"executor_jvms": executors, "pyspark_workers": workers}


@dataclass
class Campaign:
    """Injects ``faults`` into the driver and agents of the current incarnation and samples their resources; the
    drivers' files are under ``directory`` (:mod:`lab.campaign_driver`)."""

    directory: str
    faults: List[Fault]
    sample_s: float = 2.0
    samples: List[dict] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    incarnation: int = 0
    driver: Optional[subprocess.Popen] = None
    killed: set = field(default_factory=set)  # incarnations whose driver the campaign killed
    cluster: Any = None  # the emulated cluster (lab.netcluster.NetCluster) the drivers run in; None: this host
    cut_until: Dict[str, float] = field(default_factory=dict)  # host -> when its (latest) cut ends
    arrivals: List[dict] = field(default_factory=list)  # each agent process seen: agent, pid, its executor's start
    agents: int = 1  # K: a fault whose drawn agent has no process hits the next agent that has one
    now: Callable[[], float] = time.time  # the fault schedule's clock (a test gives its own)

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True once the run has ended (the fault schedule's sleep)."""
        return self.stopped.wait(seconds)

    def here(self, *parts: str) -> str:
        return os.path.join(self.directory, f"inc-{self.incarnation}", *parts)

    def agent_pid(self, agent: int) -> Optional[int]:
        if self.incarnation in self.killed:  # the driver is down: its agents are on their way out
            return None
        try:
            with open(self.here("agents", f"agent-{agent}")) as f:
                pid = int(f.read())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None

    def inject(self, fault: Fault) -> None:
        """Inject ``fault`` now; where it cannot be (its process is not up), leave it not injected and say why in
        ``fault.skipped``."""
        fault.incarnation = self.incarnation
        fault.skipped = self._inject(fault)
        if fault.skipped is not None:
            return
        fault.injected_at = time.time()
        print(f"[campaign] {fault.kind} " + ("driver" if fault.agent == DRIVER else f"agent {fault.agent}") +
              f" (pid {fault.pid}, incarnation {fault.incarnation})" +
              (f" for {fault.hold_s:.1f}s" if fault.kind in ("stop", "cut") else "") +
              (f": {fault.variant}" if fault.variant else ""), flush=True)

    def _inject(self, fault: Fault) -> Optional[str]:
        """Inject ``fault``: None, or why it could not be."""
        if fault.kind == "driver":
            proc = self.driver
            if proc is None or proc.poll() is not None or self.incarnation in self.killed:
                return "no driver process"
            jvm = driver_jvm(proc.pid)
            self.killed.add(self.incarnation)
            for pid in (proc.pid, jvm):  # the driver's host is gone: both at once, no shutdown hook runs
                if pid:
                    _signal(pid, signal.SIGKILL)
            fault.pid = proc.pid
        else:
            pid = self.agent_pid(fault.agent)
            if pid is None and fault.kind != "decommission":  # a replacement not up yet: the next agent up instead
                pid = self._hit_next_agent_up(fault)
            if pid is None:  # none up (the driver down, or a decommission's own agent not up): not injected
                return "no agent process"
            fault.pid = pid
            if fault.kind == "kill":
                jvm = executor_of(pid)
                if jvm is None:
                    return "no executor JVM"
                _signal(jvm, signal.SIGKILL)
            elif fault.kind == "stop":
                _signal(pid, signal.SIGSTOP)
                threading.Timer(fault.hold_s, lambda: _signal(pid, signal.SIGCONT)).start()
            elif fault.kind == "nan":
                open(self.here("agents", f"nan-{fault.agent}"), "w").close()
            elif fault.kind == "cut":
                host = self.cluster.host_of(pid) if self.cluster is not None else None
                if host is None or host == "driver":
                    return "no worker host"
                self.cut_until[host] = max(self.cut_until.get(host, 0.0), time.time() + fault.hold_s)
                self.cluster.set_link(host, False)
                fault.outcome = host
                threading.Timer(fault.hold_s, self._restore, args=(host,)).start()
            elif fault.kind == "decommission":  # SIGPWR to the agent's worker: Spark's graceful decommissioning
                jvm = executor_of(pid)
                worker = parent_of(jvm) if jvm else None
                if worker is None or b"deploy.worker.Worker" not in _cmdline(worker):  # local-cluster: in the driver
                    return "no worker process"
                _signal(worker, signal.SIGPWR)
                fault.outcome = self.cluster.host_of(worker) if self.cluster is not None else None
                if fault.outcome is not None:
                    threading.Timer(REPLACE_AFTER_S, self._replace_worker, args=(fault, time.time())).start()
            elif fault.kind == "corrupt":
                try:
                    with open(self.here("run.json")) as f:
                        run = json.load(f)
                except (FileNotFoundError, ValueError):
                    return "no run.json yet"
                path = os.path.join(f"/proc/{pid}/cwd", f"mpca-{run['run_id']}-agent-{fault.agent}.sock")
                threading.Thread(target=self._corrupt, args=(fault, path, run), daemon=True).start()
        return None

    def _hit_next_agent_up(self, fault: Fault) -> Optional[int]:
        """Where the drawn agent has no process (its replacement is starting), the fault goes to one of the agents
        that have one, drawn uniformly (a cluster's faults hit whatever runs; the draw is seeded by the fault
        itself, so a schedule replays the same), and ``drawn_agent`` keeps the first draw.  (Until 2026-12-03 it
        went to the next agent in order, which gave the agent after a down one twice the share for K > 2.)"""
        up = {a: self.agent_pid(a) for a in range(self.agents) if a != fault.agent}
        up = {a: pid for a, pid in up.items() if pid is not None}
        if not up:
            return None
        agent = random.Random(f"{fault.t}:{fault.kind}:{fault.agent}").choice(sorted(up))
        fault.drawn_agent, fault.agent = fault.agent, agent
        return up[agent]

    def _replace_worker(self, fault: Fault, noticed: float) -> None:
        """The cluster manager's side of a decommission: the worker stopped and a fresh one on its host."""
        if self.stopped.is_set():
            return
        try:
            self.cluster.replace_worker(fault.outcome)
        except Exception as e:  # noqa: BLE001 - reported; the run goes on with the cluster it has
            print(f"[campaign] could not replace the worker of {fault.outcome}: {e}", flush=True)
            return
        fault.replaced_s = time.time() - noticed
        print(f"[campaign] a fresh worker on {fault.outcome}, {fault.replaced_s:.1f}s after its decommission",
              flush=True)

    def _restore(self, host: str) -> None:
        """The link of ``host`` up again, unless a later cut of it still runs."""
        if time.time() >= self.cut_until.get(host, 0.0) - 0.05 and not self.stopped.is_set():
            self.cluster.set_link(host, True)

    def restore_links(self) -> None:
        for host in list(self.cut_until):
            self.cluster.set_link(host, True)

    @staticmethod
    def _corrupt(fault: Fault, path: str, run: dict) -> None:
        try:
            fault.outcome = bad_frames.send(fault.variant, path, bytes.fromhex(run["secret"]), run["shard0_bytes"])
        except (OSError, ConnectionError) as e:  # the agent went away meanwhile, or its socket did
            fault.outcome = f"not delivered: {e!r}"

    def any_agent_up(self) -> bool:
        return any(self.agent_pid(a) is not None for a in range(self.agents))

    def run_faults(self, t0: float, clock: str = "wall") -> None:
        """Inject the faults at their times: on the ``wall`` clock, ``fault.t`` seconds after ``t0``; on the ``up``
        clock, once some agent process has been up for ``fault.t`` seconds in all (the startup and a driver's
        resume, while nothing runs that a fault could hit, do not count), and ``fault.t`` becomes the time it fell
        (``up_t`` keeps the schedule's).  A fault the run did not live to is skipped as :data:`ENDED`."""
        up_s, last, was_up = 0.0, self.now(), False
        for i, fault in enumerate(self.faults):
            if clock == "wall":
                ended = self.wait(max(0.0, t0 + fault.t - self.now()))
            else:
                ended = False
                while up_s < fault.t and not ended:
                    ended = self.wait(min(UP_POLL_S, fault.t - up_s))
                    now, is_up = self.now(), self.any_agent_up()
                    if was_up and is_up:  # up at both ends of the poll: never early, late by a poll per start
                        up_s += now - last
                    last, was_up = now, is_up
                if not ended:
                    fault.up_t, fault.t = fault.t, round(self.now() - t0, 3)
            if ended:
                for left in self.faults[i:]:
                    left.skipped = ENDED
                return
            if fault.kind == "decommission":  # rare (at most K - 1): tried again while its agent is being replaced
                threading.Thread(target=self._until_injected, args=(fault,), daemon=True).start()
            else:
                self.inject(fault)

    def _until_injected(self, fault: Fault, within_s: float = DECOMMISSION_RETRY_S) -> None:
        """Inject ``fault``, again each second while its agent has no process, for at most ``within_s``."""
        deadline = time.time() + within_s
        while True:
            self.inject(fault)
            if fault.injected_at is not None or time.time() >= deadline or self.stopped.wait(1.0):
                return

    def sample(self, t0: float, agents: int) -> None:
        jvm: Dict[int, Optional[int]] = {}
        while not self.stopped.wait(self.sample_s):
            proc = self.driver
            if proc is not None and jvm.get(proc.pid) is None:  # until its JVM is up
                jvm[proc.pid] = driver_jvm(proc.pid)
            checkpoints = os.path.join(self.directory, "checkpoints")
            row = {"t": time.time() - t0, "incarnation": self.incarnation,
                   "driver": process_figures(proc.pid) if proc else None,
                   "driver_jvm": process_figures(jvm[proc.pid]) if proc and jvm.get(proc.pid) else None,
                   "checkpoint_entries": len(os.listdir(checkpoints)) if os.path.isdir(checkpoints) else 0,
                   **spark_processes()}
            for a in range(agents):
                pid = self.agent_pid(a)
                row[f"agent{a}"] = process_figures(pid) if pid else None
                if pid and all(seen["pid"] != pid for seen in self.arrivals):
                    self.arrivals.append({"agent": a, "pid": pid, "executor_started": self._executor_started(pid)})
            self.samples.append(row)

    @staticmethod
    def _executor_started(pid: int) -> Optional[float]:
        try:
            jvm = executor_of(pid)
        except FileNotFoundError:  # gone meanwhile
            return None
        return started_at(jvm) if jvm else None

    def drive(self, command: Callable[[int], List[str]], cwd: str) -> dict:
        """Start the driver (``command(incarnation)``), and again each time the campaign killed it, until one
        ends by itself: its final figures, or why the run failed."""
        while True:
            log_path = os.path.join(self.directory, f"driver-{self.incarnation}.log")
            with open(log_path, "w") as log:
                argv, out = command(self.incarnation), dict(stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
                self.driver = (subprocess.Popen(argv, **out) if self.cluster is None else  # on the driver's host
                               self.cluster.popen_in("driver", argv, env=self.cluster.command_env(), **out))
                try:
                    rc = self.driver.wait()
                except BaseException:  # the campaign itself interrupted: its driver must not outlive it
                    self.driver.terminate()
                    self.driver.wait(60)
                    raise
            final = os.path.join(self.directory, f"final-{self.incarnation}.json")
            if os.path.exists(final):
                with open(final) as f:
                    return json.load(f)
            if self.incarnation not in self.killed:
                with open(log_path) as f:
                    tail = f.read()[-2000:]
                return {"run_failed": f"driver incarnation {self.incarnation} exited with {rc}: {tail}"}
            self.incarnation += 1
            print(f"[campaign] driver incarnation {self.incarnation} starts (resumes from the newest checkpoint)",
                  flush=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def read_cycles(directory: str) -> List[dict]:
    """The drivers' cycle rows (``cycles.jsonl``), the agents' weights keyed by int, in order of submission."""
    path = os.path.join(directory, "cycles.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:  # a killed driver's last line, cut short (the next one starts a new line)
                continue
            row["weight"] = {int(a): w for a, w in row["weight"].items()}
            row["calls"] = {int(a): t for a, t in row.get("calls", {}).items()}
            rows.append(row)
    return sorted(rows, key=lambda r: r["t_submit"])


def redone(fault: Fault, cycles: Sequence[dict]) -> Optional[int]:
    """For a driver fault: the cycles the resumed driver ran again — the last cycle the latest driver that ended
    one ended before the kill, + 1, − the first cycle of the next driver that ran one (what was done after the
    newest checkpoint; a driver resumed from no checkpoint starts again at 0); None if none followed."""
    ended = [c for c in cycles if c["t_end"] <= fault.injected_at]
    latest = max((c["inc"] for c in ended), default=None)
    before = [c["cycle"] for c in ended if c["inc"] == latest]
    after = [c for c in cycles if c["t_submit"] >= fault.injected_at]
    if not after:
        return None
    first = min(c["cycle"] for c in after if c["inc"] == after[0]["inc"])
    return (max(before) + 1 if before else 0) - first


def announced_agents(directory: str, seen: Sequence[dict]) -> List[dict]:
    """Every agent process announced in the drivers' incarnations under ``directory`` (``inc-*/agents/
    announced.jsonl``: agent, pid, when its model was built), in time order, each with its executor JVM's start
    where the sampler saw the process (``seen``: agent, pid, executor_started)."""
    started = {a["pid"]: a.get("executor_started") for a in seen}
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "inc-*", "agents", "announced.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line cut short by a kill
                    continue
                out.append({"agent": row["agent"], "pid": row["pid"], "announced": row["t"],
                            "executor_started": started.get(row["pid"])})
    return sorted(out, key=lambda a: a["announced"])


def after_replacement(fault: Fault, arrivals: Sequence[dict], cycles: Sequence[dict]) -> Dict[str, Any]:
    """For a kill: its agent's replacement — the first process of that agent announced after the injection
    (:func:`announced_agents`) — its executor JVM's start and its own start (model built) in seconds from the
    injection, and the cycles that ended from each to the agent's recovery, the recovering one included (the
    target: ≤ 2 after the replacement executor is up); None where there is none."""
    out = dict(replacement_up_s=None, cycles_after_up=None, agent_up_s=None, cycles_after_agent_up=None)
    if fault.kind != "kill" or fault.injected_at is None:
        return out
    nxt = next((a for a in arrivals if a["agent"] == fault.agent and a["announced"] > fault.injected_at), None)
    if nxt is None:
        return out
    back = fault.injected_at + fault.recovered_s if fault.recovered_s is not None else None
    for key, at in (("replacement_up_s", nxt["executor_started"]), ("agent_up_s", nxt["announced"])):
        if at is None:
            continue
        out[key] = at - fault.injected_at
        if back is not None:
            n = sum(1 for c in cycles if at < c["t_end"] <= back + 1e-6)
            out["cycles_after_up" if key == "replacement_up_s" else "cycles_after_agent_up"] = n
    return out


def measure(faults: Sequence[Fault], cycles: Sequence[dict], arrivals: Sequence[dict]) -> None:
    """Each fault's recovery, and for a kill its replacement's timing, for a driver kill the cycles run again."""
    for f in faults:
        f.recovered_s = recovered_after(f, cycles)
        for key, value in after_replacement(f, arrivals, cycles).items():
            setattr(f, key, value)
        if f.kind == "driver" and f.injected_at is not None:
            n = redone(f, cycles)
            f.outcome = None if n is None else f"{n} cycles run again"


def summary(faults: Sequence[Fault]) -> List[dict]:
    """Per kind: scheduled, injected, recovered, median and longest recovery (s), and the median recovery after
    the fault itself ended (a stop's or cut's hold taken off; the same as the recovery for the other kinds)."""
    rows = []
    for kind in sorted({f.kind for f in faults}):
        of = [f for f in faults if f.kind == kind]
        times = [f.recovered_s for f in of if f.recovered_s is not None]
        after = [f.recovered_s - f.hold_s for f in of if f.recovered_s is not None]
        cycles_up = [f.cycles_after_up for f in of if f.cycles_after_up is not None]
        cycles_agent_up = [f.cycles_after_agent_up for f in of if f.cycles_after_agent_up is not None]
        rows.append({"kind": kind, "scheduled": len(of), "injected": sum(f.injected_at is not None for f in of),
                     "recovered": len(times), "median_s": statistics.median(times) if times else math.nan,
                     "max_s": max(times) if times else math.nan,
                     "median_after_s": statistics.median(after) if after else math.nan,
                     "median_cycles_after_up": statistics.median(cycles_up) if cycles_up else math.nan,
                     "median_cycles_after_agent_up": (statistics.median(cycles_agent_up) if cycles_agent_up
                                                      else math.nan)})
    return rows


def resource_table(samples: Sequence[dict]) -> List[dict]:
    """Per process (driver, driver JVM, each agent) and figure: first, last and peak over the run, and the medians
    of its second and last quarter (the target: flat within 10% between them); the checkpoint directory's
    entries, the Spark processes on the machine and Spark's storage memory in use likewise."""
    rows = []
    counts = ("checkpoint_entries", "executor_jvms", "pyspark_workers", "spark_storage_mb")
    names = {"checkpoint_entries": ("checkpoint dir", "entries"), "spark_storage_mb": ("spark blocks", "storage_mb")}
    keys = [k for k in (samples[0] if samples else {}) if k not in ("t", "incarnation") + counts]
    end = samples[-1]["t"] if samples else 0.0

    def row(process: str, figure: str, values: List[Tuple[float, float]]) -> dict:
        q2 = [v for t, v in values if end / 4 <= t < end / 2]
        q4 = [v for t, v in values if t >= 3 * end / 4]
        return {"process": process, "figure": figure, "first": values[0][1], "last": values[-1][1],
                "peak": max(v for _, v in values), "q2": statistics.median(q2) if q2 else math.nan,
                "q4": statistics.median(q4) if q4 else math.nan}

    for key in keys:
        for fig in ("rss_mb", "fds", "threads"):
            values = [(s["t"], s[key][fig]) for s in samples if s.get(key)]
            if values:
                rows.append(row(key, fig, values))
    for key in counts:
        values = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
        if values:
            rows.append(row(*names.get(key, ("machine", key)), values))
    return rows


def attach_storage(samples: Sequence[dict], cycles: Sequence[dict], t0: float) -> None:
    """Each sample's ``spark_storage_mb``: the storage memory in use at the newest cycle that ended before it
    (written by the driver of the time, :func:`lab.campaign_driver.storage_mb`); None before the first."""
    ended = sorted((c["t_end"] - t0, c["storage_mb"]) for c in cycles if "storage_mb" in c)
    i, latest = 0, None
    for s in samples:
        while i < len(ended) and ended[i][0] <= s["t"]:
            latest = ended[i][1]
            i += 1
        s["spark_storage_mb"] = latest


def _span(text: str) -> Tuple[float, float]:
    lo, _, hi = text.partition(":")
    return float(lo), float(hi or lo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--algorithm", default="mpca")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--faults", default="kill:4,stop:4,nan:4,corrupt:4,driver:1",
                    help="the kinds, KIND[:WEIGHT],… (" + ", ".join(KINDS) + ")")
    ap.add_argument("--gap-s", default="6:14", help="seconds between faults, LO:HI (uniform)")
    ap.add_argument("--stop-s", default="6:15", help="how long a stopped agent stays stopped, LO:HI")
    ap.add_argument("--cut-s", default="5:60", help="how long a cut link stays down, LO:HI")
    ap.add_argument("--link", default=None, help="run on an emulated cluster (lab.netcluster; root) with this "
                    "link rate per host, e.g. 1gbit: the cut fault needs it")
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="the schedule's times: seconds since the start (wall), or seconds during which some agent "
                    "process was up (up: no fault is spent on the startup or on a driver's resume, so a slow "
                    "machine gets as many as a fast one)")
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="first a run of the same length without faults")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", default=None, metavar="JSON", help="print the tables of a campaign's --json again "
                    "(recovery recomputed from its faults) and exit")
    ap.add_argument("--update", action="store_true", help="with --report: write the recomputed tables (summary, "
                    "outcomes, resources) back into the JSON; its faults and samples stay as measured")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            out = json.load(f)
        faults = [Fault(**f) for f in out["faults"]]
        if "cycle_rows" in out:  # kept from this version on: everything measured again from the drivers' lines
            cycles = [dict(c, weight={int(a): w for a, w in c["weight"].items()},
                           calls={int(a): t for a, t in c.get("calls", {}).items()}) for c in out["cycle_rows"]]
            measure(faults, cycles, out.get("arrivals", []))
            out["faults"] = [asdict(f) for f in faults]
        out.update(summary=summary(faults), outcomes=outcome_table(faults), resources=resource_table(out.get("samples", [])))  # a failed run kept none
        print(report(out))
        if args.update:
            _write(args.report + ".tmp", out)
            os.replace(args.report + ".tmp", args.report)
        return 0
    from mpca.config import load_config

    cfg = load_config(args.config or ["conf/digits.yaml"],  # a bad config: said here, not in the driver's log
                      [f"algorithm.name={args.algorithm}"] + args.overrides)
    agents = cfg.training.agents
    duration = 60.0 * args.minutes
    kinds = parse_kinds(args.faults)
    for kind in ("cut", "decommission"):
        if kind in kinds and args.link is None:
            print(f"error: the {kind} fault needs an emulated cluster: give --link (e.g. --link 1gbit)",
                  file=sys.stderr)
            return 2
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = {"algorithm": args.algorithm, "seed": args.seed, "minutes": args.minutes, "faults_weights": args.faults,
           "clock": args.clock}

    def command(directory: str, deadline: float, announce: bool) -> Callable[[int], List[str]]:
        return lambda inc: ([sys.executable, "-m", "lab.campaign_driver", "--dir", directory, "--incarnation",
                             str(inc), "--deadline", repr(deadline), "--algorithm", args.algorithm] +
                            [x for c in args.config for x in ("-c", os.path.abspath(c))] +
                            ([] if announce else ["--no-announce"]) +
                            (["--decommission"] if "decommission" in kinds else []) + args.overrides)

    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="mpca-campaign-"))
        cluster = None
        if args.link is not None:  # the drivers on its driver host, one worker host per agent
            from lab.netcluster import NetCluster
            from mpca.local_cluster import LocalCluster, parse_local_cluster

            local = parse_local_cluster(cfg.cluster.master) or LocalCluster(agents, 2, 1024)
            cluster = stack.enter_context(NetCluster(workers=agents, link=args.link, cores=local.cores,
                                                     memory_mb=local.memory_mb,
                                                     decommission="decommission" in kinds))
            out["cluster"] = cluster.describe()
            print(f"[campaign] {cluster.describe()}", flush=True)
        if args.reference:
            directory = os.path.join(scratch, "reference")
            os.makedirs(directory)
            ref = Campaign(directory, [], cluster=cluster).drive(command(directory, time.time() + duration, False),
                                                                 repo)
            if "run_failed" in ref:
                print(f"[campaign] the reference run failed: {ref['run_failed']}", flush=True)
                return 1
            out["reference_final_error"] = ref["final_error"]
            print(f"[campaign] reference (no faults): final error {ref['final_error']:.4f}", flush=True)
        directory = os.path.join(scratch, "faults")
        os.makedirs(directory)
        faults = schedule(args.seed, duration, kinds, agents, _span(args.gap_s), _span(args.stop_s),
                          cut_s=_span(args.cut_s))
        campaign = Campaign(directory, faults, args.sample_s, cluster=cluster, agents=agents)
        t0 = time.time()
        threads = [threading.Thread(target=campaign.run_faults, args=(t0, args.clock), daemon=True),
                   threading.Thread(target=campaign.sample, args=(t0, agents), daemon=True)]
        for th in threads:
            th.start()
        try:
            final = campaign.drive(command(directory, t0 + duration, True), repo)
        finally:
            campaign.stopped.set()
            for th in threads:
                th.join(5)
            if cluster is not None:
                campaign.restore_links()
        cycles = read_cycles(directory)
        attach_storage(campaign.samples, cycles, t0)
        arrivals = announced_agents(directory, campaign.arrivals)
        measure(faults, cycles, arrivals)
        out.update(faults=[asdict(f) for f in faults], incarnations=campaign.incarnation + 1, cycles=len(cycles),
                   arrivals=arrivals, cycle_rows=cycles)
        if "run_failed" in final:
            injected = sum(f.injected_at is not None for f in faults)
            print(f"[campaign] the run failed after {injected} faults ({time.time() - t0:.0f} s): "
                  f"{final['run_failed']}", flush=True)
            out.update(run_failed=final["run_failed"])
            _write(args.json, out)
            return 1
        out.update(final_error=final["final_error"], summary=summary(faults),
                   outcomes=outcome_table(faults), resources=resource_table(campaign.samples),
                   samples=campaign.samples)
    print(report(out))
    _write(args.json, out)
    return 0


def outcome_table(faults: Sequence[Fault]) -> List[dict]:
    """Per corrupt variant (and for the driver kills): how often, and what came of it."""
    rows: Dict[Tuple[str, str], int] = {}
    for f in faults:
        if f.injected_at is not None and f.kind in ("corrupt", "driver"):
            key = (f.variant or f.kind, f.outcome or "?")
            rows[key] = rows.get(key, 0) + 1
    return [{"fault": k, "outcome": o, "count": n} for (k, o), n in sorted(rows.items())]


def _write(path: Optional[str], out: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)


def report(out: dict) -> str:
    ending = (f"final holdout error {out['final_error']:.4f}" if out.get("final_error") is not None else
              "the run failed: " + (out.get("run_failed") or "").strip().splitlines()[-1][:200])
    lines = [f"{out['algorithm']}: {out['cycles']} cycles in {out['minutes']:g} min, {out['incarnations']} driver "
             f"incarnation(s), seed {out['seed']}, {out.get('clock', 'wall')} clock; {ending}" +
             (f" (no faults: {out['reference_final_error']:.4f})" if "reference_final_error" in out else ""),
             f"{'fault':<12} {'scheduled':>9} {'injected':>8} {'recovered':>9} {'median s':>9} {'longest s':>9} "
             f"{'median s after it ended':>23} {'median cycles after replacement executor | agent up':>52}"]
    for r in out["summary"]:
        lines.append(f"{r['kind']:<12} {r['scheduled']:>9} {r['injected']:>8} {r['recovered']:>9} "
                     f"{r['median_s']:>9.1f} {r['max_s']:>9.1f} {r['median_after_s']:>23.1f} "
                     f"{r.get('median_cycles_after_up', math.nan):>43.1f} | "
                     f"{r.get('median_cycles_after_agent_up', math.nan):>6.1f}")
    skipped = collections.Counter(f.get("skipped") for f in out["faults"] if f.get("injected_at") is None)
    if skipped:
        lines.append("not injected: " + ", ".join(f"{n} ({why or 'reason not kept'})"
                                                  for why, n in skipped.most_common()))
    moved = sum(1 for f in out["faults"] if f.get("drawn_agent") is not None and f.get("injected_at") is not None)
    if moved:
        lines.append(f"moved to the next agent up (the drawn one had no process): {moved}")
    start = replacement_start(out["faults"], out.get("cycle_rows", []))
    if start:
        lines.append("kill: a replacement took a median {to_agent_s:.1f} s ({to_agent_min_s:.1f}-{to_agent_max_s:.1f}) "
                     "from its executor's JVM to its model, then {to_recovery_s:.1f} s to its recovery; the median "
                     "cycle took {cycle_s:.2f} s".format(**start))
    lines.append(f"{'fault':<12} {'count':>5}  outcome")
    for r in out["outcomes"]:
        lines.append(f"{r['fault']:<12} {r['count']:>5}  {r['outcome'][:90]}")
    lines.append(f"{'process':<15} {'figure':<15} {'first':>8} {'last':>8} {'peak':>8} {'Q2 med':>8} {'Q4 med':>8} "
                 f"{'Q4/Q2':>6}")
    for r in out["resources"]:
        q2, q4 = r.get("q2", math.nan), r.get("q4", math.nan)
        ratio = q4 / q2 if q2 and not math.isnan(q2) and not math.isnan(q4) else math.nan
        lines.append(f"{r['process']:<15} {r['figure']:<15} {r['first']:>8.1f} {r['last']:>8.1f} {r['peak']:>8.1f} "
                     f"{q2:>8.1f} {q4:>8.1f} {ratio:>6.2f}")
    lines.append("peaks per driver incarnation: inc (s into the run) driver MB | JVM MB, threads, fds | checkpoint "
                 "entries | executor JVMs, PySpark processes on the machine")
    for r in incarnation_table(out.get("samples", [])):
        lines.append(f"{r['incarnation']:>3} ({r['from_s']:.0f}-{r['to_s']:.0f}) {r['driver_mb']} | {r['jvm_mb']}, "
                     f"{r['jvm_threads']}, {r['jvm_fds']} | {r['checkpoint_entries']} | {r['executor_jvms']}, "
                     f"{r['pyspark_workers']}")
    return "\n".join(lines)


def replacement_start(faults: Sequence[dict], cycle_rows: Sequence[dict]) -> Optional[Dict[str, float]]:
    """For the injected kills (a campaign's JSON faults): the medians of the replacement's start — from its
    executor's JVM to its model built (``agent_up_s - replacement_up_s``), then to the recovery — and of a cycle's
    duration; None where no kill had both times."""
    kills = [f for f in faults if f["kind"] == "kill" and f.get("replacement_up_s") is not None
             and f.get("agent_up_s") is not None]
    if not kills:
        return None
    to_agent = [f["agent_up_s"] - f["replacement_up_s"] for f in kills]
    to_recovery = [f["recovered_s"] - f["agent_up_s"] for f in kills if f.get("recovered_s") is not None]
    cycles = [c["t_end"] - c["t_submit"] for c in cycle_rows if c.get("t_end")]
    return dict(to_agent_s=statistics.median(to_agent), to_agent_min_s=min(to_agent), to_agent_max_s=max(to_agent),
                to_recovery_s=statistics.median(to_recovery) if to_recovery else math.nan,
                cycle_s=statistics.median(cycles) if cycles else math.nan)


def incarnation_table(samples: Sequence[dict]) -> List[dict]:
    """Per driver incarnation: its span and the peaks of the driver's and its JVM's figures, the checkpoint
    entries and the Spark processes on the machine (None where it was never sampled)."""
    rows = []
    for inc in sorted({s["incarnation"] for s in samples}):
        of = [s for s in samples if s["incarnation"] == inc]

        def peak(key: str, fig: Optional[str] = None):
            values = [s[key][fig] if fig else s[key] for s in of if s.get(key) is not None]
            return round(max(values)) if values else None

        rows.append({"incarnation": inc, "from_s": of[0]["t"], "to_s": of[-1]["t"], "driver_mb": peak("driver", "rss_mb"),
                     "jvm_mb": peak("driver_jvm", "rss_mb"), "jvm_threads": peak("driver_jvm", "threads"),
                     "jvm_fds": peak("driver_jvm", "fds"), "checkpoint_entries": peak("checkpoint_entries"),
                     "executor_jvms": peak("executor_jvms"), "pyspark_workers": peak("pyspark_workers")})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
