"""A fault campaign: one long run with faults injected again and again on a seeded schedule, and what each cost.

    python -m lab.campaign [-c conf/digits.yaml] [--algorithm mpca] [--minutes 10] [--faults kill,stop,nan]
                           [--gap-s 6:14] [--stop-s 6:15] [--seed 0] [--reference] [--json OUT] [overrides…]

Unlike :mod:`lab.faults` (one fault per run, fired from inside agent 1), the faults come from outside the agents,
at times drawn from ``--seed`` (:func:`schedule`), on whichever agent the draw names:

* ``kill``: SIGKILL of the agent's executor JVM (a replacement task starts on a new executor and joins);
* ``stop``: SIGSTOP of the agent's process for ``--stop-s`` seconds (longer than the bounded wait), then SIGCONT;
* ``nan``: the agent's next forward pass returns NaN (its loss is non-finite; it resets to the joint model).

Each agent's process announces itself (its pid, in a scratch directory) when its model is built, so the campaign
signals the current process of the agent it drew, a replacement included.  A fault is *recovered* when a cycle
submitted after it counted the agent's contribution again (weight > 0); the table gives per kind the faults
injected, recovered, and the median and longest time to recovery.  Meanwhile a sampler records the driver's and
every agent's resident memory, open file descriptors and threads, and the checkpoint directory's entries, every
``--sample-s``: the table gives first, last and peak, so a leak per fault shows.  ``--reference`` runs the same
length without faults first and compares the final holdout errors.

What it does not do yet (issue "A hundred faults in one run"): link cuts (needs the emulated cluster's network
namespaces), driver kill -9 with resume, corrupt messages on a channel, decommissioning; the emulated cluster.
It runs on ``local-cluster`` (all processes on this machine, where the campaign can signal them).

The model_fn wrapper runs on executors, which cannot import ``lab``: this module is pickled by value.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from pyspark import cloudpickle
from torch import nn

from lab.faults import executor_of

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import lab/
KINDS = ("kill", "stop", "nan")


@dataclass
class Fault:
    t: float  # seconds after the campaign's start
    kind: str
    agent: int
    hold_s: float = 0.0  # stop: how long the process stays stopped
    injected_at: Optional[float] = None  # wall time it was injected (None: the agent had no process then)
    pid: Optional[int] = None
    recovered_s: Optional[float] = None  # from injection to the end of the first cycle counting the agent again


def schedule(seed: int, duration_s: float, kinds: Sequence[str], agents: int, gap_s: Tuple[float, float],
             stop_s: Tuple[float, float], start_s: float = 10.0) -> List[Fault]:
    """Faults from ``start_s`` to ``duration_s`` (exclusive), the gaps between them uniform in ``gap_s``, each of a
    kind and on an agent drawn uniformly, a stop held for a time uniform in ``stop_s``; the same seed, the same
    schedule."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kind(s) {unknown}; choose from {', '.join(KINDS)}")
    if not 0 < gap_s[0] <= gap_s[1] or not 0 <= stop_s[0] <= stop_s[1]:
        raise ValueError(f"gaps {gap_s} and stop times {stop_s} must be ordered, gaps positive")
    rng = random.Random(seed)
    out, t = [], start_s
    while True:
        t += rng.uniform(*gap_s)
        if t >= duration_s:
            return out
        kind, agent = rng.choice(list(kinds)), rng.randrange(agents)
        out.append(Fault(round(t, 3), kind, agent, round(rng.uniform(*stop_s), 3) if kind == "stop" else 0.0))


def recovered_after(fault: Fault, cycles: Sequence[dict]) -> Optional[float]:
    """Seconds from ``fault``'s injection to the end of the first cycle submitted after it that counted the
    agent's contribution (weight > 0); None if none did (or it was never injected).  ``cycles``: the timeline's
    rows (``t_submit``, ``t_end``, ``weight``: {agent: weight}), in order."""
    if fault.injected_at is None:
        return None
    for c in cycles:
        w = (c.get("weight") or {}).get(fault.agent)
        if c["t_submit"] >= fault.injected_at and w is not None and w > 0:
            return c["t_end"] - fault.injected_at
    return None


# --------------------------------------------------------------------------- inside the agents
class Announced(nn.Module):
    """``inner``, whose process writes ``<directory>/agent-<partition>`` (its pid; atomically replaced) when
    built, and whose next forward pass returns NaN once ``<directory>/nan-<partition>`` exists (it removes it)."""

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


