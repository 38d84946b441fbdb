"""Spark Connect, through a real Connect server: the one in the pyspark wheel (``SparkConnectServer``, started with
spark-submit) over ``local-cluster[2,2,1024]``, and clients in processes of their own that reach it only by its
``sc://`` address, as a remote notebook does.

``Trainer.fit`` on such a session runs the Connect mode (:mod:`mpca.connect`).  The last test checks, on the
real server, the primitives the Connect mode is designed on — long-lived tasks through ``mapInArrow`` (with a
resource profile, and in barrier mode), a coordinator task that tasks of another job reach over TCP, and a
client's interrupt that ends its running jobs — so that a pyspark upgrade that loses one goes red here.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mpca.models import SmallCNN

pytestmark = pytest.mark.standalone  # its own Spark (the Connect server's); the shared session is stopped first

STARTED = "Spark Connect server started"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """The ``sc://`` address of a Connect server over local-cluster, stopped (its whole process group) at the end."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    env = {**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [os.path.join(spark_home, "bin", "spark-submit"), "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local-cluster[2,2,1024]",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false",
             "--conf", f"spark.sql.warehouse.dir={log_path.parent / 'warehouse'}", "--name", "mpca-connect-test",
             "spark-internal"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 180
        while STARTED not in log_path.read_text(errors="replace"):
            if server.poll() is not None or time.time() > deadline:
                pytest.fail(f"the Connect server did not start: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def _client(remote: str, code: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``code`` run by a client process of its own, with ``REMOTE`` the server's address; its only route to the
    cluster is that address."""
    script = f"REMOTE = {remote!r}\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})


TRAIN = """
    import glob, json, os, signal, sys, threading, time
    import torch
    from pyspark.sql import SparkSession
    from mpca import Trainer
    from mpca.data.datasets import arrow_table, load
    from mpca.models import SmallCNN, cross_entropy

    spark = SparkSession.builder.remote(REMOTE).getOrCreate()
    x, y = load("digits")
    df = spark.createDataFrame(arrow_table(x, y).to_pandas()).repartition(2)

    def optimizer(params):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
"""


def test_mpca_trains_over_spark_connect_and_a_killed_agent_is_replaced(remote, tmp_path):
    """The classic API on a Connect session: the coordinator task and two agents on the server's local-cluster,
    history rows back to the client's on_cycle as the run goes, one agent's process killed mid-run (its Spark
    task retried: the replacement announces itself, takes the joint model and contributes again), a connection
    to an agent's port without the run's secret refused while the run goes on, the coordinator's warning about
    the lost agent in the client's log, and the
    result — model, history, timeline, counters — in the client, with the run's directory as the only channel."""
    out = _client(remote, TRAIN + f"""
    shared = {str(tmp_path)!r}
    rows, killed = [], []

    refused = []

    def on_cycle(row):
        rows.append(row)
        if len(rows) == 2:  # a connection to an agent's port without the run's secret is refused
            from mpca.runtime.channel import Channel, ChannelError

            [announce] = glob.glob(os.path.join(shared, "*", "agent-0.json"))
            where = json.load(open(announce))
            try:
                Channel.connect_tcp(where["host"], where["port"], b"not the run's secret" * 2, timeout=10)
            except ChannelError as e:
                refused.append(str(e))
        if len(rows) == 4 and not killed:  # the agents train: kill agent 1's process
            [announce] = glob.glob(os.path.join(shared, "*", "agent-1.json"))
            pid = json.load(open(announce))["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    res = Trainer(SmallCNN, cross_entropy, optimizer, agents=2, input_shape=(1, 8, 8), max_seconds=30,
                  eval_every_cycles=5, connect_dir=shared, spark=spark, on_cycle=on_cycle).fit(df)
    timeline = res.timeline.to_pandas()
    joined = sorted({{a for agents in timeline["joined"] for a in agents}})
    print("RESULT", json.dumps({{"error": res.final.error, "rows": len(rows), "history": len(res.history),
                                "cycles": res.cycles, "timeline": len(timeline), "joined": joined,
                                "killed": len(killed), "cycle_jobs": res.counters.jobs["cycle"],
                                "refused": refused,
                                "stop": res.stop_reason, "params": sum(p.numel() for p in res.model.parameters()),
                                "left": sorted(os.listdir(shared))}}))
    spark.stop()
""", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["killed"] == 1 and result["joined"] == [1], result  # the replacement took the joint model
    # the coordinator's warnings reach the client's log (its executor's log is out of a Connect user's sight)
    assert "coordinator: agent 1 did not answer in cycle" in out.stderr, out.stderr[-3000:]
    assert len(result["refused"]) == 1, result  # ChannelError: the handshake failed
    assert result["error"] < 0.05 and result["stop"] == "max_seconds", result
    assert result["rows"] >= 5 and result["history"] == result["rows"] + 1, result  # every row reached on_cycle
    assert result["cycles"] == result["timeline"] == result["cycle_jobs"] > 20, result
    assert result["params"] == sum(p.numel() for p in SmallCNN().parameters())
    assert len(result["left"]) == 1  # the run's directory, kept: the user's connect_dir


@pytest.mark.parametrize("algorithm", ["mpca", "easgd"])
def test_the_coordinators_task_lost_mid_run_resumes_from_its_checkpoint_and_the_agents_rejoin(remote, tmp_path,
                                                                                              algorithm):
    """The coordinator's process killed after a checkpoint: Spark runs its task again, which resumes from the
    last checkpoint; mpca's agents (still running) rejoin from that joint model, EASGD's find the parameter
    service (whose address they read in the run's directory) at its new address; the history is numbered on
    from the first attempt's rows.  mpca's run ends at its time limit.  EASGD's has no ``connect_dir`` (a
    temporary run directory of this machine) and is stopped from the client (``request_stop``) three rows after
    the resume: the stop reaches the new coordinator, the run ends after its cycle with ``interrupted`` and
    still returns its model, and the temporary directory is gone."""
    out = _client(remote, TRAIN + f"""
    import tempfile
    algorithm = {algorithm!r}
    connect_dir = {str(tmp_path / "shared")!r} if algorithm == "mpca" else None
    checkpoints = {str(tmp_path / "ck")!r}
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mpca-connect-*")))
    killed, attempts, trainer = [], [], None

    def coordinator():
        found = glob.glob(os.path.join(connect_dir, "*", "coordinator.json")) if connect_dir else \\
            [os.path.join(d, "coordinator.json") for d in set(glob.glob(os.path.join(tempfile.gettempdir(),
                                                                                      "mpca-connect-*"))) - before]
        [where] = found
        return json.load(open(where))

    def on_cycle(row):
        if not killed and os.path.isdir(checkpoints) and any(n.startswith("ckpt") for n in os.listdir(checkpoints)):
            os.kill(coordinator()["pid"], signal.SIGKILL)
            killed.append(row["cycle"])
        elif killed and row["cycle"] >= 10:  # a row of the resumed coordinator
            attempts.append(coordinator()["attempt"])
            if algorithm == "easgd" and len(attempts) == 3:
                trainer.request_stop()

    trainer = Trainer(SmallCNN, cross_entropy, optimizer, agents=2, input_shape=(1, 8, 8),
                      max_seconds=35 if algorithm == "mpca" else 90, eval_every_cycles=5, checkpoint_dir=checkpoints, checkpoint_every=10, connect_dir=connect_dir,
                      algorithm=algorithm, spark=spark, on_cycle=on_cycle)
    res = trainer.fit(df)
    timeline = res.timeline.to_pandas()
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "mpca-connect-*")))
    print("RESULT", json.dumps({{"killed_at": killed, "attempts": attempts,
                                "first_cycle": res.first_cycle, "stop": res.stop_reason, "error": res.final.error,
                                "joined": sorted({{a for agents in timeline["joined"] for a in agents}}),
                                "service_bytes": res.counters.service_bytes, "new_dirs": sorted(after - before),
                                "rows": len(res.history), "cycles": list(res.history["cycle"])}}))
    spark.stop()
""", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert len(result["killed_at"]) == 1 and result["attempts"][-1:] == [1], result  # Spark's retry took over
    assert result["first_cycle"] >= 10, result  # from the checkpoint
    assert result["joined"] == ([0, 1] if algorithm == "mpca" else []), result  # mpca's agents rejoin
    assert result["error"] < 0.05 and result["rows"] > 3, result
    if algorithm == "mpca":
        assert result["stop"] == "max_seconds", result
    else:
        assert result["stop"] == "interrupted", result
        assert result["service_bytes"] > 0 and result["new_dirs"] == [], result


def test_a_client_that_dies_mid_run_stops_its_run_in_the_cluster(remote, tmp_path):
    """A Connect server does not end the jobs of a client killed with kill -9: the run's coordinator stops the
    run once the client has not said it is there for cluster.client_gone_s (10 s here), still writing its
    result, and its agents stop with it."""
    shared = tmp_path / "shared"
    script = f"REMOTE = {remote!r}\n" + textwrap.dedent(TRAIN + f"""
    res = Trainer(SmallCNN, cross_entropy, optimizer, agents=2, input_shape=(1, 8, 8), max_seconds=600,
                  eval_every_cycles=5, connect_dir={str(shared)!r}, client_gone_s=10, spark=spark,
                  on_cycle=lambda row: print("ROW", row["cycle"], flush=True)).fit(df)
    """)
    errors = open(tmp_path / "client.err", "w")
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=errors,
                              text=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    try:
        rows = 0
        for line in client.stdout:
            rows += line.startswith("ROW")
            if rows == 3:
                break
        assert rows == 3, (tmp_path / "client.err").read_text()[-3000:]
        killed = time.time()
        client.kill()
    finally:
        client.kill()
        client.wait(30)
        errors.close()
    [run] = list(shared.iterdir())
    while not (run / "result.json").exists() and time.time() - killed < 120:
        time.sleep(1)
    result = json.loads((run / "result.json").read_text())
    stopped_after = time.time() - killed
    assert result["stop_reason"] == "interrupted" and stopped_after < 60, (result["stop_reason"], stopped_after)
    stopped = sorted(a["agent"] for a in result["agents"])
    assert stopped == [0, 1], result["agents"]  # both agents answered the stop: their tasks end with the run


def test_mpca_train_runs_on_a_connect_server_and_refuses_a_dead_address(remote, tmp_path):
    """``cluster.master: sc://…`` for the CLI job: the bundled digits, trained by sync to the config's target from a client
    of the server, outputs written as for a classic job; an address where nothing listens fails in one line
    (the Connect client itself would retry for minutes)."""
    cli = [sys.executable, "-m", "mpca.cli", "train", "-c", os.path.join(os.getcwd(), "conf", "digits.yaml"),
           f"run.output_dir={tmp_path / 'out'}", "stop.max_seconds=60", "algorithm.name=sync"]
    out = subprocess.run(cli + [f"cluster.master={remote}"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "target_reached" and summary["cycles"] > 0, summary
    assert (tmp_path / "out" / "model.pt").exists() and (tmp_path / "out" / "timeline.csv").exists()
    dead = subprocess.run(cli + [f"cluster.master=sc://127.0.0.1:{_free_port()}"], capture_output=True, text=True,
                          timeout=120)
    assert dead.returncode != 0 and "no Spark Connect server answers at" in dead.stderr, dead.stderr[-2000:]
    assert "Traceback" not in dead.stderr


def test_a_cluster_without_room_for_the_agents_fails_in_one_line_and_leaves_no_job(remote):
    """Four agents and a coordinator on four task slots: the coordinator's wait for the fourth agent ends after
    cluster.agent_start_timeout_s with one line that says what a Connect run needs, and no job of the run keeps
    a slot (a barrier job that needs all four slots at once runs right after)."""
    out = _client(remote, TRAIN + """
    from mpca import RunFailedError

    try:
        Trainer(SmallCNN, cross_entropy, optimizer, agents=4, input_shape=(1, 8, 8), max_seconds=60,
                agent_start_timeout_s=15, spark=spark).fit(df.repartition(4))
    except RunFailedError as e:
        print("FAILED", str(e).replace("\\n", " "))
    t = time.time()
    def held(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"x": [1]})
    import pyarrow as pa
    done = []
    job = threading.Thread(target=lambda: done.append(
        spark.range(0, 4, 1, 4).mapInArrow(held, "x long", barrier=True).collect()), daemon=True)
    job.start()
    job.join(60)
    print("FREED", bool(done), round(time.time() - t))
    spark.stop()
""", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert "free task slot" in lines["FAILED"], lines  # the coordinator waited for an agent, or never started
    assert lines["FREED"].startswith("True"), lines


def test_the_primitives_the_connect_mode_stands_on(remote):
    """Long-lived tasks through mapInArrow with a resource profile and in barrier mode; a coordinator task that
    the tasks of a second, concurrent job reach over TCP (its address through storage both sides reach); and the
    client's interruptAll, which ends a job that would otherwise run for ten minutes."""
    out = _client(remote, """
        import os, tempfile, threading, time
        import pyarrow as pa
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(REMOTE).getOrCreate()
        address = os.path.join(tempfile.mkdtemp(prefix="mpca-connect-"), "coordinator")

        def held(batches):
            import os, time
            for _ in batches:
                pass
            time.sleep(2)
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})

        profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(1)).build
        pids = spark.range(0, 2, 1, 2).mapInArrow(held, "pid long", profile=profile).collect()
        print("PROFILE", len({r.pid for r in pids}))
        print("BARRIER", len(spark.range(0, 2, 1, 2).mapInArrow(held, "pid long", barrier=True).collect()))

        def coordinator(batches):
            import os, socket
            for _ in batches:
                pass
            srv = socket.socket()
            srv.bind(("127.0.0.1", 0))
            srv.listen(4)
            srv.settimeout(60)
            with open(address + ".tmp", "w") as f:
                f.write(str(srv.getsockname()[1]))
            os.replace(address + ".tmp", address)
            heard = []
            for _ in range(2):
                conn, _ = srv.accept()
                heard.append(conn.recv(16).decode())
                conn.close()
            yield pa.RecordBatch.from_pydict({"heard": [",".join(sorted(heard))]})

        def agents(batches):
            import os, socket, time
            me = [v for b in batches for v in b.column(0).to_pylist()][0]
            while not os.path.exists(address):
                time.sleep(0.1)
            with socket.create_connection(("127.0.0.1", int(open(address).read())), timeout=10) as s:
                s.sendall(f"agent{me}".encode())
            yield pa.RecordBatch.from_pydict({"ok": [me]})

        got = {}
        coord = threading.Thread(target=lambda: got.setdefault(
            "coordinator", spark.range(0, 1, 1, 1).mapInArrow(coordinator, "heard string").collect()))
        coord.start()
        got["agents"] = spark.range(0, 2, 1, 2).mapInArrow(agents, "ok long").collect()
        coord.join(90)
        print("COORDINATOR", got["coordinator"][0].heard)

        def forever(batches):
            import time
            for _ in batches:
                pass
            time.sleep(600)
            yield pa.RecordBatch.from_pydict({"x": [1]})

        ended = {}
        def run():
            try:
                spark.range(0, 2, 1, 2).mapInArrow(forever, "x long").collect()
            except Exception as e:
                ended["error"] = type(e).__name__
        job = threading.Thread(target=run)
        job.start()
        time.sleep(4)
        t = time.time()
        spark.interruptAll()
        job.join(60)
        print("INTERRUPTED", not job.is_alive(), round(time.time() - t), ended.get("error"))
        import shutil
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)
        spark.stop()
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["PROFILE"] == "2" and lines["BARRIER"] == "2", out.stdout
    assert lines["COORDINATOR"] == "agent0,agent1", out.stdout
    alive, seconds, error = lines["INTERRUPTED"].split()
    assert alive == "True" and int(seconds) < 30 and error != "None", out.stdout
