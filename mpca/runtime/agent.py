"""The agent: a long-lived Spark task that trains a local replica at full speed (§5.1).

One agent per GPU (or per CPU slot) holds its Spark task for the whole run.  Its training loop calls the
algorithm's agent rule (:class:`mpca.algorithm.AgentRule`) around every step.  A server thread answers
the exchange tasks of its executor over the authenticated local channel (:mod:`mpca.runtime.channel`):
it hands out shard snapshots with the rule's weight (the YieldContext) and takes in broadcast shards
(the Future), without stopping the training loop for longer than one step.
"""
from __future__ import annotations

import collections
import fcntl
import functools
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from mpca.algorithm import AgentContext, AgentRule, Algorithm, ShardLayout, build_algorithm
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.config import DataSection, EmulationSection, TrainingSection, WireSection
from mpca.data.checks import found_in_agent, label_counts, labels_problem
from mpca.exchange.device import ComputeModel, DeviceClock
from mpca.runtime import placement
from mpca.runtime.agent_answers import ExchangeAnswers
from mpca.runtime.agent_leave import LeaveOnRequest, watch_for_leave
from mpca.runtime.agent_loop import TrainingLoop
from mpca.runtime.agent_pacing import PacedWindows
from mpca.runtime.agent_server import ChannelServer
from mpca.runtime.channel import listen, listen_tcp
from mpca.runtime.cluster import visible_gpus
from mpca.runtime.collective import TorchCollective
from mpca.runtime.initial import InitialModel, rebuild
from mpca.runtime.reports import AgentReport
from mpca.runtime.rundir import COORDINATOR, RunDir, reachable_host

log = logging.getLogger("mpca.agent")



@dataclass
class AgentSpec:
    """Everything an agent needs, shipped to executors with cloudpickle inside the task closure: the run's
    identity, the user's functions, the model's layout and starting point, and the settings' own sections
    (``algorithm``, ``training``, ``data``) as the user gave them."""

    run_id: str
    secret: bytes = field(repr=False)  # never in a log line or an error message
    model_fn: Callable[[], torch.nn.Module]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer_fn: Callable[[Any], torch.optim.Optimizer]
    layout: ShardLayout
    initial: InitialModel  # the starting point: rebuilt from the seed on the executor, or its weights (mpca.runtime.initial)
    algorithm: Algorithm = field(default_factory=lambda: build_algorithm("single"))  # its agent rule, buffers
    training: TrainingSection = field(default_factory=TrainingSection)  # agents, batch size, pinning, lock step
    emulation: EmulationSection = field(default_factory=EmulationSection)  # a benchmark's emulated device
    data: DataSection = field(default_factory=DataSection)  # input shape, memory budget
    wire: WireSection = field(default_factory=WireSection)  # how shards cross the network
    seed: int = 0
    idle_timeout_s: float = 300.0
    max_payload: int = 8 * 1024 ** 3
    service: Optional[Tuple[str, int]] = None  # the driver's parameter service, for agent-initiated algorithms
    rendezvous: Dict[str, Any] = field(default_factory=dict)
    classes: Optional[int] = None  # the model's class count for class-index labels: every agent checks its rows
    holdout: Optional[Tuple[int, int]] = None  # (cut, max_rows): its rows come hashed, it sets the holdout aside
    relay: Optional[str] = None  # a Spark Connect run's directory: the agent announces itself there and reads where
    # the coordinator's services are (mpca.runtime.rundir)

    @property
    def codec(self) -> Codec:
        return Codec.of(self.wire.resolved(self.algorithm), self.wire.block, self.layout.wire_dtype)

    @property
    def join_on_retry(self) -> bool:
        """A retried agent task waits for the driver's joint model (driver-initiated exchange)."""
        return self.algorithm.exchange == "cycle"


