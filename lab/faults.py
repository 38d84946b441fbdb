"""Faults injected into a real run, and what they cost (a command; the tests use the same injection).

    python -m lab.faults [-c conf/digits.yaml] [--algorithms mpca,sync,diloco,easgd,downpour,ddp]
                         [--faults none,hang,kill-executor] [--target 0.05]

Each fault hits agent 1 once, ``--at-call`` forward passes into its training, from inside its own
process: ``hang`` stops the process (SIGSTOP) and a helper resumes it (SIGCONT) ``--hang-s`` later;
``kill-executor`` kills its executor's JVM (SIGKILL); ``none`` is the unfaulted reference.  Every algorithm
(``--algorithms``: one per family by default, ``all`` for every registered one, each at its defaults) runs
every fault; prints per run the time to ``--target`` and its ratio to the same algorithm's unfaulted run,
the final error, how many cycles ran without agent 1, the longest cycle, and when the agent was back
(answering again, or a replacement joined); ``--json`` keeps the rows.

The model_fn of :func:`faulty` runs on executors, which cannot import ``lab`` (they do not run in the
checkout): this module is pickled by value.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from typing import Callable, Optional

from pyspark import cloudpickle
from torch import nn

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import lab/
FAULTS = ("none", "hang", "kill-executor", "stop-executor")


class FaultyAgent(nn.Module):
    """``inner`` with a fault fired once, by the first process of agent 1 that gets ``marker`` (a file
    created atomically: a replacement of a killed agent, in any stage attempt, does not fire again), at its
    ``at_call``-th forward pass or, with ``after`` (a file path), at the first one past that once ``after``
    exists (so that a test can fire it only once the run's cycles are under way)."""

    def __init__(self, inner: nn.Module, fault: str, marker: str, agent: int = 1, at_call: int = 150,
                 hang_s: float = 8.0, after: Optional[str] = None):
        super().__init__()
        from pyspark import TaskContext

        self.inner = inner
        tc = TaskContext.get()
        self.armed = fault != "none" and tc is not None and tc.partitionId() == agent and _first(marker)
        self.fault, self.at_call, self.hang_s, self.calls, self.after = fault, at_call, hang_s, 0, after

    def forward(self, x):
        self.calls += 1
        if self.armed and self.calls >= self.at_call and (self.after is None or os.path.exists(self.after)):
            self.armed = False
            if self.fault == "hang":
                subprocess.Popen(["sh", "-c", f"sleep {self.hang_s}; kill -CONT {os.getpid()}"],
                                 start_new_session=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            elif self.fault == "kill-executor":
                os.kill(executor_jvm_pid(), signal.SIGKILL)
            elif self.fault == "stop-executor":  # its JVM frozen for hang_s, the agent trains on: as a link down
                jvm = executor_jvm_pid()
                subprocess.Popen(["sh", "-c", f"sleep {self.hang_s}; kill -CONT {jvm}"], start_new_session=True)
                os.kill(jvm, signal.SIGSTOP)
        return self.inner(x)


def _first(marker: str) -> bool:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def stat_fields(pid: int) -> list:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0: the state, 1: the parent, 19: the start
    in clock ticks after boot); FileNotFoundError when the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int:
    """The parent process of ``pid`` (from /proc; FileNotFoundError when it is gone)."""
    return int(stat_fields(pid)[1])


def executor_of(pid: int) -> Optional[int]:
    """The executor JVM above an agent's Python process ``pid`` (worker ← pyspark.daemon ← JVM), or None."""
    for _ in range(4):
        pid = parent_of(pid)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
    return None


def executor_jvm_pid() -> int:
    """The executor JVM above this Python worker."""
    pid = executor_of(os.getpid())
    if pid is None:
        raise RuntimeError("no executor JVM above this process")
    return pid


def _build(model_fn: Callable, fault: str, marker: str, at_call: int, hang_s: float,
           after: Optional[str] = None) -> nn.Module:
    return FaultyAgent(model_fn(), fault, marker, at_call=at_call, hang_s=hang_s, after=after)


def faulty(model_fn: Callable, fault: str, at_call: int = 150, hang_s: float = 8.0, marker: str = "",
           after: Optional[str] = None) -> Callable:
    """A picklable model_fn whose agent 1 injects ``fault`` once per ``marker`` (a fresh one by default)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    marker = marker or os.path.join(tempfile.gettempdir(), f"mpca-fault-{uuid.uuid4().hex}")
    return functools.partial(_build, model_fn, fault, marker, at_call, hang_s, after)


def recovery(fit, agent: int = 1) -> dict:
    """Cycles without ``agent``, the longest cycle, and seconds from its first absence to its return, over
    the cycles the timeline keeps in memory (its last ``training.timeline_window``: all of this bench's)."""
    cycles = fit.timeline.cycles
    without = [c for c in cycles if agent in c.missing]
    back = None
    if without:
        first = cycles.index(without[0])
        later = [c for c in cycles[first:] if agent in c.joined or (agent in c.agents and agent not in c.missing)]
        back = later[0].t_end - without[0].t_submit if later else math.nan
    return {"cycles_without": len(without), "longest_cycle_s": max(c.t_end - c.t_submit for c in cycles),
            "back_after_s": back}


FAMILIES = ("mpca", "sync", "diloco", "easgd", "downpour", "ddp")  # one per way of exchanging


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--algorithms", default=",".join(FAMILIES), help="comma-separated, or 'all'")
    ap.add_argument("--faults", default="none,hang,kill-executor", help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--max-seconds", type=float, default=75.0)
    ap.add_argument("--at-call", type=int, default=150)
    ap.add_argument("--hang-s", type=float, default=8.0)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    from mpca.algorithm import registry
    from mpca.bench.compare import time_to
    from mpca.config import load_config, settings_from
    from mpca.data.sources import job_dataframe
    from mpca.models import training_functions
    from mpca.report import write_json
    from mpca.runtime.cluster import session_for
    from mpca.trainer import Trainer

    cfg = load_config(args.config or ["conf/digits.yaml"], args.overrides)
    names = [n for n in registry.names() if n != "single"] if args.algorithms == "all" else args.algorithms.split(",")
    spark, _ = session_for(cfg.cluster, cfg.run.name)
    rows = []
    scratch = tempfile.TemporaryDirectory(prefix="mpca-faults-")  # each run's checkpoints: nothing left in the checkout
    try:
        for name in names:
            algorithm = cfg.algorithm if name == cfg.algorithm.name else {"name": name}
            for fault in args.faults.split(","):
                model_fn, loss_fn, optimizer_fn = training_functions(cfg.model, cfg.optimizer)
                settings = settings_from(cfg, algorithm=algorithm,
                                         cluster={**cfg.cluster.model_dump(), "master": "existing"},
                                         stop={"max_seconds": args.max_seconds}, progress="off",
                                         eval={"every_cycles": None, "every_seconds": 1.0},
                                         checkpoint={"dir": os.path.join(scratch.name, f"{name}-{fault}"),
                                                     "init_from": cfg.checkpoint.init_from})
                fit = Trainer(faulty(model_fn, fault, args.at_call, args.hang_s), loss_fn, optimizer_fn, settings,
                              spark=spark).fit(job_dataframe(spark, cfg.data))
                rows.append({"algorithm": name, "fault": fault, "time_to_target_s": time_to(fit.history, args.target),
                             "final_error": fit.final.error, **recovery(fit)})
                print(rows[-1], flush=True)
    finally:
        spark.stop()
        scratch.cleanup()
    if args.json:
        write_json(args.json, rows)
    print(table(rows, args.target))
    return 0


def table(rows, target: float) -> str:
    """One line per run: time to target and its ratio to the algorithm's unfaulted run, and the recovery."""
    ref = {r["algorithm"]: r["time_to_target_s"] for r in rows if r["fault"] == "none"}
    head = (f"{'algorithm':<10} {'fault':<14} {'t(' + format(100 * target, 'g') + '%) s':>9} {'× none':>7} "
            f"{'final %':>8} {'cycles w/o':>10} {'longest cycle s':>15} {'back after s':>12}")
    lines = [head]
    for r in rows:
        t, base = r["time_to_target_s"], ref.get(r["algorithm"])
        ratio = t / base if base and math.isfinite(base) and math.isfinite(t) else math.nan
        back = "-" if r["back_after_s"] is None else f"{r['back_after_s']:.1f}"
        lines.append(f"{r['algorithm']:<10} {r['fault']:<14} {t:>9.1f} {ratio:>7.2f} {100 * r['final_error']:>8.2f} "
                     f"{r['cycles_without']:>10} {r['longest_cycle_s']:>15.2f} {back:>12}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
