"""``mpca plan``: which algorithm and how many agents for a model, a step time and a link — predicted by short
simulations (issue 26, part 4).

What is simulated.  The *time* model is the user's: every step takes ``device_step_s`` (given or measured on this host),
and every transfer is charged the bytes of the user's model (its exchanged values in the wire format) on
``link_bps`` with the calibrated constants of :mod:`mpca.sim.constants`.  The *gradients* come from a proxy:
the teacher task with a small MLP (``proxy_hidden``), which the agents really train with the library's rules.
The proxy's transfers are scaled to the user's bytes exactly (:func:`mpca.sim.network.scaled_for_bytes`), so
cycle times, round times and queueing at the driver are those of the user's model; how many *steps* an
algorithm needs to reach the target is the proxy's, not the user's model's.

The target: the holdout error falls to ``reduction`` × its start (the untrained proxy's error on a holdout shared
by every run), or to ``target_error``.  A reference run of one agent alone (algorithm ``single``) finds its time t₁; every cell of the
grid (algorithm × K) runs until the target or until ``horizon`` × t₁ (slower than that: "not within"); with
``single`` in the list, K = 1 is its row alone (the other algorithms start at K = 2).

The recommendation (:func:`recommend`): among the cells that reached the target, those within ``tolerance`` of
the fastest prediction; of them the one with the fewest agents (then the faster, then the earlier in the
algorithm list) — more agents for less than ``tolerance`` of speed is not worth their cost.

The user's task (issue 55, part 6).  The proxy gains from more agents what *it* gains, not what the user's task
does.  With a ``workload`` (``mpca plan -c JOB.yaml``: :class:`~mpca.sim.workload.SampleWorkload`, the job's own
model on a sample of its own rows) every cell trains the user's model instead: a short learning curve per cell,
its transfers the model's own bytes.  The coarse alternative keeps the proxy and corrects it with the user's
gradient noise scale ``noise_scale`` (``--gradients proxy`` measures it with a pilot, :mod:`mpca.sim.noise`): the
proxy's is measured after the same pilot and each simulated time at K agents is divided by
``ideal(B_user, b, K) / ideal(B_proxy, b, K)`` (:func:`noise_factor`; ``ideal`` is
:func:`~mpca.sim.noise.ideal_speedup`, McCandlish et al.'s bound on the fewer steps of K·b samples a step).  Measured
(docs/results/2026-11-28-plan.md), it does not capture mpca's gain: model averaging under Adam gained more than the
data-parallel ceiling of the task's noise scale.  The output says which gain the times carry.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mpca.algorithm.base import Algorithm
from mpca.algorithm.registry import build as build_algorithm
from mpca.algorithm.sharding import ShardLayout
from mpca.algorithm.wire import DEFAULT_BLOCK, Codec, WireFormat
from mpca.exchange.device import ComputeModel
from mpca.sim.constants import NetworkConstants
from mpca.sim.grid import GridRow, crossing_time, run_cell, split_rows
from mpca.sim.network import cycle_time, scaled_for_bytes
from mpca.sim.noise import PILOT_STEPS, NoiseScale, ideal_speedup, pilot
from mpca.sim.simulator import REFUSED, SimConfig, simulate
from mpca.sim.workload import SampleWorkload, TeacherWorkload, Workload

DEFAULT_ALGORITHMS = ("single", "mpca", "sync", "diloco", "easgd", "ddp")
KEY_SETTINGS = ("every", "shards", "n")
PERIODIC = ("sync", "diloco", "easgd")  # algorithms with a period ``every``  # shown in the table's settings column when the algorithm has them

NOT_MODELLED = (
    "CPU contention: the exchange's encoding, Spark's JVMs and the agents sharing a host's cores (on a small "
    "host this made the measured mpca cycles 26-39% longer than simulated, docs/simulator/plan.md)",
    "host<->device copies, data loading and input pipelines (only the step time you gave or measured)",
    "start-up: the Spark session, executors and the agents' first model (predicted times count from the first step)",
    "corrective jobs, NaN resets; agents lost or joining (the plan assumes none; mpca simulate --hang/--lose "
    "models them); stragglers unless you give --device-speed",
    "contention between a broadcast and a reduce on one executor's port",
)


class PlanConfig(BaseModel):
    """One plan: the user's model (``parameters`` exchanged values, a step of ``device_step_s``), the link, the agent
    counts and algorithms to try, and how the prediction is made (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameters: int = Field(ge=1, description="values the user's model exchanges")
    device_step_s: float = Field(gt=0, description="T: one training step's device time (s; emulation.device_step_s)")
    link_bps: float = Field(gt=0, description="every host's port, each direction")
    exchange_cpu_s_per_mb: float = Field(0.0, ge=0, description="CPU seconds per MB an agent moves in an exchange "
                                         "(mpca.sim.constants; 0: not modelled)")
    host_cores: Optional[int] = Field(None, ge=1, description="every host's exchange shares this many cores")
    agents: Tuple[int, ...] = (1, 2, 4, 8, 16)
    algorithms: Tuple[str, ...] = DEFAULT_ALGORITHMS
    settings: Dict[str, Any] = Field(default_factory=dict, description="algorithm settings, as the YAML's "
                                     "algorithm section (flat keys, or a subsection per algorithm)")
    wire: WireFormat = "fp32"
    batch_size: int = Field(64, ge=1)
    device_speed: Dict[int, float] = Field(default_factory=dict, description="stragglers: agent → speed in (0, 1], "
                                           "its steps take T / speed (emulation.device_speed)")
    reduction: float = Field(0.3, gt=0, lt=1, description="target: holdout error × this")
    target_error: Optional[float] = Field(None, gt=0, lt=1, description="target: this holdout error (instead of "
                                          "reduction × the start)")
    target_loss: Optional[float] = Field(None, gt=0, description="target: this holdout loss in nats (a language "
                                         "model's; the times follow the loss instead of the error)")
    tolerance: float = Field(0.1, ge=0, description="the recommendation's slack over the fastest prediction")
    horizon: float = Field(2.0, gt=0, description="each run's virtual time at most, × one agent's time")
    evals: int = Field(120, ge=5, description="evaluations per horizon (the times' resolution)")
    proxy_hidden: Tuple[int, ...] = (64, 64)
    rows: int = Field(50_000, ge=64, description="the data set's rows, split evenly among the K agents")
    holdout: int = Field(1000, ge=50)
    reference_steps: int = Field(3000, ge=10, description="one agent's step budget to reach the target")
    seeds: int = Field(1, ge=1, le=10)
    noise_scale: Optional[float] = Field(None, ge=0, description="the user's task's gradient noise scale B (samples; "
                                         "mpca plan -c measures it): each K's simulated speed-up is scaled by the "
                                         "ratio of its and the proxy's ceiling (module doc); None: the proxy's own")
    pilot_steps: int = Field(PILOT_STEPS, ge=0, description="training steps before a noise scale is measured (the "
                             "proxy's, and the user's with mpca plan -c)")
    periods: Literal["rule-of-five", "defaults"] = Field(
        "rule-of-five", description="sync's, DiLoCo's and EASGD's period where the user set none: H = 5 r at each "
                                    "K (SparkNet's 1:5 rule, the paper's §3.1.2), or the library's defaults")

    @field_validator("agents")
    @classmethod
    def _agents(cls, v: Tuple[int, ...]) -> Tuple[int, ...]:
        if not v or any(k < 1 or k > 1024 for k in v):
            raise ValueError(f"agent counts lie in 1..1024, got {list(v)}")
        return tuple(sorted(set(v)))

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, v: Tuple[str, ...]) -> Tuple[str, ...]:
        if not v:
            raise ValueError("give at least one algorithm")
        for name in v:
            if name in REFUSED:
                raise ValueError(f"the simulator does not run {name}: {REFUSED[name]}")
        return tuple(dict.fromkeys(v))

    @property
    def metric(self) -> str:
        return "loss" if self.target_loss is not None else "error"

    @model_validator(mode="after")
    def _one_target(self):
        if self.target_error is not None and self.target_loss is not None:
            raise ValueError("give target_error or target_loss, not both")
        return self

    @model_validator(mode="after")
    def _settings_build(self):
        self.built()  # an unknown algorithm or a wrong setting fails here, before any simulation
        return self

    def built(self) -> List[Algorithm]:
        return [build_algorithm({**self.settings, "name": name}) for name in self.algorithms]

    def network(self) -> NetworkConstants:
        return NetworkConstants(link_bps=self.link_bps, exchange_cpu_s_per_mb=self.exchange_cpu_s_per_mb,
                                host_cores=self.host_cores)

    def proxy(self) -> TeacherWorkload:
        """The gradient proxy: the teacher task and a small MLP; one agent's rows (the grid splits them)."""
        return split_rows(TeacherWorkload(hidden=tuple(self.proxy_hidden), holdout=self.holdout), 1, self.rows)


