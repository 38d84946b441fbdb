"""The algorithm seam: what every training algorithm provides, with no Spark and no I/O in it.

An algorithm is one module of this package holding three small things:

* an :class:`Algorithm` — its typed settings (the ``algorithm:`` section of the
  configuration, validated once) and the factories below;
* an :class:`AgentRule` — what an agent does around its local steps and when
  the runtime moves a shard to or from it;
* a :class:`DriverRule` — what the driver sends with a cycle, what it does with
  a reduced shard (and what, if anything, it broadcasts back), what it answers
  when an agent calls the parameter service, and its state for checkpoints.

The runtime (agent loop, exchange tasks, pipeline, trainer, checkpoint) calls
these hooks and names no algorithm.  Two exchange styles share the seam:

* ``"cycle"`` — driver-initiated: every cycle one Spark job yields one shard
  from every agent (reduced with Spark's treeReduce into a
  :class:`~mpca.algorithm.rules.WeightedSum`) and hands each agent the shard the
  driver staged for broadcast (MPCA's 3-phase pipeline, SparkNet, DiLoCo, DDP's
  observation of the model);
* ``"service"`` — agent-initiated: agents call the driver-hosted parameter
  service on their own clock (asynchronous EASGD, parameter-server
  algorithms); the driver's cycles only observe.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Literal, Optional, Tuple

import torch
from pydantic import BaseModel, ConfigDict, Field

from mpca.algorithm.weighted_sum import WeightedSum
from mpca.algorithm.sharding import BoundShards, ShardLayout
from mpca.algorithm.wire import Codec, ErrorFeedback

Params = Dict[str, Any]  # JSON-able values sent with a cycle (e.g. {"alpha": 0.3})


@dataclass
class AgentContext:
    """What an agent rule may use: the agent's model and optimizer, its exchanged tensors as shards, and the
    means to talk to the driver when its algorithm is agent-initiated."""

    agent_id: int
    agents: int  # K: the run's agents (an elastic run's most)
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    shards: BoundShards
    device: torch.device
    rows: int = 0
    service: Any = None  # a ServiceClient (``request(header, payload) -> (header, payload)``) or None
    collective: Any = None  # the transport among the agents (mpca.algorithm.collective.Collective), for ddp
    lock: Any = None  # the agent's step lock: held around before_step … after_step, and around the shard hooks
    stats: Callable[[], Dict[str, Any]] = dict  # the agent's counters (steps, samples, loss), for service headers
    stopping: Callable[[], bool] = bool  # whether the driver asked this agent to stop (for rules that wait)
    wire: ErrorFeedback = field(default_factory=lambda: ErrorFeedback(Codec()))  # how service payloads travel
    start_agents: Optional[int] = None  # an elastic run starts with this many (None: all K); the others come later


class AgentRule:
    """The agent's side of an algorithm.  Defaults do nothing, so a rule overrides only what it needs.

    Called in the training thread with the agent's lock held: :meth:`before_step` (before the forward
    pass), :meth:`after_backward` (gradients ready, before the optimizer step), :meth:`after_step`.
    Called in the training thread *without* the lock, between two steps: :meth:`between_steps` — it may
    block (a synchronous round) or call the parameter service.  Called from the exchange server thread:
    :meth:`yield_ready` without the lock (may wait until a shard is due), then :meth:`contribution` and
    :meth:`receive` with the lock held.
    """

    def __init__(self, ctx: AgentContext):
        self.ctx = ctx

    def before_step(self) -> None: ...

    def after_backward(self) -> None: ...

    def after_step(self) -> None: ...

    def between_steps(self) -> None: ...

    def hand_in(self) -> None:
        """The agent leaves the run (its executor is being decommissioned; agent-initiated algorithms): send the
        parameter service what it holds that the joint model lacks, in the training thread after its last step.
        Rules that exchange every few steps do their exchange now; those that send every step have nothing
        left to send."""

    def handed_in(self, shard: int, params: Params) -> Optional[Tuple[torch.Tensor, float, Dict[str, Any]]]:
        """The agent leaves the run (its executor is being decommissioned; driver-initiated algorithms): what it
        hands in for ``shard``, in the training thread after its last step — by default the contribution its
        next exchange would have taken; None when the driver already holds what it has (a round yielded)."""
        return self.contribution(shard, params)

    def waiting(self) -> bool:
        """Whether :meth:`between_steps` would block now, waiting for the driver (a simulator in virtual time parks
        the agent until a delivery instead of calling it; the runtime never asks)."""
        return False

    def on_reset(self) -> None:
        """The runtime put the model back to the latest joint model after a numerical fault (NaN/Inf) and
        gave it a fresh optimizer (``ctx.optimizer``); forget what was counted since."""

    def should_stop(self, requested: bool) -> bool:
        """Whether the training loop ends now (``requested``: the driver asked this agent to stop)."""
        return requested

    def receive(self, shard: int, pieces: List[torch.Tensor], params: Params) -> None:
        """A broadcast shard arrived (``pieces``: one tensor per segment, on the agent's device)."""

    def joined(self, pieces: List[List[torch.Tensor]], params: Params, state: Optional[torch.Tensor] = None) -> None:
        """The agent joined (a replacement, an elastic run's late agent): the runtime wrote the driver rule's join
        vectors (``pieces``, per shard) into the model and calls :meth:`on_reset` next; ``state`` is the driver
        rule's :meth:`DriverRule.join_state`, flat (None or empty where it has none).  By default each shard is
        received as a broadcast; rules whose broadcasts are not models (outer gradients) override it."""
        for s, p in enumerate(pieces):
            self.receive(s, p, params)

    def reset_target(self, shard: int, pieces: List[torch.Tensor]) -> List[torch.Tensor]:
        """Where a numerical fault's reset puts ``shard`` after the broadcast ``pieces`` arrived: the pieces
        themselves where the broadcast is the joint model (the default), the rule's own copy of it where the
        broadcast is something else (an outer gradient).  Fresh tensors that nothing writes afterwards."""
        return pieces

    def yield_ready(self, shard: int, params: Params, timeout_s: float) -> None:
        """Block until ``shard`` may be yielded for this cycle (default: at once)."""

    def contribution(self, shard: int, params: Params) -> Tuple[torch.Tensor, float, Dict[str, Any]]:
        """What goes up for ``shard``: (vector in the wire dtype on the CPU, weight in Eq. 9, extra report)."""
        return self.ctx.shards.read(shard), 1.0, {}

    def contribution_lost(self, shard: int, extra: Dict[str, Any]) -> None:
        """A contribution (its ``extra``) never reached the reduction (task retried, fetch failed): take back
        what :meth:`contribution` reset, so that its steps count in the next one (MPCA: τ)."""

    def close(self) -> None: ...


class ServiceAgent(AgentRule):
    """An agent rule of an agent-initiated algorithm (``exchange = "service"``): it calls the driver's parameter
    service on its own clock with :meth:`call_service`, the one round trip every such rule uses."""

    def __init__(self, ctx: AgentContext):
        super().__init__(ctx)
        if ctx.service is None:
            raise ValueError(f"{type(self).__name__} needs the driver's parameter service")

    def call_service(self, op: str, payload: torch.Tensor, **fields: Any) -> Tuple[Dict[str, Any], torch.Tensor]:
        """Send ``payload`` (one model-sized vector) with a request ``op`` and the agent's counters (which the
        driver turns into its report) plus ``fields``; the reply's header and vector (in ``payload``'s dtype).
        The calling thread waits for the answer, as the algorithms' workers do."""
        values = payload.numpy()
        header = {**self.ctx.stats(), **fields, "op": op, "agent": self.ctx.agent_id, "n": values.size}
        wire = self.ctx.wire  # the run's wire format, with this agent's error feedback per request kind
        reply, data = self.ctx.service.request(header, wire.encode(op, values))
        return reply, torch.from_numpy(wire.codec.decode(data, int(reply.get("n", values.size))))


class GradientPusher(ServiceAgent):
    """An agent rule that sends its mini-batch gradient to the parameter service (Rudra, PSP-SGD): the
    gradients of the exchanged tensors as one vector in the layout of shard 0 (zeros where a tensor has
    none, e.g. BatchNorm's running statistics)."""

    def __init__(self, ctx: AgentContext):
        super().__init__(ctx)
        from mpca.algorithm.sharding import exchanged_tensors

        n = len(ctx.shards.layout.specs)
        self._tensors = [t for _, t in exchanged_tensors(ctx.model, "average")][:n]

    def gradient(self) -> torch.Tensor:
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in self._tensors]
        return self.ctx.shards.layout.bind([g.detach() for g in grads]).read(0)


