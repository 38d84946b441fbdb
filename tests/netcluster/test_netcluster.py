"""The emulated cluster (lab.netcluster): network namespaces, rate-limited links, a Spark standalone
master and workers, and a teardown that leaves nothing behind, also after a failure or Ctrl-C.

Root only (network namespaces); skipped elsewhere, except the "not root" test."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from lab import netcluster
from lab.netcluster import NetCluster, available

pytestmark = [pytest.mark.standalone, pytest.mark.usefixtures("no_shared_spark")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = [sys.executable, "-m", "lab.netcluster"]
_OK, _WHY = available()
needs_netns = pytest.mark.skipif(not _OK, reason=f"emulated cluster unavailable: {_WHY}")


def _tool(*args, timeout=240):
    return subprocess.run([*TOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _up_line(stderr):
    """(prefix, spark pids) from the tool's "up" line."""
    m = re.search(r"netcluster: up (mpca\w+): .*spark pids ([\d,]+)", stderr)
    assert m, stderr[-3000:]
    return m.group(1), [int(x) for x in m.group(2).split(",")]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _leftovers(prefix, pids=()):
    """Everything of the run ``prefix`` still on the machine: namespaces, links (veths, bridge), qdiscs on
    them, its state directory, processes whose command line names it, and the given pids if still alive."""
    out = []
    out += [f"netns {n}" for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n.startswith(prefix)]
    for ln in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines():
        name = ln.split(": ")[1].split("@")[0]
        if name.startswith(prefix):
            out.append(f"link {name}")
    out += [f"qdisc {ln}" for ln in subprocess.run(["tc", "qdisc", "show"], capture_output=True,
                                                   text=True).stdout.splitlines() if prefix in ln]
    state = os.path.join(tempfile.gettempdir(), f"mpca-netcluster-{prefix}")
    if os.path.exists(state):
        out.append(f"dir {state}")
    pg = subprocess.run(["pgrep", "-af", prefix], capture_output=True, text=True).stdout.splitlines()
    out += [f"process {ln}" for ln in pg]
    out += [f"pid {p}" for p in pids if _alive(p)]
    return out


def _assert_clean(prefix, pids=()):
    try:
        left = _leftovers(prefix, pids)
        assert left == [], f"left behind by {prefix}: {left}"
    finally:
        netcluster._remove_prefix(prefix)  # do not pollute later tests, whatever happened


def _kill_and_remove(p, prefix):
    """A test's own clean-up, whatever happened: its process killed, its cluster removed."""
    if p.poll() is None:
        p.kill()
        p.wait()
    if prefix:
        netcluster._remove_prefix(prefix)


SPARK_SNIPPET = textwrap.dedent("""
    import json, os, socket, time
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    env = os.environ
    spark = (SparkSession.builder.master(env["MPCA_SPARK_MASTER"]).appName("netcluster-test")
             .config("spark.driver.host", env["MPCA_DRIVER_HOST"])
             .config("spark.driver.bindAddress", env["MPCA_DRIVER_HOST"])
             .config("spark.pyspark.python", env["PYSPARK_PYTHON"])
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.executor.resource.agentslot.amount", "1")
             .config("spark.task.resource.agentslot.amount", "1")
             .getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    n = int(env["MPCA_NETCLUSTER_WORKERS"])
    deadline = time.time() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < n + 1 and time.time() < deadline:
        time.sleep(0.2)

    def probe(_):
        time.sleep(0.3)
        return socket.gethostname(), list(TaskContext.get().resources()["agentslot"].addresses)

    rows = sc.parallelize(range(8), 8).map(probe).collect()
    print("RESULT " + json.dumps({"driver": socket.gethostname(), "prefix": env["MPCA_NETCLUSTER_PREFIX"],
                                  "network": env["MPCA_NETWORK"], "rows": rows}), flush=True)
    spark.stop()
""")


@needs_netns
def test_spark_job_runs_on_the_worker_hosts_and_nothing_is_left():
    t0 = time.monotonic()
    p = _tool("--workers", "2", "--link", "100mbit", "--", sys.executable, "-c", SPARK_SNIPPET, timeout=280)
    took = time.monotonic() - t0
    prefix, pids = _up_line(p.stderr)
    try:
        assert p.returncode == 0, p.stderr[-4000:]
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert line, p.stdout[-2000:] + p.stderr[-3000:]
        res = json.loads(line[0][len("RESULT "):])
        assert res["driver"] == "driver" and res["prefix"] == prefix and res["network"] == "100mbit"
        hosts = {h for h, _ in res["rows"]}
        assert hosts == {"w1", "w2"}, res["rows"]  # tasks ran on both worker hosts, not on the driver
        assert all(addr == ["0"] for _, addr in res["rows"])  # each executor offers its one agentslot
        assert "Traceback" not in p.stderr
        print(f"\n2 workers at 100mbit, Spark job, teardown: {took:.1f} s in all")
    finally:
        _assert_clean(prefix, pids)