@dataclass
class PlanResult:
    config: PlanConfig
    proxy_parameters: int
    byte_scale: float  # user's bytes / proxy's bytes per transfer
    start_error: float  # the metric's (cfg.metric: the holdout error, or loss in nats)
    target_error: float
    reference_s: float  # one agent alone to the target
    horizon_s: float
    eval_every_s: float
    rows: List[GridRow]
    recommended: Optional[GridRow]
    wall_s: float = 0.0
    proxy_noise: Optional[NoiseScale] = None  # the proxy's noise scale, measured when the user's was given
    proxy_times: Dict[str, Optional[float]] = field(default_factory=dict)  # "algorithm@K": the uncorrected time
    workload: Optional[Dict[str, Any]] = None  # the user's own task where it replaced the proxy (mpca plan -c)

    def speedup(self, row: GridRow) -> Optional[float]:
        return self.reference_s / row.time_s if row.time_s else None

    def to_dict(self) -> Dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("config", "rows", "recommended", "proxy_noise")}
        out["proxy_noise"] = self.proxy_noise.to_dict() if self.proxy_noise else None
        out["config"] = self.config.model_dump(mode="json")
        out["rows"] = [r.to_dict() for r in self.rows]
        out["recommended"] = self.recommended.to_dict() if self.recommended else None
        out["yaml"] = yaml_snippet(self) if self.recommended else None
        return out


