"""One run of K agents and the driver's pipeline: start, exchange cycles, stop — used by the Trainer
and by the benchmarks."""
from __future__ import annotations

import logging
import secrets
import time
import uuid
from typing import Dict, List, Optional, Sequence

import torch

from mpca.algorithm import JointShard, MPCAHyper, ShardLayout
from mpca.errors import RunFailedError, UserError
from mpca.runtime import cluster
from mpca.runtime.agent import AgentSpec, model_state
from mpca.runtime.agent_job import AgentJob
from mpca.runtime.pipeline import ExchangePipeline
from mpca.runtime.timeline import Timeline

log = logging.getLogger("mpca.run")


class AgentRun:
    """Context manager: on enter the agents are up and have answered; on exit they are stopped
    and their Spark job has ended (cancelled if it would not end by itself)."""

    def __init__(self, spark, train_df, *, model: torch.nn.Module, model_fn, loss_fn, optimizer_fn, agents: int,
                 shards: int = 3, hyper: Optional[MPCAHyper] = None, buffers: str = "average", batch_size: int = 64,
                 input_shape: Sequence[int] = (), features: str = "features", label: str = "label",
                 use_gpus: Optional[bool] = None, seed: int = 0, executor_wait_s: float = 60.0,
                 agent_start_timeout_s: float = 180.0, joint: Optional[List[JointShard]] = None):
        cluster.require_classic(spark)
        self.sc = spark.sparkContext
        self.shape = cluster.inspect_cluster(self.sc, agents, executor_wait_s)
        use_gpus = use_gpus if use_gpus is not None else self.shape.gpus_per_executor > 0
        if use_gpus and self.shape.gpus_per_executor == 0:
            raise UserError("use_gpus=True but the executors have no GPUs (set spark.executor.resource.gpu.amount)")
        cluster.check_capacity(self.shape, agents, use_gpus)
        self.agents = agents
        self.layout = ShardLayout.from_module(model, shards, buffers)
        self.bound = self.layout.bind_module(model, buffers)
        if joint is None:
            joint = [JointShard(self.bound.read(s)) for s in range(shards)]
        self.run_id = uuid.uuid4().hex[:10]
        secret = secrets.token_bytes(32)
        self.spec = AgentSpec(run_id=self.run_id, secret=secret, model_fn=model_fn, loss_fn=loss_fn,
                              optimizer_fn=optimizer_fn, layout=self.layout, init_state=model_state(model),
                              buffers=buffers, batch_size=batch_size, input_shape=tuple(input_shape), seed=seed)
        self.profile = cluster.agent_resource_profile(use_gpus, pinned=self.shape.agent_slots_per_executor > 0)
        self.job = AgentJob(self.sc, self.run_id)
        self.timeline = Timeline()
        self.pipeline = ExchangePipeline(self.sc, self.run_id, secret, joint, hyper or MPCAHyper(), range(agents),
                                         self.layout.wire_dtype, self.timeline, executors=self.shape.executors)
        self._train_df, self._features, self._label = train_df, features, label
        self.agent_start_timeout_s = agent_start_timeout_s
        self.stopped: Dict[int, dict] = {}
        self.agent_info: Dict[int, dict] = {}

    def __enter__(self) -> "AgentRun":
        t0 = time.time()
        self.job.start(self._train_df, self.agents, self.spec, self._features, self._label, self.profile)
        try:
            self.agent_info = self.pipeline.hello(self.agents, self.agent_start_timeout_s, self.job.alive)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        log.info("%d agents up after %.1fs (%s)", self.agents, time.time() - t0, self.layout.describe())
        return self

    def cycle(self, c: int):
        if not self.job.alive():
            raise RunFailedError(f"the agent job ended unexpectedly: {self.job.error or self.job.summaries}")
        return self.pipeline.cycle(c)

    def agent_status(self) -> Dict[int, dict]:
        """Steps and samples of every agent right now (a light control job, no shard moves)."""
        plan = self.pipeline._plan(f"status{time.time()}", "hello")
        attempt = 0 if self.shape.executors == self.agents else 1  # extra executors: over-provision at once
        res = self.pipeline.run_job(plan, self.pipeline.spread(self.agents, attempt), None, "mpca: agent status")
        return res["agents"]

    def joint_vectors(self) -> List[torch.Tensor]:
        return [j.joint for j in self.pipeline.joint]

    def __exit__(self, *exc) -> None:
        self.pipeline.flush()
        self.stopped = self.pipeline.stop_agents()
        if not self.job.join(30):
            self.job.cancel()
            self.job.join(10)

    @property
    def summaries(self) -> List[dict]:
        return self.job.summaries or list(self.stopped.values())
