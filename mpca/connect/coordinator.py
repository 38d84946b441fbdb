"""A Spark Connect run's coordinator: the run's driver side, inside the cluster as one long-lived Spark task.

A Connect client (a Databricks notebook on standard or serverless compute, any ``sc://`` client) has no
SparkContext, and the executors may not reach it; so the driver side of the algorithm — the joint model, the
3-phase pipeline with its τ-weighted reductions (Eq. 9), the projection (Eqs. 4–5), the parameter service,
evaluation, checkpoints and the stop rules — runs here, as :meth:`mpca.trainer.Trainer.run_prepared` with the
agents reached through :class:`~mpca.runtime.relay.RelaySide`.  What the client needs back goes to the run's
directory (:mod:`mpca.runtime.rundir`): every history row as it comes, then the result and the final model;
the client's stop request and its heartbeat come the other way (a client that died stops the run, as Ctrl-C
would, after ``cluster.client_gone_s``).
"""
from __future__ import annotations

import io
import json
import logging
import math
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import pyarrow as pa

from mpca.config import Settings
from mpca.errors import UserError
from mpca.observers import RunObserver
from mpca.runtime.rundir import CLIENT, FAILED, MODEL, RESULT, STOP, RunDir, reachable_host

log = logging.getLogger("mpca.connect")

SUMMARY_SCHEMA = "summary string"
STOP_POLL_S = 0.5
NOTES_CAP = 200  # the coordinator's warnings a run passes on to its client; the rest stay in its executor's log


@dataclass
class CoordinatorJob:
    """What the client ships to the coordinator's task, inside its closure (as the agents' spec travels): the
    user's functions, the settings, the prepared run (:class:`mpca.trainer.Prepared`, without its DataFrame),
    the run's identity and directory."""

    model_fn: Callable
    loss_fn: Callable
    optimizer_fn: Callable
    settings: Settings
    prepared: Any
    run_id: str
    secret: bytes = field(repr=False)
    relay: str = ""
    max_payload: int = 0


def plain(value):
    """A history or timeline value as JSON keeps it: NaN and infinities as None, tensors and numpy scalars as
    numbers, dict keys as strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RowsToRunDir(RunObserver):
    """The coordinator's observer: each history row to the run directory, where the client reads it."""

    def __init__(self, rundir: RunDir, rows: int = 0):
        """``rows``: the rows already there (an earlier attempt's): the next one is numbered after them."""
        self.rundir = rundir
        self.rows = rows

    def __call__(self, row: Dict[str, Any]) -> None:
        self.rundir.write_row(self.rows, plain(row))
        self.rows += 1


class NotesToRunDir(logging.Handler):
    """The coordinator's warnings (mpca's log records at WARNING and above) as notes in the run directory, which
    the client logs as they come: a Connect user sees what a classic driver's log says (an agent that did not
    answer, one that left or came back, the coordinator started again). At most ``cap``, then one note that
    says so."""

    def __init__(self, rundir: RunDir, cap: int = NOTES_CAP):
        super().__init__(logging.WARNING)
        self.rundir, self.cap, self.sent = rundir, cap, 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.sent > self.cap:
            return
        try:
            if self.sent == self.cap:
                self.rundir.write_note("coordinator", logging.WARNING, f"more than {self.cap} warnings: the rest "
                                       "are only in the coordinator's executor log")
            else:
                self.rundir.write_note("coordinator", record.levelno, record.getMessage())
            self.sent += 1
        except Exception:  # noqa: BLE001 - logging must not fail the run
            self.handleError(record)


def _notes_handlers(rundir: RunDir) -> List[logging.Handler]:
    """mpca's warnings to the run directory's notes for the run's length — and still to the executor's stderr
    where nothing configured logging there (with a handler of its own, Python's last resort no longer prints
    them)."""
    mpca_log = logging.getLogger("mpca")
    handlers: List[logging.Handler] = [NotesToRunDir(rundir)]
    if not mpca_log.hasHandlers():
        handlers.append(logging.StreamHandler())
        handlers[-1].setLevel(logging.WARNING)
    for handler in handlers:
        mpca_log.addHandler(handler)
    return handlers


def _watch_client(rundir: RunDir, trainer, gone_s: float, done: threading.Event) -> None:
    """Stop the run after its current cycle once the client asks (``stop.json``), or once it has not said it is
    there (``client.json``) for ``gone_s``: a Connect server does not end the jobs of a client that died."""
    heard, last = None, time.monotonic()  # the client's last beat, on this host's clock (the client's may differ)
    while not done.wait(STOP_POLL_S):
        if rundir.read(STOP) is not None:
            trainer.request_stop()
            return
        beat = rundir.read(CLIENT)
        if beat is not None and beat.get("beat") != heard:
            heard, last = beat.get("beat"), time.monotonic()
        if time.monotonic() - last > gone_s:
            log.warning("no word from the client for %.0fs (cluster.client_gone_s): the run stops", gone_s)
            trainer.request_stop()
            return


