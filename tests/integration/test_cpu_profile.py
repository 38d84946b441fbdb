"""The CPU profile of `mpca bench compare` against a real process: one that ends inside the window keeps its
CPU under its role (the roles by command line: tests/unit/test_cpu_profile.py)."""
import subprocess
import sys
import time

from mpca.bench.cpu_profile import ROLES, CpuProfile, describe

BURN = "import time\nwhile time.process_time() < 0.5: pass"  # exactly 0.5 s of CPU, then exit


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