def exchange_ratio(cfg: PlanConfig, agents: int) -> float:
    """r: one exchange of the whole model (a cycle that reduces and broadcasts all of it,
    :func:`~mpca.sim.network.cycle_time`, on the user's link with the user's bytes) in training steps."""
    nbytes = Codec(cfg.wire, DEFAULT_BLOCK, "float32").nbytes(cfg.parameters)
    return cycle_time(agents, nbytes, nbytes, cfg.network()) / cfg.device_step_s


def user_set(settings: Dict[str, Any], name: str, key: str) -> bool:
    own = settings.get(name)
    return key in settings or (isinstance(own, dict) and key in own)


def algorithm_at(cfg: PlanConfig, name: str, agents: int) -> Algorithm:
    """Algorithm ``name`` with the user's settings; a periodic one (sync, DiLoCo, EASGD) without a period of
    the user's gets H = max(1, round(5 r)) at this K (``periods = "rule-of-five"``: communication a fifth of
    the computation between two exchanges, the rule :mod:`mpca.bench.tuning` centres its grid on)."""
    settings = {**cfg.settings, "name": name}
    if cfg.periods == "rule-of-five" and name in PERIODIC and not user_set(cfg.settings, name, "every"):
        settings["every"] = max(1, round(5 * exchange_ratio(cfg, agents)))
    return build_algorithm(settings)


def recommend(rows: List[GridRow], tolerance: float) -> Optional[GridRow]:
    """The fewest agents within ``tolerance`` of the fastest predicted time (then the faster, then the first
    listed); None when no cell reached the target."""
    reached = [(i, r) for i, r in enumerate(rows) if r.time_s is not None]
    if not reached:
        return None
    best = min(r.time_s for _, r in reached)
    near = [(i, r) for i, r in reached if r.time_s <= (1 + tolerance) * best + 1e-12]
    return min(near, key=lambda ir: (ir[1].agents, ir[1].time_s, ir[0]))[1]


