"""The agent: a long-lived Spark task that trains a local replica at full speed (§5.1).

One agent per GPU (or per CPU slot) holds its Spark task for the whole run.  Its training loop calls the
algorithm's agent rule (:class:`mpca.algorithm.AgentRule`) around every step.  A server thread answers
the exchange tasks of its executor over the authenticated local channel (:mod:`mpca.runtime.channel`):
it hands out shard snapshots with the rule's weight (the YieldContext) and takes in broadcast shards
(the Future), without stopping the training loop for longer than one step.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import logging
import math
import os
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from mpca.algorithm import AgentContext, AgentRule, Algorithm, ShardLayout, build_algorithm
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.config import DataSection, EmulationSection, TrainingSection, WireSection
from mpca.data.arrow import UnreadableRows
from mpca.data.checks import found_in_agent, label_counts, labels_problem, unreadable
from mpca.data.stream import ramp_rows
from mpca.exchange.agent_step import BatchOrder, batch_seed, finite, forward_backward, optimizer_step, wire_bytes
from mpca.exchange.device import ComputeModel, DeviceClock
from mpca.exchange.timeouts import TASK_TIMEOUT_S
from mpca.runtime import placement, protocol
from mpca.runtime.agent_leave import LeaveOnRequest, hand_in, watch_for_leave
from mpca.runtime.agent_pacing import PacedWindows
from mpca.runtime.agent_server import ChannelServer
from mpca.runtime.protocol import AGENT_OPS, SERVICE_OPS
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


class Agent:
    """A local replica, its training loop, and the algorithm's agent rule called around every step."""

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

    def train_forever(self) -> None:
        if self.error:  # its rows were refused: it answers until stopped, so that the driver says why
            return
        gen = torch.Generator().manual_seed(batch_seed(self.spec.seed, self.id))
        bs = self.spec.training.batch_size
        self.model.train()
        if self.spec.training.agent_cpus:
            os.sched_setaffinity(0, self.spec.training.agent_cpus)  # on Linux: this (training) thread only
        try:
            batches_of = self.joins  # the joins the process's own batch order follows (a join starts it afresh)
            while self.joining and not self._should_stop():  # a replacement: no steps before the joint model
                time.sleep(0.02)
            ramped = self.loading is None or self._ramp(gen, bs)  # its rows all there (else: stopped, refused)
            n = self.features.shape[0]
            device = None if self.data_on_host else self.device  # rows in file order on the host: indices sorted there
            batches = BatchOrder(n, bs, gen=gen, device=device) if n else None  # after the ramp's draws
            while ramped and not self._should_stop():
                if n == 0:  # an empty partition: nothing to learn from, contribute weight 0
                    time.sleep(0.05)
                    if time.time() - self.last_contact > self.spec.idle_timeout_s:
                        break
                    continue
                while self.joining and not self._should_stop():  # told it replaces a lost process
                    time.sleep(0.02)
                if self._should_stop():
                    break
                joins = self.joins
                if joins != batches_of:  # joined from the joint model: a fresh process's batches, as a replacement's
                    batches, batches_of = BatchOrder(n, bs, batch_seed(self.spec.seed, self.id), device=device), joins
                idx = batches.next()
                if self.data_on_host:  # rows in file order: fewer, longer reads from the page cache
                    self._timed_step(self.features, self.labels, idx.sort().values, joins)
                else:
                    self._timed_step(self.features, self.labels, idx, joins)
                if batches.epoch_done and self._driver_gone():
                    break
            if self.leaving:  # its executor is being decommissioned: hand in what it holds, then say so
                hand_in(self)
                log.warning("agent %s left the run (its executor is being decommissioned)", self.id)
        except Exception:
            self.error = f"agent {self.id} training failed:\n{traceback.format_exc()}"

    def _timed_step(self, features: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor, joins: int) -> bool:
        """One training step on rows ``idx`` (moved to the device where they are not there), drawn after join
        number ``joins``, on the emulated device's clock, then the rule's hook between steps; in lock step, within
        the cycle's window.  False where it was not taken (stopping, or a join came since the batch was drawn)."""
        if self.pace is not None:
            self.pace.before_step()
            if self._should_stop():
                return False
        started = self.device_clock.start(self.exchange_s)
        x, y = features[idx], labels[idx]
        if not self.step(x.to(self.device), y.to(self.device), joins):
            return False
        self.device_clock.finish(started, self.exchange_s)  # unlocked: the exchange is served meanwhile
        t = time.perf_counter()
        self.rule.between_steps()  # may wait for a round or talk to the parameter service
        self.exchange_s += time.perf_counter() - t
        return True

    def _driver_gone(self) -> bool:
        if time.time() - self.last_contact > self.spec.idle_timeout_s:
            self.error = f"agent {self.id}: no exchange for {self.spec.idle_timeout_s:.0f}s; driver presumed gone"
            return True
        return False

    def _loading_failure(self, loading) -> Tuple[str, bool]:
        """Why its rows stopped arriving: (the line, whether it is the user's data to fix)."""
        if loading.problem:
            return found_in_agent(loading.problem, self.id), True
        if isinstance(loading.error, UnreadableRows):
            return found_in_agent(unreadable(self.spec.data.features, self.spec.data.label, loading.error), self.id), True
        return f"agent {self.id} could not read its rows: {loading.error!r}", False

    def _ramp(self, gen: torch.Generator, bs: int) -> bool:
        """Training while its rows arrive (:mod:`mpca.data.stream`): ramp step r draws its batch from the first
        ``ramp_rows(r)`` rows, waiting where fewer are there yet; once they are all there and the ramp covers
        them, every row goes to the device for the epochs.  False where it must not go on (stopped, its rows
        refused or unreadable, the driver gone)."""
        loading, r = self.loading, 0
        while not self._should_stop():
            while self.joining and not self._should_stop():
                time.sleep(0.02)
            want = ramp_rows(r)
            there = loading.wait(want, timeout=0.05)
            if loading.problem or loading.error is not None:
                self.error, self.user_error = self._loading_failure(loading)
                return False
            if loading.done and there <= want:
                break
            if there < want:  # its steps outran the rows' arrival
                if self._driver_gone():
                    return False
                continue
            features, labels = loading.view()
            joins = self.joins
            if self._timed_step(features, labels, torch.randint(want, (bs,), generator=gen), joins):
                r += 1
        if self._should_stop():
            return False
        features, labels = loading.rows()
        self.features = features if self.data_on_host else features.to(self.device)
        self.labels = labels if self.data_on_host else labels.to(self.device)
        self.ramp_steps = r
        log.info("agent %s: all %d rows there after %d ramp steps", self.id, len(labels), r)
        return True

    @contextlib.contextmanager
    def _served(self):
        """The step lock for a request of the exchange: the training loop lets it in before its next step.

        (CPython's lock is not fair: a loop that releases and re-takes it between millisecond steps could
        otherwise keep a waiting request out for seconds.)"""
        with self._waiting_lock:
            self._waiting += 1
        try:
            with self.lock:
                yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def step(self, x: torch.Tensor, y: torch.Tensor, joins: Optional[int] = None) -> bool:
        """One step on batch ``(x, y)``, under the step lock; False (not taken) while the agent waits for the joint
        model, or where a join came after the batch was drawn (``joins``: the joins it was drawn after) — a join
        starts the batch order afresh, as a replacement process's.  In lock step the window counts the step
        before the lock is released, so a join between the two cannot count it in its fresh window."""
        while self._waiting:  # a request of the exchange is waiting for the lock: let it in first
            time.sleep(0.0002)
        with self.lock:
            if self.joining or (joins is not None and joins != self.joins):
                return False
            loss = forward_backward(self.rule, self.model, self.optimizer, self.spec.loss_fn, x, y)
            t = time.perf_counter()
            self.rule.after_backward()  # e.g. DDP's all-reduce
            self.exchange_s += time.perf_counter() - t
            optimizer_step(self.rule, self.optimizer)
            self.steps += 1
            if self.pace is not None:
                self.pace.stepped()
            self.samples += int(x.shape[0])
            if self.steps % 10 == 0 or self.steps == 1:  # every 10 steps (a device sync), and the first one
                self.last_loss = float(loss.detach())
                if not math.isfinite(self.last_loss):
                    self._reset(f"loss {self.last_loss} at step {self.steps}")
        if self.service is not None:
            self.last_contact = time.time()  # agent-initiated: a dead driver fails the next service request
        return True

    def _reset(self, why: str) -> None:
        """Numerical fault (lock held): back to the latest joint model this agent received (the initial one for
        shards never delivered), with a fresh optimizer; the rule starts over (MPCA: τ from 0)."""
        self.resets += 1
        log.warning("agent %s: %s; reset to the joint model (reset %d)", self.id, why, self.resets)
        with torch.no_grad():
            for s, pieces in enumerate(self._anchor):
                torch._foreach_copy_(self.shards.views(s), pieces)
        self.optimizer = self.spec.optimizer_fn(self.model.parameters())
        self.rule.ctx.optimizer = self.optimizer
        self.rule.on_reset()

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

    def _settle(self, cycle: Optional[int], counted: Optional[List[int]]) -> None:
        """Contributions yielded before ``cycle`` that the driver did not count (``counted``: its recent
        counted cycles for this agent) were lost on the way: their weight goes back to the rule."""
        if cycle is None or counted is None:
            return
        done = set(counted)
        for c in [c for c in self._unsettled if c < cycle]:
            shard, extra = self._unsettled.pop(c)
            if c not in done:
                self.lost += 1
                log.warning("agent %s: its contribution of cycle %d (shard %d) never reached the reduction; "
                            "its weight carries over to the next one", self.id, c, shard)
                self.rule.contribution_lost(shard, extra)

    def _joint_pieces(self, payload: bytearray) -> Tuple[List[List[torch.Tensor]], torch.Tensor]:
        """A join's payload (the whole joint model, exact, in the layout's wire dtype, then the driver rule's join
        state) as pieces per shard and the state."""
        vec = torch.from_numpy(np.frombuffer(payload, dtype=_np_dtype(self.spec.layout.wire_dtype)))
        shards, state = self.spec.layout.split_join(vec)
        return [self.shards.split(s, part) for s, part in enumerate(shards)], state  # the rule places it

    def _join_service(self, rebuilt_other: bool) -> None:
        """A replacement of an agent-initiated algorithm (Spark retried its task), an elastic run's agent or one
        that rebuilt other initial weights (``rebuilt_other``): before its rule is built, the local model becomes
        the parameter service's current model (the driver rule's join vectors, exact)."""
        _, payload = self.service.request(protocol.header(SERVICE_OPS, "join", agent=self.id, attempt=self.attempt,
                                                          rebuilt_other=rebuilt_other))
        pieces, _ = self._joint_pieces(payload)  # its rule is not built yet: the service's rules keep no join state
        with torch.no_grad():
            for s, p in enumerate(pieces):
                torch._foreach_copy_(self.shards.views(s), p)
        log.info("agent %s (attempt %d) starts from the parameter service's current model", self.id, self.attempt)

    def _join(self, payload: bytearray, params: dict, cycle: Optional[int] = None) -> None:
        """Start from the driver's joint model (every shard) of ``cycle``, with a fresh optimizer and fresh
        counters: deliveries of that cycle or older are not taken after it, and what it yielded before is
        settled (a Connect run's coordinator that Spark started again counts its cycles from its checkpoint)."""
        pieces, state = self._joint_pieces(payload)
        with self._served():
            if cycle is not None:
                self._delivered_cycle = [int(cycle)] * self.spec.layout.num_shards
            self._unsettled.clear()
            with torch.no_grad():
                for s, p in enumerate(pieces):
                    torch._foreach_copy_(self.shards.views(s), p)
                    self._anchor[s] = p
                self.rule.joined(pieces, params, state)
            self.optimizer = self.spec.optimizer_fn(self.model.parameters())
            self.rule.ctx.optimizer = self.optimizer
            self.rule.on_reset()
            self.joining = False
            self.joins += 1
            if self.pace is not None:
                self.pace.reset()
        log.info("agent %s (attempt %d) joined from the joint model", self.id, self.attempt)

    def handle(self, header: dict, payload: bytearray):
        """Answer one request of the driver's tasks (:data:`~mpca.runtime.protocol.AGENT_OPS`, checked first)."""
        try:
            op = protocol.check(AGENT_OPS, header).name
        except ValueError as e:
            return {"error": f"bad request {header.get('op')!r}: {e}"}, None
        self.last_contact = time.time()
        if op == "hello":
            return self.report().to_dict(), None
        if op == "holdout":  # the rows it set aside (mpca.data.holdout): first their hashes, then rows up to one
            if self.loading is not None and not self.loading.done:
                return {"loading": True}, None
            if self.holdout is None:
                return {"rows": 0, "label_dtype": "int64"}, None
            if "up_to" not in header:  # its smallest hashes, int64, as the payload
                hashes = self.holdout.hashes()
                return {"rows": len(hashes)}, hashes.tobytes()
            return self.holdout.rows_up_to(int(header["up_to"]))
        if op == "claim":
            token = str(header["token"])
            with self._served():
                if token in self.claimed_tokens:
                    return {"ok": False, "agent": self.id}, None
                self.claimed_tokens.append(token)
            extra = {"labels": self.label_counts, "startup": self.startup(),
                     "initial_model": self.initial_model} if header.get("for") == "hello" else {}
            return {"ok": True, **self.report(**extra).to_dict()}, None
        params = header.get("params") or {}
        cycle = header.get("cycle")
        if params:
            self.last_params = params  # the latest cycle's (a rule's parameters are per cycle, not per shard)
        if op == "join":
            if self.joining:
                self._join(payload, params, cycle)
            return {"ok": True}, None
        if op == "deliver":
            s = self._shard(header)
            vec = torch.from_numpy(self.codec.decode(payload, self.spec.layout.shard_numel(s)))
            if not bool(torch.isfinite(vec).all()):  # the driver broadcasts finite joint models only
                raise ValueError(f"shard {s} holds non-finite values (corrupted on the way): not taken")
            pieces = self.shards.split(s, vec)  # conversion and host→device copy outside the lock
            with self._served():
                if cycle is not None:
                    if int(cycle) <= self._delivered_cycle[s]:  # a late hand-off of an older broadcast
                        return {"ok": True, "stale": True}, None
                    self._delivered_cycle[s] = int(cycle)

                def receive(s=s, pieces=pieces, params=params):
                    self.rule.receive(s, pieces, params)
                    self._anchor[s] = self.rule.reset_target(s, pieces)  # the latest joint shard: where a reset goes

                if self.pace is None:
                    receive()
                else:  # in lock step: received right after this cycle's yield
                    self.pace.deliver(None if cycle is None else int(cycle), receive)
            return {"ok": True}, None
        if op == "yield":
            s = self._shard(header)
            if header.get("rejoin") and not self.joining:  # the driver knew another process as this agent
                with self._served():
                    self.joining = True
                log.warning("agent %s: a replacement (its first process was lost); waiting for the joint model",
                            self.id)
            if self.joining:  # nothing of its own to give yet
                vec = torch.zeros(self.spec.layout.shard_numel(s), dtype=self.spec.layout.wire_dtype)
                return self.report(weight=0.0).to_dict(), vec.numpy().tobytes()
            timeout_s = float(header.get("timeout_s", TASK_TIMEOUT_S))
            if self.pace is not None and not self.pace.ready(None if cycle is None else int(cycle), timeout_s):
                raise TimeoutError(f"agent {self.id} had not taken its lock-step window's {self.pace.gate.steps} "
                                   f"steps after {timeout_s:.0f}s (step {self.steps})")
            self.rule.yield_ready(s, params, timeout_s)
            with self._served():  # materialize the shard between two steps
                self._settle(cycle, header.get("counted"))
                vec, weight, extra = self.rule.contribution(s, params)
                if self.pace is not None:
                    self.pace.yielded(None if cycle is None else int(cycle), bool(header.get("broadcasts")))
                if cycle is not None:
                    self._unsettled[int(cycle)] = (s, extra)
                    while len(self._unsettled) > 64:  # the driver confirms within a cycle or two
                        self._unsettled.pop(min(self._unsettled))
                counters = self._counters()
                resets = self.resets
            vec, weight, ok = finite(vec, weight)  # never let NaN/Inf reach the joint model (checked unlocked)
            if not ok:
                with self._served():
                    if self.resets == resets:  # not already reset since the read (the step loop checks too)
                        self._reset(f"non-finite values in shard {s}")
            rep = self.report(weight=weight, extra=extra, **{k: counters[k] for k in
                                                           ("steps_per_s", "loss", "exchange_s", "alive_s",
                                                            *DeviceClock.FIELDS)})
            return rep.to_dict(), wire_bytes(self.feedback, s, vec, weight)
        if op == "stop":
            self.stop_requested = True
            return {"ok": True, **self.report().to_dict()}, None
        return {"error": f"unknown op {op!r}"}, None

    def _shard(self, header: dict) -> int:
        s = int(header["shard"])
        if not 0 <= s < self.spec.layout.num_shards:
            raise ValueError(f"no shard {s}")
        return s

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


def _np_dtype(dtype: torch.dtype):
    return {torch.float32: np.float32, torch.float64: np.float64}[dtype]


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