def choose_device(gpu_addresses: List[str]) -> torch.device:
    """cuda:<addr> for the GPU Spark assigned to this task when CUDA is real, else the CPU."""
    if gpu_addresses and int(gpu_addresses[0]) < visible_gpus():
        return torch.device(f"cuda:{int(gpu_addresses[0])}")
    return torch.device("cpu")


class Agent(TrainingLoop, ExchangeAnswers):
    """A local replica and the algorithm's agent rule called around every step: its state and its start here, its
    training loop in :mod:`mpca.runtime.agent_loop`, its answers to the driver's exchange tasks in
    :mod:`mpca.runtime.agent_answers`, its leaving a decommissioned executor in :mod:`mpca.runtime.agent_leave`."""

    def __init__(self, spec: AgentSpec, agent_id: int, features: torch.Tensor, labels: torch.Tensor,
                 gpu_addresses: Optional[List[str]] = None, attempt: int = 0, data_on_host: bool = False,
                 task_started: Optional[float] = None, data_loaded: Optional[float] = None, holdout=None,
                 loading=None, problem: Optional[str] = None):
        self.spec = spec
        self.holdout = holdout  # its holdout rows (mpca.data.holdout.HoldoutKeeper), where it set them aside
        # its rows while they still arrive (mpca.data.stream.LoadingRows; ``features``/``labels`` the first ones):
        # it trains on the ramp until they are all there
        self.loading = loading
        self.ramp_steps: Optional[int] = None  # steps it made before its rows were all there
        self.id = agent_id
        self.attempt = attempt
        self.gpu_addresses = list(gpu_addresses or [])
        self.device = choose_device(self.gpu_addresses)
        torch.manual_seed(spec.seed + 1000 * agent_id)
        # every agent starts from the driver's initial model; one that rebuilt other weights takes the driver's
        # model at run time instead, as a replacement does (mpca.runtime.initial)
        self.model, has_initial = rebuild(spec.initial, spec.model_fn)
        # how it got the initial model: its weights in the task, rebuilt from the seed, or the driver's at run time
        self.initial_model = "shipped" if spec.initial.shipped else "rebuilt" if has_initial else "joined"
        if not has_initial:
            log.warning("agent %s: model_fn under seed %d built other weights here than on the driver (another "
                        "torch or CPU kind on this executor?); it takes the driver's model before it trains",
                        agent_id, spec.initial.seed)
        # a replacement (Spark retried the task: its executor was lost) must not start from the initial model,
        # nor one without it train: neither contributes before it holds the joint model, the driver's "join" (§5.3)
        needs_joint = attempt > 0 or not has_initial
        self.joining = needs_joint and spec.join_on_retry
        self.model.to(self.device)
        self.optimizer = spec.optimizer_fn(self.model.parameters())
        self.shards = spec.layout.bind_module(self.model, spec.algorithm.buffers)
        self.data_on_host = data_on_host  # memory-mapped from local disk: batches move to the device one by one
        on_host = data_on_host or loading is not None  # rows that are not all there move to the device batch by batch
        self.features = features if on_host else features.to(self.device)
        self.label_counts = label_counts(labels)  # before the move to the device (of the rows there at its start)
        self.labels = labels if on_host else labels.to(self.device)
        self.lock = threading.Lock()
        self._waiting = 0  # exchange requests waiting for the step lock
        self._waiting_lock = threading.Lock()
        self.steps = 0
        self.samples = 0
        self.exchange_s = 0.0  # time the training loop spent in the rule's communicating hooks (not computing)
        self.device_clock = DeviceClock(self._device_step_s(spec.emulation))  # real compute; emulated idle time
        # training.lock_step: windows of exactly that many steps per cycle (mpca.exchange.lock_step)
        self.pace = (PacedWindows(spec.training.lock_step, self._should_stop) if spec.training.lock_step else None)
        self.joins = 0  # joins from the joint model so far: a batch drawn before one is not stepped on after it
        self.last_loss = float("nan")
        self.claimed_tokens = collections.deque(maxlen=64)  # one claim per token (a cycle has a token per task kind)
        self.last_contact = time.time()
        # the driver read no row (or the first ones only); this agent's rows are all here: refused before it
        # serves. ``problem``: its rows could not be read (one line, already naming the agent)
        found = labels_problem(labels, spec.classes, spec.data.label)
        self.error: Optional[str] = problem or (found and found_in_agent(found, agent_id))
        self.user_error = self.error is not None  # the user's to fix: one line, no traceback
        self.stop_requested = False
        self.leaving = False
        self.started = time.time()
        self._rate_mark = (time.time(), 0)
        self.executor = placement.executor_id()
        # its start-up on its own clock (task start -> data loaded -> built), told to the driver with its hello
        self._startup = (task_started or self.started, data_loaded or self.started, time.time())
        self.service = None  # the parameter service (agent-initiated algorithms)
        self.leave_watch = None  # the driver's service asked once a second whether to leave (the others)
        self.last_params: dict = {}  # the latest cycle's parameters (α, the round), for a hand-in
        if spec.service is not None and spec.algorithm.exchange != "service":
            from mpca.runtime.service import ServiceClient

            host, port = spec.service
            self.leave_watch = ServiceClient(host, int(port), spec.secret, max_payload=spec.max_payload)
            watch_for_leave(self, self.leave_watch)
        elif spec.service is not None:
            from mpca.runtime.service import ServiceClient

            host, port = spec.service
            # a Connect run's coordinator that Spark starts again serves from elsewhere: the client finds it
            relocate = {} if spec.relay is None else {"relocate": functools.partial(current_service, spec.relay),
                                                      "relocate_s": COORDINATOR_WAIT_S}
            self.service = LeaveOnRequest(ServiceClient(host, int(port), spec.secret, max_payload=spec.max_payload,
                                                        **relocate), self.asked_to_leave)
            # a replacement (or an elastic run's agent, which may come up late) starts from the server's current
            # model, not the run's first one
            if needs_joint or spec.training.elastic:
                self._join_service(rebuilt_other=not has_initial)
        self.codec = spec.codec
        ctx = AgentContext(agent_id=agent_id, agents=spec.training.agents, model=self.model,
                           optimizer=self.optimizer, shards=self.shards, device=self.device,
                           rows=int(features.shape[0]), service=self.service,
                           collective=TorchCollective(spec.rendezvous) if spec.algorithm.collective else None,
                           lock=self.lock, stats=self._counters, stopping=lambda: self.stop_requested,
                           wire=ErrorFeedback(self.codec), start_agents=spec.training.start_agents)
        self.feedback = ErrorFeedback(self.codec)  # what its last contribution of each shard lost (lossy formats)
        self.rule: AgentRule = spec.algorithm.agent_factory()(ctx)
        self._anchor = [[v.detach().clone() for v in self.shards.views(s)] for s in range(spec.layout.num_shards)]
        self.resets = 0
        self._delivered_cycle = [-1] * spec.layout.num_shards  # sequence numbers: older deliveries are ignored
        self._unsettled: Dict[int, Tuple[int, dict]] = {}  # cycle -> (shard, extra) yielded, not yet confirmed
        self.lost = 0
        self.server = ChannelServer(f"agent {agent_id}", spec.secret, spec.max_payload, self.handle,
                                    lambda: self.stop_requested)

    def asked_to_leave(self) -> None:
        """Its executor is being decommissioned (:mod:`mpca.runtime.agent_leave`): the training loop ends after
        this step, then hands in."""
        self.leaving = True
        self.stop_requested = True

    # ------------------------------------------------------------------ training
    def _should_stop(self) -> bool:
        return self.rule.should_stop(self.stop_requested)

    def _device_step_s(self, emulation: EmulationSection) -> Optional[float]:
        """The emulated device's step time: T (``emulation.device_step_s``), or T / speed for an agent whose
        device is slower (``emulation.device_speed``, a benchmark's straggler), as the simulator's clocks take it."""
        if emulation.device_step_s is None:
            return None
        return ComputeModel(step_s=emulation.device_step_s, speeds=dict(emulation.device_speed)).clock(self.id).mean

    # ------------------------------------------------------------------ exchange
    def _counters(self) -> dict:
        now = time.time()
        t0, s0 = self._rate_mark
        rate = (self.steps - s0) / (now - t0) if now > t0 else 0.0
        self._rate_mark = (now, self.steps)
        return {"steps": self.steps, "samples": self.samples, "loss": self.last_loss, "steps_per_s": rate,
                "executor": self.executor, **self._rows_state(),
                "exchange_s": self.exchange_s, "alive_s": now - self.started, "attempt": self.attempt,
                **self.device_clock.counters()}

    def _rows_state(self) -> dict:
        """Its rows there and whether more are arriving (with every answer, the parameter service's too)."""
        if self.loading is None:
            return {"rows": int(self.features.shape[0]), "loading": False}
        return {"rows": self.loading.ready(), "loading": not self.loading.done}

    def startup(self) -> Dict[str, float]:
        """Seconds on this agent's clock: its wait for its rows (task start to its first rows — all of them where
        they may spill to disk), building its model and channels, and since its task started; and when that was
        on its executor's clock (the driver places it on its own: :func:`mpca.runtime.control.task_started_at`)."""
        start, loaded, built = self._startup
        return {"data_s": loaded - start, "build_s": built - loaded, "since_start_s": time.time() - start,
                "started_at": start}

    def report(self, **kw) -> AgentReport:
        return AgentReport(agent=self.id, executor=self.executor, pid=os.getpid(), device=str(self.device),
                           gpu=self.gpu_addresses, **self._rows_state(), steps=self.steps,
                           samples=self.samples, error=self.error, user_error=self.user_error, resets=self.resets,
                           attempt=self.attempt,
                           joining=self.joining, lost=self.lost, **kw)

    def serve(self, srv) -> None:
        """Answer the exchange tasks on ``srv`` (:class:`~mpca.runtime.agent_server.ChannelServer`) until it stops."""
        self.server.serve(srv)

    @property
    def refused(self) -> int:
        """Connections closed because :data:`~mpca.runtime.agent_server.MAX_CONNECTIONS` were open."""
        return self.server.refused

    def summary(self) -> dict:
        return {**self.report(exchange_s=self.exchange_s, alive_s=time.time() - self.started,
                              **self.device_clock.counters()).to_dict(),
                "wall_s": time.time() - self.started, "data_on_disk": self.data_on_host, "ramp_steps": self.ramp_steps,
                "initial_model": self.initial_model}

    def close(self) -> None:
        try:
            self.rule.close()
        finally:
            for client in (self.service, self.leave_watch):
                if client is not None:
                    client.close()