def noise_factor(user_b: float, proxy_b: float, batch: int, agents: int) -> float:
    """How many times fewer steps K agents save on the user's task than on the proxy: the ratio of the two noise
    scales' ceilings (module doc); 1 at K = 1."""
    return ideal_speedup(user_b, batch, agents) / ideal_speedup(proxy_b, batch, agents)


def corrected(rows: List[GridRow], user_b: float, proxy_b: float, batch: int) -> List[GridRow]:
    """The rows with each reached time divided by :func:`noise_factor` at its K (a row not reached stays so: its
    horizon was the proxy's)."""
    return [replace(r, time_s=r.time_s / noise_factor(user_b, proxy_b, batch, r.agents),
                    times=[t / noise_factor(user_b, proxy_b, batch, r.agents) if t is not None else None
                           for t in r.times])
            if r.time_s is not None else r for r in rows]


def proxy_noise_scale(cfg: PlanConfig, work: TeacherWorkload) -> NoiseScale:
    """The proxy's noise scale after ``pilot_steps`` of one agent at the plan's batch (as the user's pilot)."""
    model = work.model_fn()
    x, y = work.agent_rows(0, 1)
    return pilot(model, work.loss_fn, work.optimizer_fn(model.parameters()), x, y, cfg.batch_size, cfg.pilot_steps)


def proxy_values(work: Workload) -> int:
    return ShardLayout.from_module(work.model_fn(), 1, "average").total_numel