class RunningMean:
    """Count and mean of the values added since the last :meth:`take` (constant memory)."""

    def __init__(self):
        self.n, self.total = 0, 0.0

    def add(self, value: float) -> None:
        self.n += 1
        self.total += float(value)

    def take(self) -> Tuple[int, float]:
        n, mean = self.n, (self.total / self.n if self.n else float("nan"))
        self.n, self.total = 0, 0.0
        return n, mean


class DriverRule:
    """The driver's side of an algorithm.  Holds the joint model (one vector per shard) and whatever else
    the algorithm keeps; everything it must survive a restart with goes through :meth:`state_dict`."""

    deliver_before_yield: bool = False  # rounds: an agent's next contribution needs the delivery first

    def __init__(self, joint: List[torch.Tensor], agents: int):
        self.joint = [j.detach().clone() for j in joint]
        self.agents = agents
        self.lock = threading.Lock()  # service requests arrive on their own threads

    @property
    def num_shards(self) -> int:
        return len(self.joint)

    def shard_numel(self, shard: int) -> int:
        return self.joint[shard].numel()

    def stage_lag(self, first: bool = False) -> int:
        """Cycles from a shard's reduction to the job that broadcasts it (§4.2): with S ≥ 3 shards the reduction
        of cycle c is staged while job c + 1 runs and broadcast by job c + 2 (lag 2, Fig. 8); with S ≤ 2 it is
        staged when job c ends and broadcast by job c + 1 (lag 1, Figs. 6–7).  The pipeline's ``first``
        reduction is staged at once (lag 1) whatever S: no job is in flight to overlap its staging with, so
        its projection reaches the agents a cycle sooner, and the cycle after it broadcasts nothing (a
        deviation from Fig. 8, at the pipeline's fill only)."""
        return 2 if self.num_shards >= 3 and not first else 1

    def reduce_shard(self, cycle: int) -> int:
        """The shard every agent yields in ``cycle`` (driver-initiated algorithms: ``exchange = "cycle"``)."""
        return cycle % self.num_shards

    def cycle_params(self, cycle: int) -> Params:
        """JSON-able parameters sent with cycle ``cycle`` to every agent (with its broadcast and yield)."""
        return {}

    def on_reduced(self, cycle: int, shard: int, partial: WeightedSum) -> Optional[torch.Tensor]:
        """``partial`` holds Σ wᵢ xᵢ and Σ wᵢ of every agent's contribution of ``shard``; update the joint
        model and return what to broadcast to the agents (None: nothing)."""
        raise NotImplementedError

    def on_membership(self, agents: int) -> None:
        """``agents`` take part in the run now (it started with another number, or agents left, were lost or
        joined): settings that follow K adjust — EASGD's default α = 0.9/K (elastic symmetry), Rudra's gradients
        per update and hardsync's learning rate.  The reductions need nothing: they weigh whoever contributed.
        Called by the runtime when the count of agents present changes."""

    def takes_hand_in(self, shard: int, extra: Dict[str, Any]) -> bool:
        """Whether the contribution a leaving agent handed in (its ``extra`` report; :meth:`AgentRule.handed_in`)
        belongs in the reduction of ``shard`` staged now (default: any time — τ weighs what it carries)."""
        return True

    def serve(self, agent: int, header: Dict[str, Any], payload: torch.Tensor) -> Tuple[Dict[str, Any], Optional[torch.Tensor]]:
        """Answer an agent's parameter-service request (agent-initiated algorithms only)."""
        raise ValueError(f"{type(self).__name__} has no parameter service")

    def model_sized(self, header: Dict[str, Any], payload: torch.Tensor, op: str) -> torch.Tensor:
        """A service request's payload as one model-sized vector in the joint model's dtype, after checking
        that the request is ``op`` (ValueError otherwise: the service answers the agent with the error)."""
        if header.get("op") != op:
            raise ValueError(f"unknown op {header.get('op')!r}")
        x = payload.to(self.joint[0].dtype)
        if x.shape != self.joint[0].shape:
            raise ValueError(f"expected {self.joint[0].numel()} values, got {x.numel()}")
        return x

    def rendezvous(self, host: str, port: int = 0) -> Dict[str, Any]:
        """Start whatever the agents must meet at before training (e.g. a torch.distributed store, on
        ``port``, 0 for any) and return what they need to find it at ``host``; :meth:`close` ends it."""
        return {}

    def joint_vectors(self) -> List[torch.Tensor]:
        """A consistent copy of the joint model, one vector per shard."""
        with self.lock:
            return [j.clone() for j in self.joint]

    def join_vectors(self) -> List[torch.Tensor]:
        """Where a replacement agent starts (one vector per shard): the model the agents are pulled toward
        (default: the joint model)."""
        return self.joint_vectors()

    def join_state(self) -> List[torch.Tensor]:
        """What else of this rule a replacement's rule must hold to act as the agents already there (e.g. the
        outer momentum that every agent applies with the driver): vectors sent after the join vectors, exact,
        and handed to :meth:`AgentRule.joined` as one flat ``state``.  Default: nothing."""
        return []

    def join_payload(self) -> torch.Tensor:
        """What a replacement is sent, exact: the join vectors (every shard, in order), then the join state."""
        return torch.cat([v.reshape(-1) for v in self.join_vectors() + self.join_state()])

    def state_dict(self) -> Dict[str, Any]:
        return {"joint": [j.clone() for j in self.joint]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.joint = [torch.as_tensor(j).clone() for j in state["joint"]]

    def metrics(self) -> Dict[str, float]:
        """The algorithm's own figures since the last call (e.g. Rudra's mean staleness ⟨σ⟩ per update), added
        to each evaluation row of the history (and so to the CSV, MLflow and TensorBoard)."""
        return {}

    def on_stop(self) -> None:
        """The run is ending (called before the agents are told to stop): release anything that waits for
        other agents (e.g. a synchronous parameter server), so that every agent can finish its step."""

    def close(self) -> None: ...


class Algorithm(BaseModel):
    """Typed settings of one algorithm (the ``algorithm:`` configuration section) and its two rules.

    Subclasses set ``name`` (a ``Literal`` with a default), ``exchange`` and the factories; registering
    them (:func:`mpca.algorithm.registry.register`) makes ``algorithm.name: <name>`` work everywhere.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    name: str
    buffers: Literal["average", "local", "recalibrate"] = Field(
        "recalibrate", description="BatchNorm running statistics: exchanged and averaged with the weights, and "
        "re-estimated on training rows before the driver scores or saves the joint model (recalibrate, the "
        "default: measured on ResNet-20, docs/results/2026-11-28-workloads.md); exchanged and used as averaged "
        "(average); or kept by each agent, the driver re-estimating them (local)")
    min_cycle_interval_s: Optional[float] = Field(None, ge=0.0, description="at least this many seconds between "
                                                  "the driver's cycles (None: the algorithm's default: 0, as fast "
                                                  "as possible, where cycles exchange; 1 where they only observe)")
    # how the algorithm exchanges, the one switch: "cycle" — the driver's cycles run one Spark job each that
    # reduces and broadcasts (driver-initiated); "service" — agents call the driver's parameter service and the
    # cycles only observe (agent-initiated)
    exchange: ClassVar[Literal["cycle", "service"]] = "cycle"
    default_cycle_interval_s: ClassVar[float] = 0.0
    # the agents rebuild the initial model on their executors from ``model_fn`` and the seed, its weights left
    # out of their task; an agent whose rebuild differs takes the driver's model before it trains (a join,
    # mpca.runtime.initial) — False where an agent cannot wait for that (DDP's replicas step together at once)
    rebuilds_initial_model: ClassVar[bool] = True
    # the model a run is scored on: "joint" — the driver's joint model, built by the exchange; "agent" — agent 0's
    # own (DDP's replicas are identical; one agent alone is scored on its own model, not on the driver's snapshot of
    # it, taken once a cycle and up to a cycle late)
    scored_model: ClassVar[Literal["joint", "agent"]] = "joint"
    # the agents average among themselves every step (a collective: DDP's all-reduce through torch.distributed);
    # the driver only arranges their rendezvous and observes
    collective: ClassVar[bool] = False
    # its agents pause for the driver's model themselves (a round's end, an outer step due): they keep the cycles'
    # pace already, which training.lock_step must not add to (mpca.exchange.lock_step)
    waits_for_driver: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    # the wire format a run of this algorithm uses where ``wire.format`` is not set (config.WireSection.resolved)
    default_wire: ClassVar[str] = "fp32"

    @property
    def cycle_interval_s(self) -> float:
        """Seconds at least between two driver cycles: ``min_cycle_interval_s``, or the algorithm's default."""
        return self.default_cycle_interval_s if self.min_cycle_interval_s is None else self.min_cycle_interval_s

    @property
    def num_shards(self) -> int:
        """How many shards the model is cut into (only MPCA pipelines several)."""
        return 1

    def check_agents(self, agents: int) -> None:
        """Raise ValueError when this algorithm cannot run with ``agents`` agents."""

    def lock_step_problem(self) -> Optional[str]:
        """Why ``training.lock_step`` cannot pace this algorithm's agents (one line), or None: it paces agents that
        exchange through the driver's cycles and never wait for the driver themselves (mpca.exchange.lock_step)."""
        if self.exchange != "cycle" or self.collective:
            return (f"training.lock_step paces agents between the driver's exchange cycles; {self.name}'s agents "
                    "exchange without them: leave training.lock_step unset")
        if self.waits_for_driver:
            return (f"{self.name}'s agents wait for the driver's model themselves (its rounds are lock steps "
                    "already): leave training.lock_step unset (cluster.reduce: ordered makes its run reproducible)")
        return None

    def agent_factory(self) -> Callable[[AgentContext], AgentRule]:
        """A picklable callable building the agent rule on the executor (plain values only)."""
        raise NotImplementedError

    def driver_rule(self, joint: List[torch.Tensor], agents: int) -> DriverRule:
        raise NotImplementedError

    def wire_format(self, configured: Optional[str]) -> str:
        """The wire format a run of this algorithm uses: ``configured`` (``wire.format``), or, where it is not
        set, the algorithm's own default (:attr:`default_wire`)."""
        return configured or self.default_wire

    def shard_layout(self, module: torch.nn.Module) -> ShardLayout:
        """How the exchanged tensors of ``module`` are cut into :attr:`num_shards` shards (by bytes; Streaming
        DiLoCo: whole layers, its fragments).  The runtime, the trainer and the simulator all take it from here."""
        return ShardLayout.from_module(module, self.num_shards, self.buffers)


class ServiceAlgorithm(Algorithm):
    """The base of the agent-initiated algorithms (EASGD, Rudra, Hermans' servers, weak synchronization): their
    agents call the driver's parameter service (their rules are :class:`ServiceAgent` rules) and the driver's cycles
    only observe the service's latest reports, once a second unless ``min_cycle_interval_s`` says otherwise."""

    exchange: ClassVar[Literal["cycle", "service"]] = "service"
    default_cycle_interval_s: ClassVar[float] = 1.0