def _attempt() -> int:
    """This task's attempt (0: its first; Spark retries a task whose executor or process was lost)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.attemptNumber() if tc is not None else 0


def _resumed(trainer, prep, attempt: int):
    """The prepared run of a coordinator started again: the model, the driver rule's state and the pending
    reduction of the last checkpoint in ``checkpoint.dir`` (none: the run's start) — the agents rejoin from it."""
    from dataclasses import replace

    ck = trainer.restore(prep.model, prep.specs) if trainer.settings.checkpoint.dir else None  # into prep.model
    log.warning("the coordinator's task was started again (attempt %d): it resumes from %s", attempt,
                f"the checkpoint of cycle {ck.cycle}" if ck else "the run's start (no checkpoint was written)")
    return replace(prep, checkpoint=ck or prep.checkpoint)


def coordinate(job: CoordinatorJob) -> Dict[str, Any]:
    """Run the coordinator; write the result (or the failure) to the run directory; return a short summary."""
    import torch

    from mpca.runtime.relay import RelaySide
    from mpca.runtime.run import AgentRun
    from mpca.trainer import Trainer

    rundir = RunDir(job.relay)
    prep, st = job.prepared, job.settings
    attempt = _attempt()
    if attempt > 0:  # Spark started this task again: its first attempt was lost (its executor, its process)
        st = st.model_copy(update={"checkpoint": st.checkpoint.model_copy(update={"resume": True})})
    trainer = Trainer(job.model_fn, job.loss_fn, job.optimizer_fn, st)
    if attempt > 0:
        prep = _resumed(trainer, prep, attempt)
    side = RelaySide(rundir, st, job.run_id, job.secret, job.max_payload,
                     st.cluster.service_host or reachable_host(), attempt)
    handlers = _notes_handlers(rundir)
    done = threading.Event()
    threading.Thread(target=_watch_client, args=(rundir, trainer, st.cluster.client_gone_s, done), daemon=True,
                     name="mpca-client-watch").start()
    try:
        result = trainer.run_prepared(prep, RowsToRunDir(rundir, rundir.row_count()), lambda: AgentRun(
            None, None, model=prep.model, model_fn=job.model_fn, loss_fn=job.loss_fn, optimizer_fn=job.optimizer_fn,
            settings=st, resume_from=prep.checkpoint, classes=prep.classes, holdout_on_agents=prep.on_agents,
            side=side))
    except BaseException as e:  # noqa: BLE001 - the client raises it, as fit would have
        user = isinstance(e, UserError)
        line = str(e) if user else f"{type(e).__name__}: {e}"
        rundir.write(FAILED, {"error": line, "user_error": user, "traceback": traceback.format_exc()})
        return {"failed": line}
    finally:
        done.set()
        for handler in handlers:
            logging.getLogger("mpca").removeHandler(handler)
    buf = io.BytesIO()
    torch.save(result.model.state_dict(), buf)
    rundir.store.write_atomic(MODEL, buf.getvalue())
    rundir.write(RESULT, plain({
        "cycles": result.cycles, "wall_s": result.wall_s, "stop_reason": result.stop_reason,
        "final": {"error": result.final.error, "loss": result.final.loss}, "run_id": result.run_id,
        "algorithm": result.algorithm, "layout": result.layout, "first_cycle": result.first_cycle,
        "counters": {"jobs": result.counters.jobs, "broadcasts": result.counters.broadcasts,
                     "job_group": result.counters.job_group, "service_bytes": result.counters.service_bytes},
        "agents_up_s": result.agents_up_s, "first_exchange_s": result.first_exchange_s,
        "first_exchange_job_end_s": result.first_exchange_job_end_s, "prepare_s": result.prepare_s,
        "startup": result.startup, "holdout_missing": result.holdout_missing, "history": result.history.to_dict("records"),
        "timeline": list(result.timeline.iter_rows()), "agents": result.agents, "written_at": time.time()}))
    return {"cycles": result.cycles, "stop_reason": result.stop_reason}


def coordinator_task(job: CoordinatorJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The coordinator's Spark task (``mapInArrow`` over one row): the run, then its summary as one row."""
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"summary": [json.dumps(coordinate(job), default=str)]})


__all__ = ["CoordinatorJob", "NotesToRunDir", "coordinate", "coordinator_task", "plain", "RowsToRunDir"]