def plan(cfg: PlanConfig, progress: Optional[Callable[[GridRow], None]] = None,
         workload: Optional[SampleWorkload] = None) -> PlanResult:
    """The reference run and the grid (module doc), with torch on one thread (restored after): the proxy's
    steps are too small for threads to pay, and a busy host's cores make them wait.  ``workload``: the user's own
    model on a sample of the user's rows instead of the proxy (``mpca plan -c``): each cell is then a short
    learning curve of the user's task, its transfers the model's own bytes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _plan(cfg, progress, workload)
    finally:
        torch.set_num_threads(threads)


def _plan(cfg: PlanConfig, progress: Optional[Callable[[GridRow], None]],
          workload: Optional[SampleWorkload]) -> PlanResult:
    wall = time.perf_counter()
    work = cfg.proxy() if workload is None else workload.split(1, cfg.rows)
    proxy_n = proxy_values(work)
    codec = Codec(cfg.wire, DEFAULT_BLOCK, "float32")
    scale = codec.nbytes(cfg.parameters) / codec.nbytes(proxy_n)
    net = scaled_for_bytes(cfg.network(), scale)
    compute = ComputeModel(step_s=cfg.device_step_s, speeds=dict(cfg.device_speed))
    metric = cfg.metric
    one = SimConfig(algorithm="single", agents=1, wire=cfg.wire, network=net, compute=compute, workload=work,
                    batch_size=cfg.batch_size, eval_every_s=5 * cfg.device_step_s, max_virtual_s=cfg.device_step_s / 2, metric=metric)
    first = simulate(one).history[0]  # the untrained model (after the first step's hooks, as every run)
    start = first.holdout_error if metric == "error" else first.holdout_loss
    given = cfg.target_error if metric == "error" else cfg.target_loss
    target = given if given is not None else cfg.reduction * start
    rows_total = cfg.rows if workload is None else min(cfg.rows, len(workload.y))
    ref = run_cell(one.model_copy(update={"max_virtual_s": cfg.reference_steps * cfg.device_step_s, "targets": (target,)}),
                   build_algorithm("single"), 1, range(cfg.seeds), rows_total=rows_total)
    if ref.time_s is None:
        raise ValueError(f"one agent did not bring the holdout {metric} from {start:.3f} to {target:.3f} "
                         f"in {cfg.reference_steps} steps: aim higher (--reduction 0.6, or a larger --target-{metric})")
    t1 = ref.time_s
    horizon = cfg.horizon * t1
    base = SimConfig(agents=1, wire=cfg.wire, network=net, compute=compute, workload=work,
                     batch_size=cfg.batch_size, max_virtual_s=horizon, eval_every_s=horizon / cfg.evals,
                     targets=(target,), metric=metric)
    rows = []
    for name in cfg.algorithms:
        for k in cfg.agents:
            if name == "single" and k == 1:
                row = ref
            elif k == 1 and "single" in cfg.algorithms:
                row = GridRow(name, k, {}, skipped="one agent is single's row")
            else:
                row = run_cell(base, algorithm_at(cfg, name, k), k, range(cfg.seeds), rows_total=rows_total)
            rows.append(row)
            if progress is not None:
                progress(row)
    proxy_noise, proxy_times = None, {}
    if cfg.noise_scale is not None and workload is None:
        proxy_noise = proxy_noise_scale(cfg, work)
        proxy_times = {f"{r.algorithm}@{r.agents}": r.time_s for r in rows if not r.skipped}
        rows = corrected(rows, cfg.noise_scale, proxy_noise.b_simple, cfg.batch_size)
    return PlanResult(config=cfg, proxy_parameters=proxy_n, byte_scale=scale, start_error=start,
                      target_error=target, reference_s=t1, horizon_s=horizon, eval_every_s=horizon / cfg.evals,
                      rows=rows, recommended=recommend(rows, cfg.tolerance), wall_s=time.perf_counter() - wall,
                      proxy_noise=proxy_noise, proxy_times=proxy_times,
                      workload=None if workload is None else workload.describe())


# ---------------------------------------------------------------------- what it prints
def settings_label(row: GridRow, user: Dict[str, Any]) -> str:
    """The key settings (every, shards, n) and any the user set for this algorithm."""
    own = user.get(row.algorithm) if isinstance(user.get(row.algorithm), dict) else {}
    keys = [k for k in row.settings if k in KEY_SETTINGS or k in own or (k in user and not isinstance(user[k], dict))]
    return ", ".join(f"{k}={row.settings[k]}" for k in keys)


def table(res: PlanResult) -> str:
    head = "| algorithm | settings | K | predicted s to target | speed-up vs 1 agent | agent steps | |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in res.rows:
        if r.skipped:
            continue
        if r.failed:
            cells = ["—", "—", "—", "failed: " + r.failed]
        elif r.time_s is None:
            cells = [f"> {res.horizon_s:.1f}", f"< {1 / res.config.horizon:.2f}", f"{r.steps:.0f}", ""]
        else:
            cells = [f"{r.time_s:.1f}", f"{res.speedup(r):.2f}", f"{r.steps:.0f}", ""]
        if r is res.recommended:
            cells[3] = "**recommended**"
        lines.append(f"| {r.algorithm} | {settings_label(r, res.config.settings)} | {r.agents} | " + " | ".join(cells)
                     + " |")
    skipped: Dict[str, List[GridRow]] = {}
    for r in res.rows:
        if r.skipped:
            skipped.setdefault(r.skipped if r.agents == 1 else r.algorithm, []).append(r)
    for rs in skipped.values():
        names = ", ".join(dict.fromkeys(r.algorithm for r in rs))
        ks = ", ".join(str(k) for k in dict.fromkeys(r.agents for r in rs))
        lines.append(f"not run: {names} at K = {ks} ({rs[0].skipped})")
    return "\n".join(lines)


def yaml_snippet(res: PlanResult) -> str:
    """The recommendation as the keys of a ``mpca train`` config (conf/*.yaml)."""
    r = res.recommended
    if r is None:
        return ""
    defaults = build_algorithm(r.algorithm).model_dump(mode="json", exclude={"name"})
    own = {k: v for k, v in r.settings.items() if k in KEY_SETTINGS or v != defaults.get(k)}
    doc = {"training": {"agents": r.agents, "batch_size": res.config.batch_size},
           "algorithm": {"name": r.algorithm, **({r.algorithm: own} if own else {})},
           "wire": {"format": res.config.wire}}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110).rstrip()


def gain_line(res: PlanResult) -> str:
    """Which gain from more samples per second the times carry: the proxy's own, or the user's noise scale's."""
    cfg = res.config
    if res.workload:
        return "gain from more agents: YOUR task's own (its model trained on its rows in every cell)"
    if cfg.noise_scale is None or res.proxy_noise is None:
        return ("gain from more agents: the PROXY's own (its gradient noise scale, not your task's); give your job "
                "(mpca plan -c JOB.yaml) to train your own model in every cell, or --noise-scale B")
    ks = [k for k in cfg.agents if k > 1]
    factors = ", ".join(f"K={k}: /{noise_factor(cfg.noise_scale, res.proxy_noise.b_simple, cfg.batch_size, k):.2f}"
                        for k in ks)
    return (f"gain from more agents: YOUR task's gradient noise scale B = {cfg.noise_scale:.3g} against the proxy's "
            f"B = {res.proxy_noise.b_simple:.3g} (after {res.proxy_noise.steps} pilot steps at batch "
            f"{cfg.batch_size}); each simulated time divided by the ratio of their ceilings (1 + B/b)/(1 + B/(Kb)) "
            f"(McCandlish et al. 2018): {factors}")


def assumptions(res: PlanResult) -> List[str]:
    cfg = res.config
    lo = min([k for k in cfg.agents if k > 1] or cfg.agents)
    rate = "unlimited" if math.isinf(cfg.link_bps) else f"{cfg.link_bps / 1e6:g} Mbit/s"
    return [
        f"network: {cfg.network().describe()} (mpca/sim/constants.py, calibrated on the emulated cluster)",
        f"time: every step {cfg.device_step_s * 1e3:.3g} ms; every transfer charged the bytes of {cfg.parameters:,} values "
        f"in {cfg.wire} on {rate}" + ("" if res.workload else f" (the proxy's transfers x {res.byte_scale:.4g}, "
                                      "exact: mpca.sim.network.scaled_for_bytes)"),
        (f"gradients: YOUR model ({res.proxy_parameters:,} values) on {res.workload['sample_rows']:,} rows of your job's "
         f"data ({res.workload['name']}), split among the K agents, scored on {res.workload['holdout']:,} held-out "
         f"rows, batch {cfg.batch_size}: each cell a short learning curve of your own task" if res.workload else
         f"gradients: a PROXY — the teacher task (64 features, 10 classes) and an MLP "
         f"64-{'-'.join(map(str, cfg.proxy_hidden))}-10 ({res.proxy_parameters:,} parameters, Adam 1e-3, batch "
         f"{cfg.batch_size}), {cfg.rows:,} rows split among the K agents; how many steps each algorithm needs is the "
         "proxy's, not your model's, and the gain from more agents can differ several-fold (docs/simulator/plan.md)"
         if abs(res.byte_scale - 1) > 0.01 else
         f"gradients: the teacher MLP 64-{'-'.join(map(str, cfg.proxy_hidden))}-10 itself ({res.proxy_parameters:,} "
         f"parameters, Adam 1e-3, batch {cfg.batch_size}) on the teacher task, {cfg.rows:,} rows split among the K "
         "agents"),
        f"target: holdout {cfg.metric} from {res.start_error:.3f} to {res.target_error:.3f} "
        f"({res.target_error / res.start_error:.2g} of its start); "
        f"one agent alone: {res.reference_s:.1f} s; each run at most {res.horizon_s:.1f} s (x{cfg.horizon:g}); "
        f"evaluated every {res.eval_every_s:.2g} s, the crossing interpolated; mean of {cfg.seeds} seed(s)",
        ("periods (sync, diloco, easgd; unless you set them): H = 5 r at each K, r = one whole-model exchange "
         f"in steps (SparkNet's 1:5 rule): r = {exchange_ratio(cfg, lo):.3g} at K = {lo}, "
         f"{exchange_ratio(cfg, max(cfg.agents)):.3g} at K = {max(cfg.agents)}") if cfg.periods == "rule-of-five"
        else "periods: the library's defaults (sync 50, diloco 50, easgd 10) unless you set them",
        gain_line(res),
        "recommended: the fewest agents within "
        f"{cfg.tolerance:.0%} of the fastest prediction",
        "not modelled: " + "; ".join(NOT_MODELLED),
    ]


__all__ = ["DEFAULT_ALGORITHMS", "PlanConfig", "PlanResult", "algorithm_at", "assumptions", "corrected",
           "exchange_ratio", "gain_line", "noise_factor", "plan", "proxy_noise_scale", "recommend", "settings_label",
           "table", "yaml_snippet"]
