"""The CPU profile of `mpca bench compare`: roles by command line, CPU of processes that end inside the window."""
import os
import subprocess
import sys
import time

from mpca.bench.cpu_profile import ROLES, CpuProfile, describe, role_of

BURN = "import time\nwhile time.process_time() < 0.5: pass"  # exactly 0.5 s of CPU, then exit


def test_roles_come_from_the_command_line_and_the_agents_pids():
    executor = b"java\x00-cp\x00x\x00org.apache.spark.executor.CoarseGrainedExecutorBackend\x00"
    assert role_of(10, executor, agent_pids={11}, driver_jvm=12) == "executor JVMs"
    assert role_of(11, b"python3\x00-m\x00pyspark.daemon\x00", agent_pids={11}, driver_jvm=12) == "agents"
    assert role_of(13, b"python3\x00-m\x00pyspark.daemon\x00", agent_pids={11}, driver_jvm=12) == "python workers"
    assert role_of(12, b"java\x00org.apache.spark.deploy.SparkSubmit\x00", agent_pids=(), driver_jvm=12) == "driver JVM"
    assert role_of(os.getpid(), b"python", agent_pids=(), driver_jvm=None) == "driver Python"
    assert role_of(14, b"java\x00org.apache.spark.deploy.worker.Worker\x00", (), None) == "standalone JVMs"
    assert role_of(15, b"bash\x00", (), None) == "other"


def _profile_a_burn(agent: bool) -> dict:
    t0 = time.time()
    prof = CpuProfile(interval_s=0.05).start()
    p = subprocess.Popen([sys.executable, "-c", BURN, "CoarseGrainedExecutorBackend"])
    p.wait()
    time.sleep(0.2)  # the process is gone before the profile stops: its last sample must still count
    out = prof.stop([p.pid] if agent else [])
    return {k: v * (time.time() - t0) for k, v in out.items() if k in ROLES} | {"busy": out["machine busy"],
                                                                                   "line": describe(out)}


def test_a_process_that_ended_inside_the_window_keeps_its_cpu_under_its_role():
    seconds = _profile_a_burn(agent=False)
    assert 0.35 <= seconds["executor JVMs"] <= 0.65, seconds  # 0.5 s of CPU, less at most one 0.05 s sample
    assert seconds["agents"] == 0 and 0 < seconds["busy"] <= 1 and "executor JVMs" in seconds["line"]
    as_agent = _profile_a_burn(agent=True)
    assert 0.35 <= as_agent["agents"] <= 0.65 and as_agent["executor JVMs"] < 0.1, as_agent