COORDINATOR_WAIT_S = 300.0  # how long a Connect run's agent waits for its coordinator to say where it is


def coordinator_services(relay: str, found: Optional[dict]) -> Tuple[Optional[Tuple[str, int]], dict]:
    """The parameter service's address and the rendezvous in a Connect run's ``coordinator.json`` (``found``;
    JSON, checked here: no secret in it)."""
    service = (found or {}).get("service")
    if service is not None and not (isinstance(service, list) and len(service) == 2):
        raise ValueError(f"{relay}/{COORDINATOR}: service is not [host, port]: {service!r}")
    rendezvous = (found or {}).get("rendezvous") or {}
    if not isinstance(rendezvous, dict):
        raise ValueError(f"{relay}/{COORDINATOR}: rendezvous is not an object")
    return ((str(service[0]), int(service[1])) if service else None), rendezvous


def current_service(relay: str) -> Optional[Tuple[str, int]]:
    """Where a Connect run's parameter service is now (a coordinator that Spark started again moved it)."""
    return coordinator_services(relay, RunDir(relay).read(COORDINATOR))[0]


def with_coordinator(spec: AgentSpec) -> AgentSpec:
    """A Connect run's spec with the coordinator's parameter service and rendezvous, as the coordinator wrote
    them in the run directory (``coordinator.json``)."""
    found = RunDir(spec.relay).wait_for(COORDINATOR, COORDINATOR_WAIT_S)
    if found is None:
        raise RuntimeError(f"the run's coordinator did not say where it is within {COORDINATOR_WAIT_S:.0f}s "
                           f"({spec.relay}/{COORDINATOR}): is the directory shared with the coordinator's executor?")
    service, rendezvous = coordinator_services(spec.relay, found)
    return replace(spec, service=service, rendezvous=rendezvous)