# --------------------------------------------------------------------------- on the driver's machine
def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def process_figures(pid: int) -> Optional[Dict[str, float]]:
    """Resident MB, open file descriptors and threads of ``pid`` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")),
                "threads": int(status["Threads"])}
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return None


def driver_jvm() -> Optional[int]:
    """This process's child JVM (the Spark driver's), or None."""
    me = os.getpid()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if _ppid(int(p)) == me:
                    with open(f"/proc/{p}/cmdline", "rb") as f:
                        if b"java" in f.read():
                            return int(p)
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    return None


@dataclass
class Campaign:
    directory: str  # where the agents announce themselves
    faults: List[Fault]
    checkpoint_dir: str
    sample_s: float = 2.0
    samples: List[dict] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    def agent_pid(self, agent: int) -> Optional[int]:
        try:
            with open(os.path.join(self.directory, f"agent-{agent}")) as f:
                pid = int(f.read())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None

    def inject(self, fault: Fault) -> None:
        pid = self.agent_pid(fault.agent)
        if pid is None:  # no process of that agent now (a replacement not up yet): not injected, said so
            return
        fault.pid = pid
        if fault.kind == "kill":
            jvm = executor_of(pid)
            if jvm is None:
                return
            os.kill(jvm, signal.SIGKILL)
        elif fault.kind == "stop":
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(fault.hold_s, lambda: _cont(pid)).start()
        elif fault.kind == "nan":
            open(os.path.join(self.directory, f"nan-{fault.agent}"), "w").close()
        fault.injected_at = time.time()
        print(f"[campaign] {fault.kind} agent {fault.agent} (pid {pid})" +
              (f" for {fault.hold_s:.1f}s" if fault.kind == "stop" else ""), flush=True)

    def run_faults(self, t0: float) -> None:
        for fault in self.faults:
            if self.stopped.wait(max(0.0, t0 + fault.t - time.time())):
                return
            self.inject(fault)

    def sample(self, t0: float, agents: int) -> None:
        jvm = driver_jvm()
        while not self.stopped.wait(self.sample_s):
            row = {"t": time.time() - t0, "driver": process_figures(os.getpid()),
                   "driver_jvm": process_figures(jvm) if jvm else None,
                   "checkpoint_entries": len(os.listdir(self.checkpoint_dir)) if os.path.isdir(self.checkpoint_dir)
                   else 0}
            for a in range(agents):
                pid = self.agent_pid(a)
                row[f"agent{a}"] = process_figures(pid) if pid else None
            self.samples.append(row)


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def summary(faults: Sequence[Fault]) -> List[dict]:
    """Per kind: scheduled, injected, recovered, median and longest recovery (s)."""
    rows = []
    for kind in sorted({f.kind for f in faults}):
        of = [f for f in faults if f.kind == kind]
        times = [f.recovered_s for f in of if f.recovered_s is not None]
        rows.append({"kind": kind, "scheduled": len(of), "injected": sum(f.injected_at is not None for f in of),
                     "recovered": len(times), "median_s": statistics.median(times) if times else math.nan,
                     "max_s": max(times) if times else math.nan})
    return rows


def resource_table(samples: Sequence[dict]) -> List[dict]:
    """Per process (driver, driver JVM, each agent) and figure: first, last and peak over the run."""
    rows = []
    keys = [k for k in (samples[0] if samples else {}) if k not in ("t", "checkpoint_entries")]
    for key in keys:
        for fig in ("rss_mb", "fds", "threads"):
            values = [s[key][fig] for s in samples if s.get(key)]
            if values:
                rows.append({"process": key, "figure": fig, "first": values[0], "last": values[-1],
                             "peak": max(values)})
    entries = [s["checkpoint_entries"] for s in samples]
    if entries:
        rows.append({"process": "checkpoint dir", "figure": "entries", "first": entries[0], "last": entries[-1],
                     "peak": max(entries)})
    return rows


def _span(text: str) -> Tuple[float, float]:
    lo, _, hi = text.partition(":")
    return float(lo), float(hi or lo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--algorithm", default="mpca")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--faults", default=",".join(KINDS))
    ap.add_argument("--gap-s", default="6:14", help="seconds between faults, LO:HI (uniform)")
    ap.add_argument("--stop-s", default="6:15", help="how long a stopped agent stays stopped, LO:HI")
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="first a run of the same length without faults")
    ap.add_argument("--json", default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from mpca.config import load_config, settings_from
    from mpca.data.sources import job_dataframe
    from mpca.errors import RunFailedError
    from mpca.models import training_functions
    from mpca.runtime.cluster import session_for
    from mpca.trainer import Trainer

    cfg = load_config(args.config or ["conf/digits.yaml"], args.overrides)
    algorithm = cfg.algorithm if args.algorithm == cfg.algorithm.name else {"name": args.algorithm}
    duration = 60.0 * args.minutes
    spark, _ = session_for(cfg.cluster, cfg.run.name)
    scratch = tempfile.TemporaryDirectory(prefix="mpca-campaign-")
    out = {"algorithm": args.algorithm, "seed": args.seed, "minutes": args.minutes}
    try:
        def fit(tag: str, model_fn: Callable):
            _, loss_fn, optimizer_fn = training_functions(cfg.model, cfg.optimizer)
            settings = settings_from(cfg, algorithm=algorithm,
                                     cluster={**cfg.cluster.model_dump(), "master": "existing"},
                                     stop={"max_seconds": duration, "target_error": None, "max_cycles": None},
                                     progress="off", eval={"every_cycles": None, "every_seconds": 5.0},
                                     training={**cfg.training.model_dump(), "timeline_window": 100000},
                                     checkpoint={"dir": os.path.join(scratch.name, f"checkpoints-{tag}")})
            return Trainer(model_fn, loss_fn, optimizer_fn, settings, spark=spark).fit(job_dataframe(spark, cfg.data))

        model_fn = training_functions(cfg.model, cfg.optimizer)[0]
        if args.reference:
            ref = fit("reference", model_fn)
            out["reference_final_error"] = ref.final.error
            print(f"[campaign] reference (no faults): final error {ref.final.error:.4f}", flush=True)
        directory = os.path.join(scratch.name, "agents")
        os.makedirs(directory)
        faults = schedule(args.seed, duration, args.faults.split(","), cfg.training.agents, _span(args.gap_s),
                          _span(args.stop_s))
        campaign = Campaign(directory, faults, os.path.join(scratch.name, "checkpoints-faults"), args.sample_s)
        t0 = time.time()
        threads = [threading.Thread(target=campaign.run_faults, args=(t0,), daemon=True),
                   threading.Thread(target=campaign.sample, args=(t0, cfg.training.agents), daemon=True)]
        for th in threads:
            th.start()
        try:
            result = fit("faults", announced(model_fn, directory))
        except RunFailedError as e:  # what the campaign found: the faults up to then, and why the run ended
            injected = [asdict(f) for f in faults if f.injected_at is not None]
            print(f"[campaign] the run failed after {len(injected)} faults "
                  f"({time.time() - t0:.0f} s): {e}", flush=True)
            out.update(run_failed=str(e), faults=injected)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1, default=str)
            return 1
        finally:
            campaign.stopped.set()
            for th in threads:
                th.join(5)
        cycles = result.timeline.to_pandas().to_dict("records")
        for f in faults:
            f.recovered_s = recovered_after(f, cycles)
        out.update(final_error=result.final.error, cycles=len(cycles), faults=[asdict(f) for f in faults],
                   summary=summary(faults), resources=resource_table(campaign.samples), samples=campaign.samples)
    finally:
        spark.stop()
        scratch.cleanup()
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


def report(out: dict) -> str:
    lines = [f"{out['algorithm']}: {out['cycles']} cycles in {out['minutes']:g} min, seed {out['seed']}; final "
             f"holdout error {out['final_error']:.4f}" +
             (f" (no faults: {out['reference_final_error']:.4f})" if "reference_final_error" in out else ""),
             f"{'fault':<6} {'scheduled':>9} {'injected':>8} {'recovered':>9} {'median s':>9} {'longest s':>9}"]
    for r in out["summary"]:
        lines.append(f"{r['kind']:<6} {r['scheduled']:>9} {r['injected']:>8} {r['recovered']:>9} "
                     f"{r['median_s']:>9.1f} {r['max_s']:>9.1f}")
    lines.append(f"{'process':<15} {'figure':<8} {'first':>8} {'last':>8} {'peak':>8}")
    for r in out["resources"]:
        lines.append(f"{r['process']:<15} {r['figure']:<8} {r['first']:>8.1f} {r['last']:>8.1f} {r['peak']:>8.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
