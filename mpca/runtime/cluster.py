"""Spark sessions and cluster checks: how many agents fit, where they go, how they are pinned.

Agents are pinned through Spark's resource scheduling: one agent per GPU when
the executors have GPUs (``spark.executor.resource.gpu.*``), otherwise one per
address of a custom resource ``agentslot`` (amount N per executor: N agents), so
that Spark's retry of a lost agent task waits for a fresh executor instead of
stacking two agents on a survivor.  Exchange tasks need no resource beyond one
core, hence the paper's rule of 2 cores per agent (§5.1).
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from mpca.errors import ClusterTooSmallError, UserError
from mpca.local_cluster import parse_local_cluster

log = logging.getLogger("mpca.cluster")
AGENT_SLOT = "agentslot"
_SCRIPT_DIR: Optional[str] = None


def is_connect(spark) -> bool:
    """Whether ``spark`` (a session or a DataFrame) is Spark Connect's: no SparkContext, no RDDs."""
    return ".connect." in type(spark).__module__


def require_classic(spark) -> None:
    """Refuse Spark Connect sessions where a classic driver is needed (a run's own :class:`AgentRun`; ``fit``
    takes a Connect session through :mod:`mpca.connect`)."""
    if is_connect(spark):
        raise UserError(
            "this SparkSession is a Spark Connect session (no SparkContext): Trainer.fit and mpca train run over "
            "it, but this benchmark or lab tool drives the agents from a classic driver: use a single-user/"
            "dedicated (assigned) cluster, spark-submit, or a local session (mpca.runtime.cluster.local_session)"
        )


def _discovery_script(name: str, count: int, distinct: bool, modulo: Optional[int] = None) -> str:
    """A resource discovery script.  ``distinct``: each call hands out the next ``count`` addresses
    (fake GPUs that differ between local-cluster workers, as on a real multi-GPU cluster); ``modulo``: the
    addresses wrap round that many devices (this host's real GPUs, shared by the workers when they are fewer)."""
    global _SCRIPT_DIR
    if _SCRIPT_DIR is None:
        _SCRIPT_DIR = tempfile.mkdtemp(prefix="mpca-res-")
    path = os.path.join(_SCRIPT_DIR, f"{name}_discover{'' if modulo is None else f'_mod{modulo}'}.sh")
    if distinct:
        counter = os.path.join(_SCRIPT_DIR, f"{name}{'' if modulo is None else f'_mod{modulo}'}.counter")
        wrap = "" if modulo is None else f" % {modulo}"
        body = f"""#!/bin/sh
exec 9>"{counter}.lock"
flock 9
n=$(cat "{counter}" 2>/dev/null || echo 0)
echo $((n + {count})) > "{counter}"
addrs=""
i=0
while [ $i -lt {count} ]; do addrs="$addrs${{addrs:+,}}\\"$(((n + i){wrap}))\\""; i=$((i + 1)); done
echo "{{\\"name\\":\\"{name}\\",\\"addresses\\":[$addrs]}}"
"""
    else:
        addrs = ",".join(f'"{i}"' for i in range(count))
        body = f'#!/bin/sh\necho \'{{"name":"{name}","addresses":[{addrs}]}}\'\n'
    with open(path, "w") as f:
        f.write(body)
    os.chmod(path, 0o755)
    return path


# An agent is one long-lived Spark task: every loss of its executor (kill -9, OOM, a preempted node) is one failure of
# that task, and at spark.task.maxFailures (Spark's default: 4) Spark aborts the agents' job — every agent with it.
# lab.campaign found it: the 4th kill of one agent's executor ended an 8-minute run.  mpca's own sessions allow this
# many; a session that mpca did not create keeps its own setting (AgentRun warns when it is low).
AGENT_TASK_MAX_FAILURES = 100