def exclusive_slot(agent_id: int, gpu_addresses: Optional[List[str]], slot: Optional[str], relayed: bool) -> str:
    """What one agent holds alone on its executor: its GPUs, or its agent slot's address. Without either, a
    classic run's agent holds the executor's CPUs (its exchange tasks take the executor's second core), while a
    Spark Connect run's agent is a task of one core with no exchange tasks beside it: Spark's own accounting of
    cores decides how many share an executor, and only a second process of the same agent is refused (a retry
    while the old one still runs). Keyed by the executor, a replacement that Spark put on the other agent's
    executor was refused there and its agent never came back."""
    if gpu_addresses:
        return "gpu" + "-".join(gpu_addresses)
    if slot:
        return f"cpu{slot}"
    return f"cpu-agent{agent_id}" if relayed else "cpu"


def run_agent(spec: AgentSpec, agent_id: int, features: torch.Tensor, labels: torch.Tensor,
              gpu_addresses: Optional[List[str]] = None, attempt: int = 0, slot: Optional[str] = None,
              data_on_host: bool = False, task_started: Optional[float] = None,
              data_loaded: Optional[float] = None, holdout=None, loading=None, problem: Optional[str] = None) -> dict:
    """Run one agent in this Spark task until the driver says stop; return its summary.

    Takes an exclusive lock on what the agent holds alone on its executor (:func:`exclusive_slot`), so that a
    retried agent task can never share it with a live agent.
    """
    slot = exclusive_slot(agent_id, gpu_addresses, slot, relayed=spec.relay is not None)
    lock_path = f"mpca-{spec.run_id}-slot-{slot}.lock"
    lock_fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        return {"agent": agent_id, "executor": placement.executor_id(),
                "error": f"agent {agent_id}: executor slot {slot} already holds an agent of this run"}
    sock_path = placement.agent_socket(spec.run_id, agent_id)
    srv = agent = relayed = None
    try:
        if spec.relay is not None:  # a Spark Connect run: the coordinator's services are named in the run directory
            spec = with_coordinator(spec)
        agent = Agent(spec, agent_id, features, labels, gpu_addresses, attempt, data_on_host, task_started, data_loaded,
                      holdout, loading, problem)
        srv = listen(sock_path)
        server = threading.Thread(target=agent.serve, args=(srv,), daemon=True)
        server.start()
        if spec.relay is not None:  # and the coordinator reaches the agent over TCP, where it announced it listens
            host = reachable_host()
            relayed = listen_tcp(host, 0)
            threading.Thread(target=agent.serve, args=(relayed,), daemon=True).start()
            RunDir(spec.relay).announce_agent(agent_id, host, relayed.getsockname()[1], attempt)
        agent.train_forever()
        # training ended (stop, error or idle): keep answering until told to stop so the driver learns why
        deadline = time.time() + 60
        while not agent.stop_requested and time.time() < deadline:
            time.sleep(0.05)
        agent.stop_requested = True
        server.join(timeout=2)
        return agent.summary()
    finally:
        if agent is not None:
            agent.close()
        for listening in (srv, relayed):
            if listening is not None:
                listening.close()
        for p in (sock_path,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            os.unlink(lock_path)  # still holding it: no other agent task of this executor owns this file
        except FileNotFoundError:
            pass
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
