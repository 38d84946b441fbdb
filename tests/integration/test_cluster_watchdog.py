"""local_session's watchdog, against real processes: a killed Python driver does not leave its JVM behind."""


def test_a_local_clusters_jvm_does_not_outlive_its_killed_python_driver():
    """local_session's watchdog: kill -9 of the Python driver → its JVM (here a stand-in) is terminated."""
    import os
    import subprocess
    import sys
    import time

    code = ("import subprocess, sys, time, types\n"
            "from mpca.runtime import cluster\n"
            "jvm = subprocess.Popen(['sleep', '300'])\n"
            "cluster.watch_driver_jvm(types.SimpleNamespace(sparkContext=types.SimpleNamespace("
            "_gateway=types.SimpleNamespace(proc=jvm))))\n"
            "print(jvm.pid, flush=True)\n"
            "time.sleep(300)\n")
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    jvm = int(driver.stdout.readline())
    driver.kill()
    driver.wait()
    deadline = time.time() + 20
    while time.time() < deadline and os.path.exists(f"/proc/{jvm}") and \
            open(f"/proc/{jvm}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.2)
    gone = not os.path.exists(f"/proc/{jvm}") or open(f"/proc/{jvm}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    assert gone, "the stand-in JVM outlived its killed driver"
