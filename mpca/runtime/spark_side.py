"""What a run needs of the place that drives its agents, from classic Spark's driver: the cluster's shape, the
address agents reach the driver at, the agents' job, the exchange jobs and broadcasts, which executors are being
decommissioned.

:class:`~mpca.runtime.run.AgentRun` drives its agents through one such *side*: this one on a classic session's
driver; a Spark Connect run's coordinator, which runs inside the cluster without a SparkContext, drives them
through :class:`mpca.runtime.relay.RelaySide`, which answers the same calls over the agents' authenticated
channels."""
from __future__ import annotations

import secrets
import uuid
from typing import Tuple

from mpca.algorithm.wire import Codec
from mpca.config import Settings
from mpca.runtime import cluster
from mpca.runtime.agent_job import AgentJob
from mpca.runtime.broadcasts import Broadcasts
from mpca.runtime.jobs import ExchangeJobs
from mpca.runtime.roster import AgentRoster


class SparkSide:
    """A classic session's driver: checks that the cluster has room for the agents (or fails in one line)."""

    relay_dir = None  # classic agents find the driver in their task closure, not in a shared directory
    resumed = False  # a classic driver's agents are its own: none was started by another driver
    start_hint = ""  # said after the agents failed to come up (the classic driver checked the room before)

    def __init__(self, spark, settings: Settings):
        cluster.require_classic(spark)
        self.settings = settings
        self.sc = spark.sparkContext
        self.shape, self.use_gpus = cluster.agents_fit(self.sc, settings)
        cluster.warn_low_task_retries(self.sc)

    def identity(self) -> Tuple[str, bytes]:
        """A new run's id and the secret its channels authenticate with."""
        return uuid.uuid4().hex[:10], secrets.token_bytes(32)

    @property
    def executors(self) -> int:
        return self.shape.executors

    def host(self) -> str:
        """Where executors reach the driver's services."""
        return self.settings.cluster.service_host or self.sc.getConf().get("spark.driver.host") or "127.0.0.1"

    def decommission_enabled(self) -> bool:
        return cluster.decommission_enabled(self.sc)

    def split_tasks(self) -> bool:
        """Whether executors have two free task slots per agent (a reduce and a deliver task at once)."""
        return cluster.exchange_slots(self.shape, self.use_gpus) >= 2

    def agent_job(self, run_id: str) -> AgentJob:
        return AgentJob(self.sc, run_id, cluster.agent_resource_profile(
            self.use_gpus, pinned=self.shape.agent_slots_per_executor > 0))

    def exchange_jobs(self, run_id: str, secret: bytes, roster: AgentRoster, codec: Codec) -> ExchangeJobs:
        c = self.settings.cluster
        return ExchangeJobs(self.sc, run_id, secret, roster, codec, self.shape.executors, c.task_timeout_s, c.reduce)

    def broadcasts(self, codec: Codec) -> Broadcasts:
        return Broadcasts(self.sc, codec)

    def executor_count(self) -> int:
        return max(1, cluster.executor_count(self.sc))

    def decommissioning(self, executors: set) -> set:
        return cluster.decommissioning(self.sc, executors)
