"""Spark Connect mode against classic mode, side by side in one session: the same job (``conf/teacher_mlp.yaml``,
K agents, emulated device steps) trained from a classic driver on ``local-cluster[K,2,1024]`` and from a Connect
client of a Connect server over the same local-cluster, alternating, ``--repeats`` times each.

What it compares: the time from ``fit``'s call to the first useful exchange (``prepare_s + first_exchange_s``)
and to the target (``prepare_s`` + the run's clock when the target was met), and cycles per second, with how busy
the machine's CPUs were during each run.  Run from a checkout::

    python -m lab.connect_overhead --agents 2 --repeats 3 --json connect-overhead.json

On this machine's loopback it emulates no network.  Inside the emulated cluster (``lab/netcluster.py``: hosts
behind links of a given rate, a standalone master on the driver's host) it runs both on that cluster — the
classic driver and the Connect server on the driver's host, the Connect client beside it; the Connect server
runs only for the Connect runs, since a standalone master gives the first application every worker's cores::

    python -m lab.netcluster --workers 4 --link 100mbit -- \
        python -m lab.connect_overhead --agents 4 --repeats 3 --target 0.26 --json k4-100mbit.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

STARTED = "Spark Connect server started"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_conf() -> dict:
    """The Spark settings of a driver on the emulated cluster this process runs in (none on loopback)."""
    master = os.environ.get("MPCA_SPARK_MASTER")
    if not master:
        return {}
    host = os.environ["MPCA_DRIVER_HOST"]
    return {"spark.master": master, "spark.driver.host": host, "spark.driver.bindAddress": host,
            "spark.pyspark.python": sys.executable, "spark.executor.resource.agentslot.amount": "1",
            "spark.task.maxFailures": "100", "spark.ui.enabled": "false"}


def start_server(master: str, workdir: str):
    """A Spark Connect server (pyspark's own) over ``master``; its process and ``sc://`` address."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    log = os.path.join(workdir, "server.log")
    host = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": host}
    conf = {"spark.connect.grpc.binding.port": str(port), "spark.ui.enabled": "false", "spark.task.maxFailures": "100",
            "spark.worker.dir": f"{workdir}/work", "spark.sql.warehouse.dir": f"{workdir}/warehouse",
            **{k: v for k, v in cluster_conf().items() if k != "spark.master"}}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [os.path.join(home, "bin", "spark-submit"), "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master,
             *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")], "spark-internal"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 180
    while STARTED not in open(log, errors="replace").read():
        if server.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"the Connect server did not start: see {log}")
        time.sleep(0.5)
    return server, f"sc://{host}:{port}"


def stop_server(server) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def _cpu() -> tuple:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # all, idle + iowait


def one_run(master: str, args, out: str) -> dict:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    conf = cluster_conf()
    if conf and not master.startswith("sc://"):  # the classic driver on the emulated cluster: spark-submit's way
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
        master = "existing"
    shared = [f"cluster.connect_dir={out}-connect"] if master.startswith("sc://") else []  # one machine's disk
    cpu0 = _cpu()
    cmd = [sys.executable, "-m", "mpca.cli", "train", "-c", "conf/teacher_mlp.yaml", f"cluster.master={master}", *shared,
           f"training.agents={args.agents}", f"emulation.device_step_s={args.device_step_s}",
           f"stop.target_error={args.target}", f"stop.max_seconds={args.max_seconds}", f"run.output_dir={out}",
           "eval.every_cycles=2", "progress=off"]
    t = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    cpu1 = _cpu()
    summary = json.load(open(os.path.join(out, "summary.json")))
    if done.returncode not in (0, 4):  # done, or stopped at max_seconds short of the target
        raise RuntimeError(f"{master}: exit {done.returncode}: {done.stderr[-2000:]}")
    reached = summary["status"] == "target_reached"
    return {"prepare_s": summary["prepare_s"], "first_exchange_s": summary["first_exchange_s"],
            "to_first_exchange_s": summary["prepare_s"] + summary["first_exchange_s"],
            "to_target_s": summary["prepare_s"] + summary["wall_s"] if reached else None,
            "cycles_per_s": summary["cycles"] / summary["wall_s"], "job_wall_s": time.time() - t,
            "final_error": summary["final_holdout_error"],
            "cpu_busy": 1 - (cpu1[1] - cpu0[1]) / max(1, cpu1[0] - cpu0[0])}  # the machine's, over the whole job


def _median(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else (None, None, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device-step-s", type=float, default=0.3)
    ap.add_argument("--target", type=float, default=0.3)
    ap.add_argument("--max-seconds", type=float, default=120)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    master = os.environ.get("MPCA_SPARK_MASTER") or f"local-cluster[{args.agents},2,1024]"
    work = tempfile.mkdtemp(prefix="mpca-connect-overhead-")
    runs = {"classic": [], "connect": []}
    for i in range(args.repeats):
        for mode in ("classic", "connect"):
            # one application on the cluster at a time: a standalone master gives the first every worker's cores,
            # so the Connect server (an application itself) runs only for its own runs, started before the clock
            server, where = start_server(master, work) if mode == "connect" else (None, master)
            try:
                r = one_run(where, args, os.path.join(work, f"{mode}-{i}"))
            finally:
                if server is not None:
                    stop_server(server)
            runs[mode].append(r)
            print(f"{mode} {i}: first exchange {r['to_first_exchange_s']:.1f}s, target "
                  f"{r['to_target_s'] if r['to_target_s'] is None else round(r['to_target_s'], 1)}s, "
                  f"{r['cycles_per_s']:.2f} cycles/s, CPUs {100 * r['cpu_busy']:.0f}% busy", flush=True)
    table = {}
    for key in ("to_first_exchange_s", "to_target_s", "cycles_per_s"):
        c, k = _median(r[key] for r in runs["classic"]), _median(r[key] for r in runs["connect"])
        table[key] = {"classic": c, "connect": k, "ratio": k[0] / c[0] if c[0] and k[0] else None}
        print(f"{key:22s} classic {c[0]:.2f} ({c[1]:.2f}-{c[2]:.2f})  connect {k[0]:.2f} ({k[1]:.2f}-{k[2]:.2f})  "
              f"connect/classic {table[key]['ratio']:.2f}" if c[0] and k[0] else f"{key}: not reached", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "master": master, "runs": runs, "medians": table,
                       "emulates": (f"lab/netcluster.py: {os.environ.get('MPCA_NETCLUSTER_WORKERS')} worker hosts and "
                                    f"the driver's behind {os.environ.get('MPCA_NETWORK')} links"
                                    if cluster_conf() else "nothing of a network: every process on this machine, "
                                    "loopback links")}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
