"""One run of K agents and the driver's side of their algorithm: start, cycles, stop — used by the Trainer
and by the benchmarks.

:class:`AgentRun` is the boundary between the Trainer and the running agents: the Trainer starts it (a
context manager), runs its cycles, reads the joint model, the agents' latest reports, the driver rule's
metrics, a checkpoint's state and the run's counters — through the methods below, nothing else."""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from mpca.algorithm import DriverRule
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.checkpoint import Checkpoint
from mpca.config import Settings
from mpca.data.checks import label_skew
from mpca.data.split import holdout_cut
from mpca.errors import RunFailedError
from mpca.exchange.schedule import ExchangeEvent
from mpca.runtime import control, initial
from mpca.runtime.agent import AgentSpec
from mpca.runtime.driver_service import DriverService
from mpca.runtime.pipeline import ExchangePipeline
from mpca.runtime.reports import AgentReport, RunCounters
from mpca.runtime.roster import AgentRoster
from mpca.runtime.spark_side import SparkSide
from mpca.runtime.timeline import Timeline

log = logging.getLogger("mpca.run")


def payload_limit(layout, rule: DriverRule) -> int:
    """The largest message on a run's channels: the model or a replacement's join payload, and a header."""
    model_bytes = sum(layout.shard_nbytes(s) for s in range(layout.num_shards))
    join_bytes = rule.join_payload().numel() * layout.wire_dtype.itemsize  # the model and join state
    return max(model_bytes, join_bytes) + 4096


def agent_spec(run_id: str, secret: bytes, settings: Settings, model: torch.nn.Module, fns: tuple, layout,
               max_payload: int, classes: Optional[int], holdout_on_agents: bool, *,
               service: Optional[Tuple[str, int]] = None, rendezvous: Optional[Dict[str, Any]] = None,
               relay: Optional[str] = None) -> AgentSpec:
    """What every agent of a run is shipped (:class:`~mpca.runtime.agent.AgentSpec`): the run's identity, the
    user's functions ``fns`` (model, loss, optimizer), the layout, the initial model (its seed where the
    executors rebuild it) and the settings' sections; ``relay``: a Spark Connect run's directory, where its
    agents announce themselves and find the coordinator's services (then ``service`` and ``rendezvous`` are
    read there)."""
    algo = settings.algorithm
    model_fn, loss_fn, optimizer_fn = fns
    return AgentSpec(run_id=run_id, secret=secret, model_fn=model_fn, loss_fn=loss_fn, optimizer_fn=optimizer_fn,
                     layout=layout, initial=initial.for_agents(model, model_fn, settings.seed,
                                                               algo.rebuilds_initial_model),
                     algorithm=algo, training=settings.training, emulation=settings.emulation, data=settings.data,
                     wire=settings.wire,
                     seed=settings.seed, max_payload=max_payload, service=service, rendezvous=dict(rendezvous or {}),
                     classes=classes, relay=relay,
                     holdout=(holdout_cut(settings.data.holdout), settings.data.holdout_max_rows)
                     if holdout_on_agents else None)