SERVER = textwrap.dedent("""
    import json, socket, sys, time
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen(1)
    s.settimeout(60)
    c, _ = s.accept()
    c.settimeout(60)
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        t0 = t0 or time.perf_counter()
        n += len(b)
    t1 = time.perf_counter()
    c.sendall(b"k")
    c.close()
    print(json.dumps({"bytes": n, "seconds": t1 - t0}), flush=True)
""")
CLIENT = textwrap.dedent("""
    import json, socket, sys, time
    host, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    deadline = time.time() + 20
    while True:
        try:
            c = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.settimeout(60)
    buf = b"x" * (1 << 20)
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        k = min(len(buf), total - sent)
        c.sendall(buf[:k])
        sent += k
    c.shutdown(socket.SHUT_WR)
    ack = c.recv(1)
    t1 = time.perf_counter()
    print(json.dumps({"bytes": sent, "seconds": t1 - t0, "ack": ack.decode()}), flush=True)
""")


@needs_netns
def test_link_limit_is_real_and_counted(tmp_path):
    total = 20_000_000
    with NetCluster(workers=1, link="100mbit", cores=1, memory_mb=512) as nc:
        prefix, pids = nc.prefix, list(nc.spark_pids)
        assert _leftovers(prefix, pids), "the leftover check sees nothing of a running cluster"
        assert "100mbit" in nc.describe() and nc.master_url == f"spark://{nc.driver_ip}:7077"
        w1 = nc.hosts["w1"]
        server = nc.popen_in("w1", [sys.executable, "-I", "-S", "-c", SERVER, w1, "5001"],
                             stdout=subprocess.PIPE, text=True)
        tx0, rx0 = nc.driver_link_bytes()
        with open(tmp_path / "client.json", "w") as out:
            rc = nc.run_in_driver([sys.executable, "-I", "-S", "-c", CLIENT, w1, "5001", str(total)], stdout=out,
                                  timeout=60)
        tx1, rx1 = nc.driver_link_bytes()
        srv = json.loads(server.communicate(timeout=30)[0])
        assert rc == 0
        cli = json.loads((tmp_path / "client.json").read_text())
    _assert_clean(prefix, pids)
    assert cli["ack"] == "k" and srv["bytes"] == total
    mbit_client = total * 8 / cli["seconds"] / 1e6
    mbit_server = total * 8 / srv["seconds"] / 1e6
    print(f"\n100mbit link: {mbit_client:.1f} Mbit/s (sender, incl. handshake), {mbit_server:.1f} Mbit/s (receiver); "
          f"driver eth0 tx {tx1 - tx0} B, rx {rx1 - rx0} B")
    assert 80 <= mbit_client <= 105, mbit_client
    assert 80 <= mbit_server <= 105, mbit_server
    assert total <= tx1 - tx0 <= total * 1.08 + 200_000  # payload plus TCP/IP headers
    assert rx1 - rx0 <= total * 0.05  # acknowledgements only


@needs_netns
def test_failing_command_exit_code_and_teardown():
    p = _tool("--workers", "1", "--link", "none", "--cores", "1", "--memory-mb", "512", "--",
              "sh", "-c", 'test "$(hostname)" = driver && exit 3; exit 1', timeout=200)
    prefix, pids = _up_line(p.stderr)
    try:
        assert p.returncode == 3, p.stderr[-3000:]
        assert "Traceback" not in p.stderr
    finally:
        _assert_clean(prefix, pids)


@needs_netns
def test_sigint_tears_everything_down(tmp_path):
    marker = tmp_path / "marker"
    cmd = f'echo "$MPCA_NETCLUSTER_PREFIX $$" > {marker}.tmp && mv {marker}.tmp {marker} && exec sleep 60'
    p = subprocess.Popen([*TOOL, "--workers", "1", "--link", "1gbit", "--cores", "1", "--memory-mb", "512", "--",
                          "sh", "-c", cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prefix = None
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), f"command never started (rc {p.poll()})"
        prefix, cmd_pid = marker.read_text().split()
        cmd_pid = int(cmd_pid)
        assert _alive(cmd_pid) and _leftovers(prefix), "the cluster is not visibly up"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=40)
        took = time.monotonic() - t0
        print(f"\nSIGINT to exit: {took:.1f} s")
        assert p.returncode != 0 and took <= 20, (p.returncode, took, err[-3000:])
        assert "stopped by SIGINT" in err and "Traceback" not in err, err[-3000:]
        _, pids = _up_line(err)
        _assert_clean(prefix, [cmd_pid, *pids])
    finally:
        _kill_and_remove(p, prefix)


