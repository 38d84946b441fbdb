"""K agents and the driver in one process on a virtual clock (issue 26).

The agent and driver rules are the library's own objects: built by the registry's algorithm
(``Algorithm.agent_factory()``, ``Algorithm.driver_rule``) with a real :class:`~mpca.algorithm.base.AgentContext`
(model, optimizer, :class:`~mpca.algorithm.sharding.BoundShards`, the run's wire format with error feedback).
Each agent really trains its own model copy on its own rows (:mod:`mpca.sim.workload`); only time is simulated:

* a step's hooks run at the step's start time (before_step … after_step, :meth:`SimAgent.step`) and its effects
  are visible from then on, as under the runtime's emulated devices (the real compute runs, then the agent waits
  out the device time outside its step lock); ``between_steps`` comes one device step time later
  (:mod:`mpca.exchange.device`) plus whatever the step's service calls took;
* an agent whose rule is ``waiting()`` (a finished synchronous round, :class:`~mpca.algorithm.rounds.RoundAgent`)
  is parked instead of calling the blocking ``between_steps``, and steps again when a delivery ends the wait;
* ``exchange = "cycle"``: the driver's pipeline in virtual time (:mod:`mpca.sim.cycles`); a rule's
  ``yield_ready`` is asked with a timeout of 0, and a rule not ready yet (a round in progress) yields when it is;
* ``exchange = "service"``: ``ServiceAgent.call_service`` goes to :class:`~mpca.sim.service.SimServiceClient`,
  which calls the driver rule's ``serve`` and charges the round trip to the agent.

Supported: every registered algorithm but those below.  Refused with a ValueError:
``rudra-hardsync`` and ``weaksync`` (their ``serve`` waits on a condition for other agents' requests, or on the
wall clock, which one thread in virtual time cannot do).  ``ddp``'s agents (``Algorithm.collective``) step
together: each rule runs its own all-reduce (DDPAgent.after_backward: the gradients' mean, or with a lossy wire
format the runtime's encoded ring with per-rank error feedback) over the simulator's transport
(:mod:`mpca.sim.collective`: the K rules in K threads meeting in one room), and one step takes the slowest
agent's device time plus the ring all-reduce's over the bytes they sent
(:func:`~mpca.sim.network.ring_allreduce_time`).  The driver's joint model is evaluated on the
holdout every ``eval_every_s`` virtual seconds, at no virtual cost (ddp: agent 0's replica; single: the agent's
own model, not the driver's snapshot of it), and each history
row carries the driver rule's ``metrics()`` since the last one (e.g. Rudra's ⟨σ⟩), as the runtime's history.
``absences`` (:mod:`mpca.sim.presence`, the cycle algorithms but ``ddp`` and ``single``): agents that hang or are
lost and replacements that join, under the runtime's bounded wait; an agent's events are dropped when its process
is lost and held while it is stopped.
"""
from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Tuple

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mpca.algorithm.base import Algorithm
from mpca.algorithm.registry import build as build_algorithm
from mpca.algorithm.wire import DEFAULT_BLOCK, Codec, ErrorFeedback, WireFormat
from mpca.evaluation import evaluate, has_batchnorm, recalibrate_batchnorm
from mpca.sim.agents import SimAgent
from mpca.sim.clock import VirtualClock
from mpca.sim.collective import Room
from mpca.exchange.device import ComputeModel
from mpca.sim.constants import NetworkConstants
from mpca.sim.cycles import VirtualPipeline
from mpca.sim.network import DriverPort, ring_allreduce_time
from mpca.sim.presence import Absence, MembershipChange, Presence
from mpca.sim.result import HistoryRow, SimResult
from mpca.sim.run_settings import BUILT, RUN_SETTINGS, spelled_by_field
from mpca.sim.service import SimServiceClient
from mpca.sim.workload import TeacherWorkload, Workload

if TYPE_CHECKING:
    from mpca.config import Settings

REFUSED = {
    "rudra-hardsync": "its server waits inside serve() for every learner's gradient of a timestamp, which one "
                      "thread in virtual time cannot do (use rudra-softsync or rudra-async)",
    "weaksync": "its server's partial pull waits inside serve() for other workers' pushes and on the wall clock "
                "(τ1, τ2), which one thread in virtual time cannot do",
}


