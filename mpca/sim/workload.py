"""What the simulated agents train: the model, loss and optimizer factories and each agent's rows.

The default is the benchmark's task (``conf/teacher_mlp.yaml``): rows of :class:`mpca.data.synthetic.TeacherTask`
(each agent its own disjoint block of rows, the holdout after them) and :class:`mpca.models.MLP`.
:class:`SampleWorkload` is a job's own: its model, loss and optimizer, and rows read on this machine
(:func:`mpca.data.sample.local_sample`), split in contiguous blocks among the agents as Spark's partitions are.  With
``split_rows`` the holdout is instead the runtime's own: the rows of the task's first ``split_rows`` that
:func:`mpca.data.split.hash_split` (the trainer's split of ``data.holdout``) puts in the holdout, and the agents'
blocks leave those rows out, as the runtime's agents never see them."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import numpy as np
import torch

from mpca.data.split import EVALUATION_ROWS, evaluation_subset, holdout_mask
from mpca.data.synthetic import BLOCK, TeacherTask
from mpca.models import MLP, build_optimizer, cross_entropy


@functools.lru_cache(maxsize=4)
def _hash_holdout(task: TeacherTask, rows: int, fraction: float, seed: int,
                  max_rows: int) -> Tuple[np.ndarray, np.ndarray]:
    """The rows the trainer evaluates on when it trains on the task's first ``rows`` rows: its hash split's
    holdout, generated block by block (a 1 M-row task: 1.6 s, without keeping the rows it drops), then the
    ``max_rows`` of them it keeps (:func:`mpca.data.split.evaluation_subset`)."""
    xs, ys = [], []
    for b in range(-(-rows // BLOCK)):
        x, y = TeacherTask.block(task, b)
        n = min(len(y), rows - b * BLOCK)
        x, y = x[:n], y[:n]
        keep = holdout_mask(x, y, fraction, seed)
        xs.append(x[keep])
        ys.append(y[keep])
    x, y = np.concatenate(xs), np.concatenate(ys)
    kept = evaluation_subset(x, y, seed, max_rows)
    return x[kept], y[kept]


@functools.lru_cache(maxsize=256)
def _block(task: TeacherTask, b: int) -> Tuple[np.ndarray, np.ndarray]:
    return TeacherTask.block(task, b)


class CachedTeacherTask(TeacherTask):
    """The teacher task with its generated blocks kept (at most 256 blocks of 4,096 rows, ~270 MB): the many
    short simulations of ``mpca plan`` and the scaling study draw the same rows again and again, and
    generating them (the teacher's labels) costs more than training the plan's proxy on them."""

    def block(self, b: int) -> Tuple[np.ndarray, np.ndarray]:
        return _block(self, b)


@dataclass(frozen=True)
class TeacherWorkload:
    """``rows_per_agent`` teacher rows per agent (agent a: rows [a·n, (a+1)·n)), ``holdout`` rows after every
    agent's — or from row ``holdout_at`` (at or after the last agent's rows), so that runs with different K
    share one holdout; an MLP with ``hidden`` widths; Adam or SGD at ``lr``.

    ``split_rows``: the holdout the runtime evaluates on when it trains on the task's first ``split_rows`` rows
    with ``data.holdout: split_fraction`` and ``seed: split_seed`` (the hash split: about that fraction of them,
    ``holdout`` and ``holdout_at`` unused) and evaluates ``split_max_rows`` of them (``data.holdout_max_rows``);
    an agent's block then holds fewer training rows by that fraction.
    Holdouts of 10,000 rows differ by ±0.4% error from sampling alone, about the size of the plateau's slope
    near the benchmark's tightest target, so comparing with the runtime needs its very rows."""

    hidden: Tuple[int, ...] = (1024, 1024)
    features: int = 64
    classes: int = 10
    teacher_hidden: int = 64
    rows_per_agent: int = 20_000
    holdout: int = 2_000
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    seed: int = 0
    holdout_at: Optional[int] = None
    split_rows: Optional[int] = None
    split_fraction: float = 0.01
    split_seed: int = 0
    split_max_rows: int = EVALUATION_ROWS

    def __post_init__(self):
        if self.rows_per_agent < 1 or self.holdout < 1:
            raise ValueError("rows_per_agent and holdout must be >= 1")
        if self.holdout_at is not None and self.holdout_at < 0:
            raise ValueError(f"holdout_at must be >= 0, got {self.holdout_at}")
        if self.optimizer not in ("adam", "adamw", "sgd"):
            raise ValueError(f"optimizer must be adam, adamw or sgd, got {self.optimizer!r}")
        if self.split_rows is not None and (self.split_rows < 1 or not 0.0 < self.split_fraction < 1.0
                                            or self.split_max_rows < 1):
            raise ValueError(f"split_rows must be >= 1, split_fraction in (0, 1) and split_max_rows >= 1, got "
                             f"{self.split_rows}, {self.split_fraction} and {self.split_max_rows}")

    def split(self, agents: int, rows_total: int) -> "TeacherWorkload":
        """One data set of ``rows_total`` rows split evenly among the agents, the holdout after it (the same for
        every K)."""
        if rows_total < agents:
            raise ValueError(f"{rows_total} rows cannot be split among {agents} agents")
        return dataclasses.replace(self, rows_per_agent=rows_total // agents, holdout_at=rows_total)

    def describe(self) -> dict:
        return dataclasses.asdict(self)

    def calibration_rows(self, agents: int) -> Optional[torch.Tensor]:
        return None  # an MLP: no BatchNorm

    def holdout_start(self, agents: int) -> int:
        lo = agents * self.rows_per_agent
        if self.holdout_at is None:
            return lo
        if self.holdout_at < lo:
            raise ValueError(f"holdout_at = {self.holdout_at} overlaps the {agents} agents' rows (they end at {lo})")
        return self.holdout_at

    def task(self, agents: int) -> TeacherTask:
        rows = max(self.split_rows, agents * self.rows_per_agent) if self.split_rows is not None else \
            self.holdout_start(agents) + self.holdout
        return CachedTeacherTask(rows=rows, features=self.features, classes=self.classes, hidden=self.teacher_hidden,
                                 seed=self.seed)

    @property
    def model_fn(self) -> Callable[[], torch.nn.Module]:
        return functools.partial(MLP, self.features, tuple(self.hidden), self.classes)

    @property
    def loss_fn(self):
        return cross_entropy

    @property
    def optimizer_fn(self):
        return functools.partial(build_optimizer, self.optimizer, self.lr, self.momentum, 0.0)

    def agent_rows(self, agent: int, agents: int) -> Tuple[torch.Tensor, torch.Tensor]:
        lo = agent * self.rows_per_agent
        x, y = self._rows(agents, np.arange(lo, lo + self.rows_per_agent))
        if self.split_rows is not None:  # the runtime's agents never see a holdout row
            keep = ~torch.from_numpy(holdout_mask(x.numpy(), y.numpy(), self.split_fraction, self.split_seed))
            keep[max(0, self.split_rows - lo):] = True  # rows past the split's are nobody's holdout
            x, y = x[keep], y[keep]
        return x, y

    def holdout_rows(self, agents: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.split_rows is not None:
            x, y = _hash_holdout(self.task(agents), self.split_rows, self.split_fraction, self.split_seed,
                                 self.split_max_rows)
            return torch.from_numpy(x), torch.from_numpy(y)
        lo = self.holdout_start(agents)
        return self._rows(agents, np.arange(lo, lo + self.holdout))

    def _rows(self, agents: int, ids: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = self.task(agents).take(ids)
        return torch.from_numpy(x), torch.from_numpy(y)


class SampleWorkload:
    """A job's own task in the simulator: ``model_fn``, ``loss_fn`` and ``optimizer_fn`` (as
    :func:`mpca.models.training_functions` builds them), training rows ``x``, ``y`` (the first ``rows_per_agent`` ×
    K of them split in contiguous blocks among the K agents) and holdout rows ``hx``, ``hy``; ``calibration``: how
    many training rows re-estimate a BatchNorm model's statistics before each score (``eval.calibration_rows``;
    the simulator does it where the algorithm's ``buffers`` is not ``average``, as the runtime's evaluator)."""

    def __init__(self, model_fn: Callable[[], torch.nn.Module], loss_fn: Callable, optimizer_fn: Callable,
                 x: torch.Tensor, y: torch.Tensor, hx: torch.Tensor, hy: torch.Tensor, rows_per_agent: int = 0,
                 calibration: int = 512, name: str = "job"):
        if len(y) < 1 or len(hy) < 1:
            raise ValueError(f"a workload needs training and holdout rows, got {len(y)} and {len(hy)}")
        self.model_fn, self.loss_fn, self.optimizer_fn = model_fn, loss_fn, optimizer_fn
        self.x, self.y, self.hx, self.hy = x, y, hx, hy
        self.rows_per_agent = rows_per_agent or len(y)
        self.calibration, self.name = calibration, name

    def split(self, agents: int, rows_total: int) -> "SampleWorkload":
        rows_total = min(rows_total, len(self.y))
        if rows_total < agents:
            raise ValueError(f"{rows_total} rows cannot be split among {agents} agents")
        return SampleWorkload(self.model_fn, self.loss_fn, self.optimizer_fn, self.x, self.y, self.hx, self.hy,
                              rows_total // agents, self.calibration, self.name)

    def describe(self) -> dict:
        return {"name": self.name, "rows_per_agent": self.rows_per_agent, "holdout": len(self.hy),
                "sample_rows": len(self.y)}

    def agent_rows(self, agent: int, agents: int) -> Tuple[torch.Tensor, torch.Tensor]:
        lo = agent * self.rows_per_agent
        if lo + self.rows_per_agent > len(self.y):
            raise ValueError(f"agent {agent} of {agents}: {self.rows_per_agent} rows each exceed the sample's "
                             f"{len(self.y)}")
        return self.x[lo:lo + self.rows_per_agent], self.y[lo:lo + self.rows_per_agent]

    def holdout_rows(self, agents: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.hx, self.hy

    def calibration_rows(self, agents: int) -> Optional[torch.Tensor]:
        """The first training rows, as the runtime's driver reads them (:meth:`mpca.trainer.Trainer._calibration`)."""
        return self.x[:self.calibration]


def job_workload(job, rows: int, holdout: Optional[int]) -> SampleWorkload:
    """A job's (:class:`~mpca.config.JobConfig`) own task: its model, loss and optimizer, ``rows`` of its training
    rows read on this machine, and its held-out rows (its own where it has them, else ``holdout`` rows of the sample
    set aside, disjoint from the training ones; None: the job's ``data.holdout`` share of the rows read, at most
    ``data.holdout_max_rows``, as its run holds out)."""
    from mpca.data.sample import local_holdout, local_sample
    from mpca.models import training_functions

    model_fn, loss_fn, optimizer_fn = training_functions(job.model, job.optimizer)
    own = local_holdout(job.data, job.data.holdout_max_rows if holdout is None else holdout)
    x, y = local_sample(job.data, rows + (0 if own or holdout is None else holdout))
    if own is None and holdout is None:
        holdout = min(job.data.holdout_max_rows, max(1, int(job.data.holdout * len(y))))
    if own is None:
        if len(y) <= holdout:
            raise ValueError(f"the job's data has {len(y)} rows: too few to set {holdout} aside and train on the rest")
        own, (x, y) = (x[-holdout:], y[-holdout:]), (x[:-holdout], y[:-holdout])
    name = job.data.dataset or job.data.path or "job"
    return SampleWorkload(model_fn, loss_fn, optimizer_fn, x, y, *own, calibration=job.eval.calibration_rows,
                          name=str(name))


Workload = Union[TeacherWorkload, SampleWorkload]