def local_session(executors: int = 2, cores: int = 2, memory_mb: int = 1024, app_name: str = "mpca",
                  fake_gpus_per_executor: int = 0, conf: Optional[Dict[str, str]] = None,
                  agents_per_executor: int = 1, gpus_per_executor: int = 0):
    """A ``local-cluster[executors, cores, memory_mb]`` session (several executor JVMs) ready for agents.

    Executors run this interpreter (``PYSPARK_PYTHON`` and ``spark.pyspark.python``), every executor has
    ``agents_per_executor`` ``agentslot`` addresses (give it 2 cores per agent); with
    ``fake_gpus_per_executor`` each executor also gets that many fake GPUs with addresses distinct across
    executors.  ``gpus_per_executor`` gives each executor that many of this host's real GPUs (CUDA's visible
    devices), handed out in turn and shared by the executors when there are fewer GPUs than executors × GPUs:
    one agent per executor GPU then trains on it.  ``spark.task.maxFailures`` is
    :data:`AGENT_TASK_MAX_FAILURES` unless ``conf`` sets it.
    """
    from pyspark.sql import SparkSession

    if executors < 1 or cores < 1 or memory_mb < 256 or agents_per_executor < 1:
        raise UserError(f"local_session needs executors >= 1, cores >= 1, memory_mb >= 256 "
                        f"(got {executors}, {cores}, {memory_mb})")
    if gpus_per_executor and fake_gpus_per_executor:
        raise UserError("local_session takes real GPUs (gpus_per_executor) or fake ones, not both")
    devices = visible_gpus() if gpus_per_executor else 0
    if gpus_per_executor > devices:
        raise UserError(f"cluster.gpus asks for {gpus_per_executor} GPU(s) per executor but this host has {devices} "
                        "CUDA device(s) visible; set cluster.gpus to at most that, or 'none' to train on the CPUs")
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:  # this call starts the JVM: is there a Java it can run?
        from mpca.runtime.java import check_java

        check_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = (SparkSession.builder.master(f"local-cluster[{executors},{cores},{memory_mb}]").appName(app_name)
         .config("spark.pyspark.python", sys.executable)
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.executor.memory", f"{memory_mb}m"))
    slot = _discovery_script(AGENT_SLOT, agents_per_executor, distinct=False)
    for level in ("worker", "executor"):
        b = b.config(f"spark.{level}.resource.{AGENT_SLOT}.amount", str(agents_per_executor))
        b = b.config(f"spark.{level}.resource.{AGENT_SLOT}.discoveryScript", slot)
    if fake_gpus_per_executor or gpus_per_executor:
        per = fake_gpus_per_executor or gpus_per_executor
        gpu = _discovery_script("gpu", per, distinct=True, modulo=devices or None)
        for level in ("worker", "executor"):
            b = b.config(f"spark.{level}.resource.gpu.amount", str(per))
            b = b.config(f"spark.{level}.resource.gpu.discoveryScript", gpu)
    conf = {"spark.task.maxFailures": str(AGENT_TASK_MAX_FAILURES), **(conf or {})}
    java_opts = conf.pop("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in java_opts:  # ours: no warnings caused by our own settings
        log_conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
        java_opts = f"{java_opts} -Dlog4j2.configurationFile=file:{log_conf}".strip()
    b = b.config("spark.driver.extraJavaOptions", java_opts)
    for k, v in conf.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    watch_driver_jvm(spark)
    return spark


def warn_low_task_retries(sc) -> None:
    """Say so when the session lets an agent's task fail fewer than ``AGENT_TASK_MAX_FAILURES`` times: the
    agents' job, and the run, would end at that many losses of one agent's executor."""
    allowed = int(sc.getConf().get("spark.task.maxFailures", "4"))
    if allowed < AGENT_TASK_MAX_FAILURES:
        log.warning("spark.task.maxFailures is %d: the run ends when one agent's executor is lost %d times; set it "
                    "higher (e.g. %d) when the session is created to outlast more", allowed, allowed,
                    AGENT_TASK_MAX_FAILURES)


def session_for(cluster, app_name: str, conf: Optional[Dict[str, str]] = None) -> Tuple[object, bool]:
    """The session a job runs on, from its ``cluster`` section: with ``master: existing`` the active one (or
    the one spark-submit configured), else a new ``local-cluster[K,C,MB]``; and whether the caller owns it
    (and must stop it).  ``conf`` is added to the section's own ``cluster.conf``."""
    if cluster.master == "existing":  # spark-submit's, a notebook's, or SPARK_REMOTE's Spark Connect server
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession() or SparkSession.builder.appName(app_name).getOrCreate(), False
    if cluster.master.startswith("sc://"):  # a Spark Connect server: a client session of its own
        from pyspark.sql import SparkSession

        check_connect_server(cluster.master)
        try:
            return SparkSession.builder.remote(cluster.master).appName(app_name).getOrCreate(), True
        except ImportError as e:
            raise UserError(f"a Spark Connect client needs pyspark's connect extra ({e}): pip install "
                            "'pyspark[connect]'") from None
    local = parse_local_cluster(cluster.master)
    spark = local_session(local.executors, local.cores, local.memory_mb, app_name=app_name,
                          conf={**(conf or {}), **cluster.conf}, gpus_per_executor=local_gpus(cluster.gpus))
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


CONNECT_PORT = 15002  # a Spark Connect address without a port: the server's default


def check_connect_server(url: str, timeout_s: float = 10.0) -> None:
    """Fail in one line when nothing listens at a Spark Connect address (the client itself would retry for
    minutes before it says so)."""
    import re
    import socket

    m = re.match(r"sc://([^/:;]+)(?::(\d+))?", url)
    host, port = m.group(1), int(m.group(2) or CONNECT_PORT)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        raise UserError(f"no Spark Connect server answers at {host}:{port} ({e.strerror or e}): check "
                        "cluster.master and that the server runs") from None


def visible_gpus() -> int:
    """How many CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_gpus(setting) -> int:
    """GPUs per executor of a local-cluster from ``cluster.gpus``: ``auto`` one when this host has CUDA devices
    (else none), ``none`` none, a number that many."""
    if setting == "auto":
        return 1 if visible_gpus() else 0
    if setting == "none":
        return 0
    return int(setting)


def watch_driver_jvm(spark) -> None:
    """A local cluster must not outlive this Python driver: if it dies without stopping Spark (kill -9, OOM
    killer), a detached watchdog asks the driver's JVM — which holds the local cluster and its executors —
    to terminate, and kills it 20 s later if its shutdown hooks hang (seen on 2 shared cores).  The watchdog
    ends by itself when the JVM is gone."""
    import subprocess

    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is None:
        return
    py, jvm = os.getpid(), proc.pid
    alive = f"kill -0 {jvm} 2>/dev/null"
    script = (f"while kill -0 {py} 2>/dev/null && {alive}; do sleep 1; done; sleep 2; "
              f"if {alive}; then kill -TERM {jvm}; i=0; while {alive} && [ $i -lt 20 ]; do sleep 1; i=$((i+1)); done; "
              f"if {alive}; then kill -KILL {jvm}; fi; fi")
    subprocess.Popen(["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


@dataclass(frozen=True)
class ClusterShape:
    executors: int
    cores_per_executor: int
    gpus_per_executor: int
    agent_slots_per_executor: int

    def describe(self) -> str:
        gpu = f", {self.gpus_per_executor} GPU(s)" if self.gpus_per_executor else ""
        return f"{self.executors} executor(s) x {self.cores_per_executor} core(s){gpu}"


def _conf_int(sc, key: str, default: int = 0) -> int:
    v = sc.getConf().get(key)
    if v is None:
        return default
    try:
        return int(float(v))
    except ValueError:
        raise UserError(f"Spark setting {key}={v!r} is not a number") from None


def executor_count(sc) -> int:
    return max(0, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)


def refuse_dynamic_allocation(conf) -> None:
    """One line instead of Spark's own error when ``spark.dynamicAllocation.enabled`` is on: under dynamic
    allocation Spark runs a stage's tasks only on executors of that stage's resource profile, so the agents (their
    own profile) and the exchange tasks that must reach them on their executors cannot meet."""
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        raise UserError("mpca needs spark.dynamicAllocation.enabled=false (the agents' exchange tasks must run on "
                        "the agents' own executors, which stage-level scheduling under dynamic allocation does not "
                        "allow); an elastic run (training.agents: MIN-MAX) still takes the executors the cluster adds "
                        "or replaces — a standalone worker joining, a node added by the cluster's autoscaler")


def decommission_enabled(sc) -> bool:
    """Whether Spark decommissions executors gracefully here (``spark.decommission.enabled``)."""
    return (sc.getConf().get("spark.decommission.enabled") or "false").strip().lower() == "true"


def decommissioning(sc, executors) -> set:
    """Which of ``executors`` (ids) Spark's scheduler knows to be decommissioning (``spark.decommission.enabled``:
    a worker or node going away, a spot instance's notice, dynamic allocation scaling down)."""
    scheduler = sc._jsc.sc().taskScheduler()
    try:
        return {e for e in executors if scheduler.getExecutorDecommissionState(e).isDefined()}
    except Exception:  # noqa: BLE001 - a scheduler without decommissioning (none on the driver side): nothing
        return set()


def inspect_cluster(sc, wait_for: int, wait_s: float = 60.0, use_gpus: Optional[bool] = None) -> ClusterShape:
    """Wait (up to ``wait_s``) until the registered executors have room for ``wait_for`` agents (one executor
    each, or fewer where an executor hosts several: GPUs, ``agentslot`` addresses), then describe the cluster.
    ``use_gpus``: as :func:`uses_gpus` (None: where the executors have GPUs)."""
    master = sc.master or ""
    if master.startswith("local[") or master == "local":
        raise UserError(f"master {master!r} has no executors for agents; use local-cluster[K,2,1024] "
                        "(mpca.runtime.cluster.local_session), standalone, YARN or Kubernetes")
    deadline = time.time() + wait_s
    while True:
        shape = _shape_now(sc, master)
        gpus = uses_gpus(shape, use_gpus)
        # room for them, or none on any executor (too few cores: waiting cannot help), or no more time
        if shape.executors and (agent_capacity(shape, gpus) >= wait_for or agents_per_executor(shape, gpus) == 0) \
                or time.time() >= deadline:
            return shape
        time.sleep(0.2)


def _shape_now(sc, master: str) -> ClusterShape:
    """The cluster as registered now: executors, and cores / GPUs / agent slots per executor from the conf."""
    n = executor_count(sc)
    cores = _conf_int(sc, "spark.executor.cores", 0)
    local = parse_local_cluster(master)
    if local is not None:
        cores = local.cores
    if cores == 0 and n:
        cores = max(1, sc.defaultParallelism // n)
    gpus = _conf_int(sc, "spark.executor.resource.gpu.amount", 0)
    slots = _conf_int(sc, f"spark.executor.resource.{AGENT_SLOT}.amount", 0)
    return ClusterShape(n, cores, gpus, slots)


def uses_gpus(shape: ClusterShape, use_gpus: Optional[bool]) -> bool:
    """Whether the agents train on GPUs: ``training.use_gpus`` where set, else where the executors have them."""
    return use_gpus if use_gpus is not None else shape.gpus_per_executor > 0


def agent_capacity(shape: ClusterShape, use_gpus: bool) -> int:
    """How many agents the cluster hosts: :func:`agents_per_executor` on every executor."""
    return agents_per_executor(shape, use_gpus) * shape.executors


def agents_per_executor(shape: ClusterShape, use_gpus: bool) -> int:
    """How many agents one executor hosts: one per GPU (or per ``agentslot`` address, one without that
    resource), 2 cores each."""
    per = shape.gpus_per_executor if use_gpus else max(1, shape.agent_slots_per_executor)
    return min(per, shape.cores_per_executor // 2)


def exchange_slots(shape: ClusterShape, use_gpus: bool) -> int:
    """Task slots per agent left for its exchange tasks: 2 or more lets a cycle's reduce task run while its
    deliver task waits for the broadcast (declare executor cores for them: they are I/O-bound)."""
    per = max(1, agents_per_executor(shape, use_gpus))
    return shape.cores_per_executor // per - 1


def check_capacity(shape: ClusterShape, agents: int, use_gpus: bool) -> None:
    """Fail fast (never hang waiting for slots) when the cluster cannot host ``agents`` agents."""
    if agents < 1:
        raise UserError(f"agents must be >= 1, got {agents}")
    capacity = agent_capacity(shape, use_gpus)
    if capacity < agents:
        need = "1 GPU and 2 cores" if use_gpus else "2 cores (one for the agent, one for its exchange tasks)"
        raise ClusterTooSmallError(
            f"cluster too small: {agents} agent(s) need {need} each, but the cluster has {shape.describe()} "
            f"= room for {capacity}; lower 'agents' to {capacity} or add executors"
            + (" (executors may still be starting: raise 'executor_wait_s')" if shape.executors < agents else "")
        )


def agents_fit(sc, settings) -> Tuple[ClusterShape, bool]:
    """The cluster's shape (waiting up to ``cluster.executor_wait_s`` for the executors) and whether the agents
    use GPUs, after checking that it can host the agents the run starts with (``training.agents``, or MIN of an
    elastic range: the others wait for Spark to find them room) — one line otherwise."""
    training = settings.training
    refuse_dynamic_allocation(sc.getConf())
    shape = inspect_cluster(sc, training.start_agents, settings.cluster.executor_wait_s, training.use_gpus)
    use_gpus = uses_gpus(shape, training.use_gpus)
    if use_gpus and shape.gpus_per_executor == 0:
        raise UserError("use_gpus=True but the executors have no GPUs (set spark.executor.resource.gpu.amount)")
    check_capacity(shape, training.start_agents, use_gpus)
    return shape, use_gpus


def agent_resource_profile(use_gpus: bool, pinned: bool):
    """The task resource profile of agent tasks (one core, plus a GPU or the agent slot)."""
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    req = TaskResourceRequests().cpus(1)
    if use_gpus:
        req = req.resource("gpu", 1)
    elif pinned:
        req = req.resource(AGENT_SLOT, 1)
    return ResourceProfileBuilder().require(req).build