class AgentRun:
    """Context manager: on enter the agents are up and have answered; on exit they are stopped, their Spark
    job has ended (cancelled if it would not end by itself) and the parameter service is closed."""

    def __init__(self, spark, train_df, *, model: torch.nn.Module, model_fn, loss_fn, optimizer_fn,
                 settings: Settings, resume_from: Optional[Checkpoint] = None,
                 classes: Optional[int] = None, holdout_on_agents: bool = False, side=None):
        """``resume_from``: the checkpoint a resumed run goes on from (its driver rule's state, the reduction it had
        received but not staged, its wire residuals, its last cycles' durations); ``model`` already holds its joint
        model.  ``holdout_on_agents``: ``train_df`` holds every row with its hash
        (:func:`mpca.data.holdout.with_row_hash`), the agents set the holdout rows aside and :meth:`holdout_rows`
        collects them.  ``side``: what drives the agents (default: this classic session's driver,
        :class:`~mpca.runtime.spark_side.SparkSide`; a Spark Connect run's coordinator passes its
        :class:`~mpca.runtime.relay.RelaySide`, whose agents the client started, and ``spark`` and ``train_df``
        are None)."""
        self.side = side = side if side is not None else SparkSide(spark, settings)
        self.settings = settings
        algo, training = settings.algorithm, settings.training
        self.agents = training.agents
        self.layout = algo.shard_layout(model)
        self.bound = self.layout.bind_module(model, algo.buffers)
        self.rule = algo.driver_rule([self.bound.read(s) for s in range(self.layout.num_shards)], self.agents)
        if resume_from is not None:
            self.rule.load_state_dict(resume_from.driver_state)
        self.run_id, secret = side.identity()
        max_payload = payload_limit(self.layout, self.rule)
        host = side.host()
        self.codec = Codec.of(settings.wire.resolved(algo), settings.wire.block, self.layout.wire_dtype)
        self.service = None  # the parameter service; for the other algorithms only where executors may be decommissioned
        serves = algo.exchange == "service"
        if serves or side.decommission_enabled():
            self.service = DriverService(self.rule, secret, self.codec, max_payload, host,
                                         settings.cluster.service_port, self.agents, serves=serves)
        rendezvous = self.rule.rendezvous(host, settings.cluster.service_port)
        self.spec = agent_spec(self.run_id, secret, settings, model, (model_fn, loss_fn, optimizer_fn), self.layout,
                               max_payload, classes, holdout_on_agents,
                               service=self.service.address if self.service else None, rendezvous=rendezvous)
        if side.relay_dir is not None:  # the client started the agents: they find the services here
            side.publish(service=self.service.address if self.service else None, rendezvous=rendezvous)
        else:
            log.info("the initial model reaches the agents %s", f"as its weights "
                     f"({sum(self.layout.shard_nbytes(s) for s in range(self.layout.num_shards)) / 1e6:.1f} MB "
                     f"in each agent's task)" if self.spec.initial.shipped else
                     f"as its seed ({settings.seed}): each rebuilds it")
        self.job = side.agent_job(self.run_id)
        self.timeline = Timeline(training.timeline_window)  # the last cycles in memory, the rest on disk
        roster = AgentRoster(range(self.agents), settings.cluster.agent_wait_s, training.min_agents,
                             settings.cluster.agent_lost_timeout_s)
        # a resumed driver's cycle deadline holds from its first cycle
        roster.resume_cycles(resume_from.cycle_times if resume_from else None)
        self.pipeline = ExchangePipeline(side.exchange_jobs(self.run_id, secret, roster, self.codec),
                                         side.broadcasts(self.codec), self.rule, algo, self.timeline,
                                         observe=self.service.observe if serves else None,
                                         silent=self.service.silent if serves else None,
                                         split_tasks=side.split_tasks(), exchange_jobs=settings.cluster.exchange_jobs,
                                         cycle_deadline_s=settings.cluster.cycle_deadline_s)
        self.pipeline.restore_pending(resume_from.pending if resume_from else None)
        self._restore_wire(resume_from.wire if resume_from else None)
        self._train_df = train_df
        self.stopped: Dict[int, AgentReport] = {}
        self.agent_info: Dict[int, AgentReport] = {}
        self._decommission_checked = 0.0
        self._present = self.agents  # the count the driver rule was last told (built with K)
        self._holdout = control.HoldoutGathered(settings.data.holdout_max_rows)  # what the agents handed over

    def __enter__(self) -> "AgentRun":
        t0 = time.time()
        data = self.settings.data
        self.job.start(self._train_df, self.agents, self.spec, data.features, data.label, shuffle=data.shuffle)
        try:
            training = self.settings.training
            self.agent_info = control.hello(self.pipeline.jobs, training.start_agents,
                                            self.settings.cluster.agent_start_timeout_s, self.job.alive,
                                            self.job.failure, all_agents=self.agents if training.elastic else None,
                                            submitted=t0)
        except RunFailedError as e:
            self.__exit__(None, None, None)
            raise RunFailedError(f"{e}{self.side.start_hint}") from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        if self.side.resumed:  # a coordinator started again: every agent takes its joint model before it counts
            self.pipeline.roster.pids = {a: -1 for a in self.pipeline.roster.agents}
            log.warning("agents %s rejoin from the joint model of the restarted coordinator",
                        sorted(self.pipeline.roster.agents))
        skew = label_skew({a: r.labels for a, r in self.agent_info.items()})
        if skew:
            log.warning(skew)
        other = sorted(a for a, r in self.agent_info.items() if r.initial_model == "joined")
        if other:
            log.warning("agents %s built other initial weights from the seed than the driver did (another torch "
                        "version or CPU kind on their executors, or a model_fn that draws from its own random "
                        "state): they take the driver's model before they train", other)
        log.info("%d agents up after %.1fs (%s, algorithm %s)", len(self.agent_info), time.time() - t0,
                 self.layout.describe(), self.settings.algorithm.name)
        return self

    def _loaded(self, agent: int) -> bool:
        """Whether ``agent`` has all of its rows, by its latest report (they arrive while it trains)."""
        latest = self.pipeline.last_agent_reports.get(agent) or self.agent_info.get(agent)
        return latest is None or latest.loading is False

    def holdout_rows(self, wait_s: float = 0.0, partial: bool = False
                     ) -> Optional[Tuple[torch.Tensor, torch.Tensor, List[int]]]:
        """The holdout rows the agents set aside (``holdout_on_agents``), as the driver scores on them: the
        ``data.holdout_max_rows`` of smallest row hash, in hash order — features and labels (integer labels as
        int64, others float32), as :func:`mpca.data.checks.tensors` gives a collected holdout — and the agents
        whose rows are missing (none, unless ``partial``).  Each agent is asked once it reports all its rows in,
        and what it handed over is kept (:class:`~mpca.runtime.control.HoldoutGathered`).  None while some
        agent's rows are still owed, after ``wait_s`` of asking again; with ``partial``, then the rows of the
        agents that handed theirs over, and the others named."""
        from mpca.data.holdout import decode_rows

        data, missing = self.settings.data, []
        parts = control.holdout(self.pipeline.jobs, self._holdout, wait_s, None if wait_s else self._loaded)
        if parts is None and partial:
            parts, missing = control.partial_holdout(self.pipeline.jobs, self._holdout)
        if parts is None:
            return None
        x, y, _ = decode_rows(parts, data.holdout_max_rows, data.input_shape)  # labels int64 or float32 already
        return torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y)), missing

    def startup_phases(self, t0: float) -> Dict[int, Dict[str, float]]:
        """Per agent, on the run's clock (``t0`` its 0): when its Spark task started (its executor's clock, kept
        within what the driver's allows: :func:`mpca.runtime.control.task_started_at`), how long it read its data
        and how long it built its model and channels."""
        out = {}
        for a, r in self.agent_info.items():
            s = r.startup or {}
            if "task_started_at" in s:
                out[a] = {"task_started_s": s["task_started_at"] - t0, "data_s": s["data_s"], "build_s": s["build_s"]}
        return out

    def cycle(self, c: int):
        if not self.job.alive():
            raise RunFailedError(f"the agents' Spark job ended unexpectedly: {self.job.failure()}")
        if self.pipeline.roster.absent:  # executors come and go: the exchange tasks must reach new ones too
            self.pipeline.jobs.executors = self.side.executor_count()
        rec = self.pipeline.cycle(c)
        self._decommissioned(rec)
        present, _ = self.membership()
        if present and present != self._present:  # settings that follow K follow the agents present (none: keep)
            self._present = present
            self.rule.on_membership(present)
        return rec

    def _decommissioned(self, rec) -> None:
        """Agents on executors being decommissioned leave gracefully (Spark's scheduler says which, asked once a
        second): each is asked to leave — by the parameter service's next answer, or, for the driver-initiated
        algorithms, whose exchange tasks can no longer reach a decommissioning executor, by the driver's service
        the agent polls — it hands in its last contribution and says so, and the run goes on without waiting for
        it (cycle algorithms stop waiting at once; a handed-in shard joins that shard's next reduction)."""
        if self.service is None:
            return
        roster = self.pipeline.roster
        if time.time() - self._decommission_checked >= 1.0:
            self._decommission_checked = time.time()
            executors = {a: r.executor for a, r in self.pipeline.last_agent_reports.items()
                         if a in roster.agents and a not in self.service.leaving and r.executor}
            decommissioning = self.side.decommissioning(set(executors.values()))
            going = sorted(a for a, e in executors.items() if e in decommissioning)
            if going:
                log.warning("agents %s: their executors are being decommissioned; they leave after handing in their "
                            "last contribution", going)
                self.service.ask_to_leave(going)
                if not self.service.serves:
                    roster.remove(going)  # no exchange task reaches them now: no cycle waits for them
        for agent, shard, contribution, extra in self.service.take_handed_in():
            self.pipeline.hand_in(agent, shard, contribution, extra)
        done = self.service.take_left()
        if done:
            roster.remove(done)
            rec.left = done
            log.warning("agents %s left the run (%d agents go on)", done, len(roster.agents))

    def membership(self) -> Tuple[int, int]:
        """(agents present, agents the run has now): not counting those missing from the latest cycle, nor
        those that left."""
        roster = self.pipeline.roster
        latest = self.timeline.cycles[-1].missing if self.timeline.cycles else []
        return len(roster.agents) - len([a for a in latest if a in roster.agents]), len(roster.agents)

    def agent_status(self) -> Dict[int, AgentReport]:
        """Steps and samples of every agent right now (a light control job, no shard moves)."""
        return control.status(self.pipeline.jobs)

    def joint_vectors(self) -> List[torch.Tensor]:
        """A consistent copy of the joint model, one vector per shard."""
        return self.rule.joint_vectors()

    def latest_reports(self) -> Dict[int, AgentReport]:
        """Every agent's latest answer (from the cycles' jobs, or the parameter service's requests)."""
        return self.pipeline.last_agent_reports

    def metrics(self) -> Dict[str, float]:
        """The algorithm's own figures since the last call (:meth:`mpca.algorithm.DriverRule.metrics`)."""
        return self.rule.metrics()

    def checkpoint_state(self) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
        """What a checkpoint needs besides the joint model: the driver rule's state and the reduction received
        but not staged yet (the 3-phase pipeline's)."""
        return self.rule.state_dict(), self.pipeline.pending_state()

    def _senders(self) -> Dict[str, ErrorFeedback]:
        """The driver's lossy streams: the broadcast projections (per shard) and the service's answers (per
        agent).  The agents' own residuals are not the driver's to keep: a resumed run starts new agents from
        the joint model, and what an old agent's last message lost belonged to a local model that is gone."""
        senders = {"broadcast": self.pipeline.broadcasts.feedback}
        if self.service is not None:
            senders["service"] = self.service.feedback
        return senders

    def cycle_times(self) -> List[float]:
        """The last cycles' durations, for a checkpoint: the resumed driver's cycle deadline and bounded wait hold
        from its first cycle (:meth:`~mpca.exchange.presence.PresenceBook.resume_cycles`)."""
        return self.pipeline.roster.recent_cycles_s()

    def wire_state(self) -> Optional[Dict[str, Any]]:
        """The driver's error-feedback residuals for a checkpoint (None with fp32: nothing is lost): a resumed
        run's next message of each stream carries what the last one before the checkpoint lost."""
        if not self.codec.lossy:
            return None
        state: Dict[str, Any] = {"format": self.codec.fmt, "block": self.codec.block}
        for name, sender in self._senders().items():
            state[name] = {k: torch.from_numpy(v) for k, v in sender.state_dict()["residual"].items()}
        return state

    def _restore_wire(self, state: Optional[Dict[str, Any]]) -> None:
        if not state or not self.codec.lossy:
            return
        if (state.get("format"), state.get("block")) != (self.codec.fmt, self.codec.block):
            log.info("resume: the checkpoint's wire residuals are of %s (block %s), this run sends %s (block %d): "
                     "not used", state.get("format"), state.get("block"), self.codec.fmt, self.codec.block)
            return
        restored = 0
        for name, sender in self._senders().items():
            residual = {k: v.numpy() for k, v in state.get(name, {}).items()}
            sender.load_state_dict({"residual": residual})
            restored += len(residual)
        log.info("resume: the driver's %s residuals of %d streams restored", self.codec.fmt, restored)

    def exchange_events(self) -> List[ExchangeEvent]:
        """What the exchange core's schedule did, in order (the latest :data:`~mpca.exchange.schedule.EVENTS_KEPT`)."""
        return list(self.pipeline.schedule.events)

    def counters(self) -> RunCounters:
        pipe = self.pipeline
        return RunCounters(jobs=dict(pipe.jobs.counts), broadcasts=dict(pipe.broadcasts.counts),
                           job_group=pipe.jobs.job_group,
                           service_bytes=self.service.bytes_in + self.service.bytes_out if self.service else 0)

    def __exit__(self, *exc) -> None:
        try:
            self.pipeline.flush()
            self.rule.on_stop()
            self.stopped = control.stop_agents(self.pipeline.jobs)
            self.pipeline.close()
            # an elastic run's agents that never had room: their tasks are still pending, nothing to wait for
            if not self.job.join(2 if self.pipeline.roster.not_started else 30):
                self.job.cancel()
                self.job.join(10)
        finally:
            if self.service is not None:
                self.service.close()
            self.rule.close()

    @property
    def summaries(self) -> List[dict]:
        return self.job.summaries or [r.to_dict() for r in self.stopped.values()]