def unsimulated(settings: "Settings") -> Optional[str]:
    """What in a run's settings the simulator cannot run (one line naming the setting), or None."""
    t = settings.training
    if t.elastic:
        return (f"training.agents {t.min_agents}-{t.agents} is a range (an elastic run): the simulator runs a fixed "
                "number of agents (a run's joins replay as membership); give one count")
    if settings.emulation.device_step_s is None:
        return ("emulation.device_step_s is not set: the simulator needs the device's step time "
                "(emulation.device_step_s=SECONDS)")
    if settings.cluster.reduce == "scatter":
        return ("cluster.reduce: scatter (contributions reduce-scattered over the executors) is not simulated: "
                "give tree or ordered")
    return None


# SimConfig's fields that a run's settings spell (SimConfig.from_settings): where (mpca.sim.run_settings)
RUN_SPELLED = spelled_by_field()


class SimConfig(BaseModel):
    """One simulation: the algorithm (a name, a mapping of its settings, or an instance), K, the wire format,
    the network, compute and workload models, and how long and what to watch."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    algorithm: Algorithm = Field(default_factory=lambda: build_algorithm("mpca"))
    agents: int = Field(4, ge=1, le=4096)
    wire: Optional[WireFormat] = None  # None: the algorithm's default (Algorithm.default_wire)
    wire_block: int = Field(DEFAULT_BLOCK, ge=64)  # wire.block
    network: NetworkConstants = Field(default_factory=NetworkConstants)
    compute: ComputeModel = Field(default_factory=ComputeModel)
    workload: Workload = Field(default_factory=TeacherWorkload)
    batch_size: int = Field(64, ge=1)
    max_virtual_s: float = Field(120.0, gt=0)
    eval_every_s: float = Field(5.0, gt=0)
    targets: Tuple[float, ...] = ()
    metric: Literal["error", "loss"] = "error"  # what the targets are of: holdout error, or loss (nats), as eval.metric
    seed: int = 0
    absences: Tuple[Absence, ...] = ()  # agents that hang or are lost (mpca.sim.presence)
    agent_wait_s: Optional[float] = Field(None, gt=0)  # cluster.agent_wait_s (None: the runtime's default rule)
    # the runtime's start-up: seconds from fit's start until every agent is up (its task, data and model; bench
    # compare prints it); nothing steps or exchanges before, and every time (targets, absences) counts from fit's
    # start, as the benchmark's do.  0: the agents step at once.
    startup_s: float = Field(0.0, ge=0)
    # each agent's own start on that clock (its Spark task, data read and build, as the runtime reports them per
    # agent): the runtime's agents train from the moment each is built, not when the last one is up, so their
    # steps are out of phase by the spread of their start-ups.  Empty: every agent starts at startup_s.  ddp's
    # ranks step together from startup_s whatever is given (its process group forms when all are up).
    agent_starts_s: Tuple[float, ...] = ()
    # training.lock_step: each agent's windows of exactly this many steps per cycle (mpca.exchange.lock_step)
    lock_step: Optional[int] = Field(None, ge=1)
    reduce: Literal["tree", "ordered"] = "tree"  # cluster.reduce: ordered — the partials added in agent order
    max_cycles: Optional[int] = Field(None, ge=1)  # stop.max_cycles: the run ends after this many exchange cycles
    # agents lost and joining at cycle boundaries, as a run's timeline records them (mpca.sim.presence.replayed)
    membership: Tuple[MembershipChange, ...] = ()

    @field_validator("algorithm", mode="before")
    @classmethod
    def _build(cls, v: Any) -> Algorithm:
        return build_algorithm(v)

    @classmethod
    def from_settings(cls, settings: "Settings", jitter: float = 0.0, **own: Any) -> "SimConfig":
        """The simulation of a run's settings (:class:`mpca.config.Settings`: a job's YAML as ``mpca train`` reads
        it), each taken where the run spells it (:data:`mpca.sim.run_settings.RUN_SETTINGS`: ``algorithm``;
        ``training.agents``, ``batch_size``, ``lock_step``; ``emulation.device_step_s`` and ``device_speed`` (the
        compute model's T and its stragglers); ``wire.format`` and ``block``; ``cluster.reduce`` and ``agent_wait_s``;
        ``stop.max_cycles``, ``max_seconds`` (virtual seconds here); ``eval.metric``; ``seed``; a setting left unset
        leaves its field's default), and ``stop.target`` unless ``targets`` is given.  ``jitter`` (the step time's
        log-normal σ) and ``own`` are the simulator's own fields, which no run setting spells (the network, the
        workload, ``eval_every_s``, ``targets``, absences ...); a field the run spells is refused (ValueError naming
        its setting)."""
        e, stop = settings.emulation, settings.stop
        twice = sorted(k for k in own if k in RUN_SPELLED)
        if twice:
            raise ValueError(f"{twice[0]} is the run's {RUN_SPELLED[twice[0]]}: set it there")
        problem = unsimulated(settings)
        if problem:
            raise ValueError(problem)
        given = ((row.field, row.value(settings)) for row in RUN_SETTINGS if row.field not in BUILT)
        fields: Dict[str, Any] = {name: value for name, value in given if value is not None}
        fields.update(algorithm=settings.algorithm,
                      compute=ComputeModel(step_s=e.device_step_s, jitter=jitter, speeds=dict(e.device_speed),
                                           seed=settings.seed))
        if stop.target is not None and "targets" not in own:
            fields["targets"] = (stop.target,)
        return cls(**fields, **own)

    @field_validator("targets")
    @classmethod
    def _targets_sorted(cls, v: Tuple[float, ...]) -> Tuple[float, ...]:
        return tuple(sorted(v, reverse=True))

    @model_validator(mode="after")
    def _targets_in_range(self) -> "SimConfig":
        if self.metric == "error" and any(not 0 <= t <= 1 for t in self.targets):
            raise ValueError(f"target errors lie in [0, 1], got {list(self.targets)}")
        if self.metric == "loss" and any(not t > 0 for t in self.targets):
            raise ValueError(f"target losses are > 0, got {list(self.targets)}")
        return self

    @model_validator(mode="after")
    def _membership_of_the_runs_agents(self) -> "SimConfig":
        bad = sorted({c.agent for c in self.membership if c.agent >= self.agents})
        if bad:
            raise ValueError(f"membership names agents {bad}, but the run has agents 0..{self.agents - 1}")
        return self

    @model_validator(mode="after")
    def _starts_before_startup(self) -> "SimConfig":
        starts = self.agent_starts_s
        if starts and (len(starts) != self.agents or not all(0 <= s <= self.startup_s for s in starts)):
            raise ValueError(f"agent_starts_s gives each of the {self.agents} agents its start, in [0, startup_s = "
                             f"{self.startup_s:g}] (the run counts the agents up when the last one is), got "
                             f"{list(starts)}")
        return self


def check_supported(cfg: SimConfig) -> None:
    """ValueError (one line) for what the simulator does not run."""
    name = cfg.algorithm.name
    if name in REFUSED:
        raise ValueError(f"the simulator does not run {name}: {REFUSED[name]}")
    cfg.algorithm.check_agents(cfg.agents)
    algo = cfg.algorithm
    problem = algo.lock_step_problem() if cfg.lock_step is not None else None
    if problem:
        raise ValueError(f"lock_step paces agents that never wait for the driver (mpca), not {name}'s: {problem}")
    if (cfg.absences or cfg.membership) and (algo.exchange != "cycle" or algo.collective
                                             or algo.scored_model != "joint"):
        raise ValueError(f"absent and joining agents are simulated for mpca, sync and diloco (the driver's exchange "
                         f"cycles), not for {name}")


class Simulator:
    def __init__(self, cfg: SimConfig):
        check_supported(cfg)
        self.cfg = cfg
        algo, K, work = cfg.algorithm, cfg.agents, cfg.workload
        self.K = K
        self.ddp = algo.collective  # the agents average among themselves every step, in one room
        self.room = Room(K) if self.ddp else None
        self.pool: Optional[ThreadPoolExecutor] = None  # the ranks' threads, while a collective run goes on
        torch.manual_seed(cfg.seed)
        model = work.model_fn()
        self.layout = algo.shard_layout(model)
        bound = self.layout.bind_module(model, algo.buffers)
        self.rule = algo.driver_rule([bound.read(s) for s in range(self.layout.num_shards)], K)
        init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.wire = algo.wire_format(cfg.wire)
        self.codec = Codec.of(self.wire, cfg.wire_block, self.layout.wire_dtype)
        self.clock = VirtualClock()
        self.port = DriverPort(cfg.network)
        self.now = [0.0] * K  # each agent's virtual time while its hooks run
        answers = ErrorFeedback(self.codec)  # the service's answers, one residual per agent
        self.clients: List[Optional[SimServiceClient]] = [
            SimServiceClient(a, self.rule, self.codec, answers, self.port, cfg.network,
                             lambda a=a: self.now[a]) if algo.exchange == "service" else None for a in range(K)]
        self.init_state = init_state
        self.rows = [work.agent_rows(a, K) for a in range(K)]
        self.agents: List[SimAgent] = [self._new_agent(a) for a in range(K)]
        self.presence = Presence(K, cfg.absences, cfg.agent_wait_s)
        self.lost_steps = 0  # steps of processes that were lost (their replacements count from 0)
        self.clocks = [cfg.compute.clock(a) for a in range(K)]
        self.parked: set = set()
        self.eval_model = copy.deepcopy(model)
        self.eval_bound = self.layout.bind_module(self.eval_model, algo.buffers)
        self.hx, self.hy = work.holdout_rows(K)
        # BatchNorm statistics re-estimated before each score where they are not used as exchanged, as the
        # runtime's evaluator does (mpca.evaluation)
        self.calibration = (work.calibration_rows(K) if algo.buffers != "average" and has_batchnorm(model)
                            else None)
        self.pipeline: Optional[VirtualPipeline] = None
        self.script: Dict[Tuple[int, str], List[int]] = {}  # cfg.membership by (cycle, kind)
        for change in cfg.membership:
            self.script.setdefault((change.cycle, change.kind), []).append(change.agent)
        if algo.exchange == "cycle" and not self.ddp:
            self.pipeline = VirtualPipeline(self.clock, self.rule, K, self.codec, cfg.network, algo.cycle_interval_s,
                                            self._deliver, self._contribute, self.layout.shard_numel,
                                            presence=self.presence, join=self._join,
                                            join_bytes=4 * self.layout.total_numel, ordered=cfg.reduce == "ordered",
                                            before_cycle=self._scripted_losses if cfg.membership else None,
                                            after_cycle=self._scripted_joins if cfg.membership else None)
        self.result = SimResult(algorithm=algo.name, agents=K, wire=self.wire, constants=cfg.network.to_dict(),
                                settings={"algorithm": algo.model_dump(mode="json"),
                                          "compute": {"step_s": cfg.compute.step_s, "jitter": cfg.compute.jitter,
                                                      "speeds": dict(cfg.compute.speeds)},
                                          "batch_size": cfg.batch_size, "seed": cfg.seed, "startup_s": cfg.startup_s,
                                          "agent_starts_s": list(cfg.agent_starts_s),
                                          "parameters": self.layout.total_numel,
                                          "workload": cfg.workload.describe()},
                                targets=list(cfg.targets))
        self.done = False

    # ------------------------------------------------------------------ agents
    def _new_agent(self, a: int) -> SimAgent:
        """Agent ``a``'s process: its rule built by the algorithm's factory, its model from the run's start (a
        replacement's is overwritten by the join), a fresh optimizer, its own rows."""
        x, y = self.rows[a]
        return SimAgent(a, self.K, self.cfg.algorithm, self.layout, self.init_state, self.cfg.workload.model_fn,
                        self.cfg.workload.loss_fn, self.cfg.workload.optimizer_fn, x, y, self.cfg.batch_size,
                        self.codec, self.cfg.seed, self.clients[a], self.cfg.lock_step,
                        self.room.member(a) if self.room is not None else None)

    def _later(self, t: float, a: int, event) -> None:
        """Schedule one of agent ``a``'s own events; it is dropped if the process is lost meanwhile, and held
        until the process resumes if it is stopped then."""
        generation = self.presence.generation[a]

        def run(when: float) -> None:
            if self.presence.generation[a] != generation:
                return
            if when < self.presence.stopped_until[a]:
                self.clock.schedule(self.presence.stopped_until[a], run)
                return
            event(a, when)

        self.clock.schedule(t, run)

    def _step(self, a: int, t: float) -> None:
        pace = self.agents[a].pace
        if pace is not None and not pace.may_step():  # its lock-step window is closed: parked until it opens
            self.parked.add(a)
            return
        self.now[a] = t
        self.agents[a].step()
        if pace is not None:
            pace.stepped()
        charged = self._charged(a)
        if self.pipeline is not None:
            self.pipeline.offer(a, t + charged)
        self._later(t + charged + self.clocks[a].next_step_s(), a, self._between)

    def _between(self, a: int, t: float) -> None:
        self.now[a] = t
        rule = self.agents[a].rule
        if rule.waiting():  # would block until the driver's delivery: parked instead
            self.parked.add(a)
            return
        rule.between_steps()
        charged = self._charged(a)
        self._later(t + charged, a, self._step)

    def _absence(self, absence: Absence, t: float) -> None:
        a = absence.agent
        self.presence.stop(absence)
        if absence.kind == "lost":  # the process and its state are gone; Spark's retry brings a replacement up
            self._lost(a, t)
            self.clock.schedule(t + absence.for_s, lambda when: self.presence.replacement_up(a, when))

    def _lost(self, a: int, t: float) -> None:
        self.lost_steps += self.agents[a].steps
        self.parked.discard(a)
        self.pipeline.lost(a, t)

    def _scripted_losses(self, cycle: int, t: float) -> None:
        """``cfg.membership``: the processes lost before ``cycle`` opens."""
        for agent in self.script.get((cycle, "lost"), ()):
            self.presence.stop(Absence(agent, t, 1.0, "lost"))
            self._lost(agent, t)

    def _scripted_joins(self, cycle: int, t: float) -> None:
        """``cfg.membership``: the replacements up to join as ``cycle`` ends."""
        for agent in self.script.get((cycle, "joined"), ()):
            self.presence.replacement_up(agent, t)

    def _join(self, agents: List[int], params: dict, t: float) -> None:
        """The runtime's join (``Agent._join``): a fresh process of each replacement takes every shard of the
        driver rule's join payload (exact), its rule hears of them and of the join state (``joined``), a fresh
        optimizer, ``on_reset``; it steps and contributes from then on."""
        vectors, state = self.layout.split_join(self.rule.join_payload())
        for a in agents:
            ag = self.agents[a] = self._new_agent(a)
            with torch.no_grad():
                pieces = [ag.shards.split(s, vec.detach().clone()) for s, vec in enumerate(vectors)]
                for s, p in enumerate(pieces):
                    torch._foreach_copy_(ag.shards.views(s), p)
            ag.rule.joined(pieces, params, state)  # a rule copies what it keeps
            ag.rule.on_reset()
            self.presence.joined([a])
            self._later(t, a, self._step)

    def _charged(self, a: int) -> float:
        client = self.clients[a]
        return client.take_charge() if client is not None else 0.0

    def _deliver(self, a: int, shard: int, data: bytes, params: dict, t: float, cycle: int) -> None:
        if not self.presence.acts(a, t):  # stopped, lost or not joined yet: the broadcast misses it
            return
        ag = self.agents[a]
        vec = torch.from_numpy(self.codec.decode(data, self.layout.shard_numel(shard)))
        pieces = ag.shards.split(shard, vec)
        if ag.pace is None:
            ag.rule.receive(shard, pieces, params)
        else:  # in lock step: received right after this cycle's yield
            ag.pace.deliver(cycle, lambda: ag.rule.receive(shard, pieces, params))
        self._wake(a, t)
        if self.pipeline is not None:
            self.pipeline.offer(a, t)

    def _wake(self, a: int, t: float) -> None:
        """A parked agent steps again once neither its rule nor its lock-step window holds it."""
        ag = self.agents[a]
        if a in self.parked and not ag.rule.waiting() and (ag.pace is None or ag.pace.may_step()):
            self.parked.discard(a)
            self._later(t, a, self._step)

    def _contribute(self, a: int, shard: int, params: dict, cycle: int, broadcasts: bool):
        ag = self.agents[a]
        if ag.pace is not None and not ag.pace.ready(cycle):  # its window's steps are not all taken
            return None
        try:
            ag.rule.yield_ready(shard, params, 0.0)  # timeout 0: returns when ready, else TimeoutError
        except TimeoutError:
            return None
        out = ag.contribution_bytes(shard, params)
        if ag.pace is not None:
            ag.pace.yielded(cycle, broadcasts)
            self._wake(a, self.clock.now)
        return out

    # ------------------------------------------------------------------ ddp
    def _ddp_step(self, t: float) -> None:
        """Every agent's step together: forward and backward in agent order (the global RNG as in the other
        algorithms' runs), then every rule's after_backward, optimizer step and between_steps in its own thread,
        their all-reduce met in the room (:mod:`mpca.sim.collective`); the slowest device time plus the ring's
        over the bytes the rules sent."""
        batches = [ag.compute_gradients() for ag in self.agents]
        before = [ag.rule.wire_bytes for ag in self.agents]
        list(self.pool.map(self._ddp_rest, self.agents, batches))
        sent = sum(ag.rule.wire_bytes - b for ag, b in zip(self.agents, before)) / self.K  # bytes per host
        self.result.ring_bytes += sent
        gradient_bytes = sent * self.K / (2 * (self.K - 1)) if self.K > 1 else 0.0  # sent is 2 (K − 1) / K of it
        took = max(c.next_step_s() for c in self.clocks) + ring_allreduce_time(self.K, gradient_bytes,
                                                                                self.cfg.network)
        self.clock.schedule(t + took, self._ddp_step)

    def _ddp_rest(self, ag: SimAgent, batch: tuple) -> None:
        try:
            ag.rule.after_backward()
            ag.apply_step(batch)
            ag.rule.between_steps()
        except BaseException:
            self.room.abort()  # the other ranks' collective raises instead of waiting for this one
            raise

    # ------------------------------------------------------------------ evaluation
    def joint_vectors(self) -> List[torch.Tensor]:
        if self.cfg.algorithm.scored_model == "agent":  # Algorithm.scored_model: ddp, single
            return [self.agents[0].shards.read(s) for s in range(self.layout.num_shards)]
        return self.rule.joint_vectors()

    def _evaluate(self, t: float, again: bool = True) -> None:
        for s, v in enumerate(self.joint_vectors()):
            self.eval_bound.write(s, v)
        if self.calibration is not None:
            recalibrate_batchnorm(self.eval_model, self.calibration)
        r = evaluate(self.eval_model, self.hx, self.hy, self.cfg.workload.loss_fn)
        self.result.history.append(HistoryRow(t, sum(ag.steps for ag in self.agents), r.error, r.loss,
                                              dict(self.rule.metrics())))
        if self.cfg.targets and (r.error if self.cfg.metric == "error" else r.loss) <= min(self.cfg.targets):
            self.done = True
        if again:
            self.clock.schedule(t + self.cfg.eval_every_s, self._evaluate)

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        wall = time.perf_counter()
        up = self.cfg.startup_s
        if self.ddp:
            self.clock.schedule(up, self._ddp_step)
        else:
            starts = self.cfg.agent_starts_s or (up,) * self.K
            for a in range(self.K):
                self._later(starts[a], a, self._step)
            for absence in self.cfg.absences:
                self.clock.schedule(absence.at_s, lambda when, ab=absence: self._absence(ab, when))
        if self.pipeline is not None:
            self.pipeline.start(up)
        self.clock.schedule(0.0, self._evaluate)
        cycles = self.cfg.max_cycles
        ended = (lambda: self.done) if cycles is None or self.pipeline is None else \
            (lambda: self.done or self.pipeline.cycle_no >= cycles)
        if self.ddp:
            with ThreadPoolExecutor(max_workers=self.K, thread_name_prefix="sim-rank") as self.pool:
                self.clock.run_until(self.cfg.max_virtual_s, stop=ended)
            self.pool = None
        else:
            self.clock.run_until(self.cfg.max_virtual_s, stop=ended)
        if cycles is not None and self.pipeline is not None and self.pipeline.cycle_no >= cycles:
            self.pipeline.schedule.flush()  # as the runtime's stop: the joint model holds every reduction
        res = self.result
        if not self.done and (not res.history or res.history[-1].t < self.clock.now):
            self._evaluate(self.clock.now, again=False)
        res.virtual_s = self.clock.now
        res.steps = sum(ag.steps for ag in self.agents) + self.lost_steps
        res.cycles = list(self.pipeline.stats) if self.pipeline is not None else []
        res.exchange_events = list(self.pipeline.schedule.events) if self.pipeline is not None else []
        res.service_requests = sum(c.requests for c in self.clients if c is not None)
        res.service_bytes_in, res.service_bytes_out = self.port.bytes_in, self.port.bytes_out
        res.reach()
        res.wall_s = time.perf_counter() - wall
        return res


def simulate(cfg: SimConfig) -> SimResult:
    return Simulator(cfg).run()


__all__: List[str] = ["REFUSED", "RUN_SPELLED", "SimConfig", "Simulator", "check_supported", "simulate",
                       "unsimulated"]