def test_not_root_one_line_exit_2():
    env = dict(os.environ, HOME="/tmp", PYTHONDONTWRITEBYTECODE="1")
    argv = [*TOOL, "--workers", "1", "--link", "100mbit", "--", "true"]
    if os.geteuid() == 0:
        if not os.path.exists("/usr/bin/setpriv"):
            pytest.skip("setpriv missing: cannot run as another user")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("netcluster: needs root"), p.stderr[-3000:]
    assert "uid 65534" in lines[0] or os.geteuid() != 0
    assert p.stdout == ""


@needs_netns
def test_cleanup_stale_removes_only_dead_runs():
    child = subprocess.Popen(["true"])
    child.wait()
    dead = child.pid
    assert not os.path.exists(f"/proc/{dead}")
    stale, live = f"mpca{dead}z", f"mpca{os.getpid()}y"
    state = os.path.join(tempfile.gettempdir(), f"mpca-netcluster-{stale}")
    sleeper = None
    try:
        for cmd in (f"ip netns add {stale}-driver", f"ip link add {stale}br type bridge",
                    f"ip link add {stale}v0 type veth peer name eth0 netns {stale}-driver",
                    f"ip link set {stale}v0 master {stale}br",
                    f"tc qdisc add dev {stale}v0 root tbf rate 100mbit burst 32kb latency 10ms",
                    f"ip netns add {live}-driver"):
            subprocess.run(cmd.split(), check=True)
        os.makedirs(state)
        with open(os.path.join(state, "owner"), "w") as f:
            f.write(f"{dead} 1\n")
        sleeper = subprocess.Popen(["ip", "netns", "exec", f"{stale}-driver", "sleep", "300"])
        time.sleep(0.3)
        assert _leftovers(stale) and _leftovers(live)
        p = _tool("--cleanup-stale", timeout=60)
        assert p.returncode == 0, p.stderr
        assert stale in p.stderr and live not in p.stderr
        sleeper.wait(10)  # killed: it ran inside the stale cluster
        assert _leftovers(stale) == []
        assert _leftovers(live) == [f"netns {live}-driver"]  # its owner (this process) is alive: kept
    finally:
        if sleeper and sleeper.poll() is None:
            sleeper.kill()
        netcluster._remove_prefix(stale)
        netcluster._remove_prefix(live)


@needs_netns
def test_sigterm_to_bench_compare_on_the_emulated_cluster_tears_it_down(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "mpca.bench.compare", "-c", "conf/digits.yaml", "--network", "1gbit",
                          "--algorithms", "single", "--max-seconds", "60", "--out", str(tmp_path), "progress=off"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prefix = None
    try:
        deadline = time.monotonic() + 120
        while prefix is None and p.poll() is None and time.monotonic() < deadline:
            names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            prefix = next((n.split("-")[0] for n in names if n.startswith(f"mpca{p.pid}")), None)
            time.sleep(0.5)
        time.sleep(5)  # the cluster up and the benchmark's own driver started inside it
        assert p.poll() is None and prefix and _leftovers(prefix), f"the cluster never came up (rc {p.poll()})"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGTERM, (p.returncode, err[-3000:])
        assert "stopped by SIGTERM; emulated cluster torn down" in err and "Traceback" not in err, err[-3000:]
        _assert_clean(prefix)
    finally:
        _kill_and_remove(p, prefix)


@needs_netns
def test_a_replaced_worker_stays_up_after_the_thread_that_replaced_it_ends():
    """NetCluster.replace_worker (the fault campaign's cluster manager after a decommission) called from a
    thread that then ends, as the campaign's timer does: the fresh worker is still ALIVE seconds later, under a
    new id (the daemons die with the thread that started them, PR_SET_PDEATHSIG: it was DEAD a second after it
    registered), and nothing is left after the teardown."""
    import threading

    with NetCluster(2, link="1gbit", decommission=True) as cluster:
        host = cluster.hosts["w1"]
        before = {w["id"] for w in cluster.master_state()["workers"] if w["host"] == host}
        replacing = threading.Thread(target=cluster.replace_worker, args=("w1",))
        replacing.start()
        replacing.join(150)
        assert not replacing.is_alive()
        time.sleep(6.0)
        states = {w["id"]: w["state"] for w in cluster.master_state()["workers"] if w["host"] == host}
        fresh = {i: s for i, s in states.items() if i not in before}
        assert list(fresh.values()) == ["ALIVE"], states
        assert all(states[i] == "DEAD" for i in before), states
        pids = list(cluster.spark_pids)
    assert not any(_alive(p) for p in pids)
