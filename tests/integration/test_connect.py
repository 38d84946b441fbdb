"""Spark Connect, through a real Connect server: the one in the pyspark wheel (``SparkConnectServer``, started with
spark-submit) over ``local-cluster[2,2,1024]``, and clients in processes of their own that reach it only by its
``sc://`` address, as a remote notebook does.

mpca has no Connect mode yet (issue 57): a Connect session is refused in one line.  The second test checks, on the
real server, the primitives the Connect mode is designed on — long-lived tasks through ``mapInArrow`` (with a
resource profile, and in barrier mode), a coordinator task that tasks of another job reach over TCP, and a
client's interrupt that ends its running jobs — so that a pyspark upgrade that loses one goes red here.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

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


def test_a_connect_session_is_refused_in_one_line_that_names_what_to_use(remote):
    out = _client(remote, """
        import torch
        from pyspark.sql import SparkSession
        from mpca import Trainer, UserError

        spark = SparkSession.builder.remote(REMOTE).getOrCreate()
        df = spark.createDataFrame([([0.5] * 4, 1)] * 8, "features array<float>, label long")
        try:
            Trainer(lambda: torch.nn.Linear(4, 2), torch.nn.functional.cross_entropy,
                    lambda p: torch.optim.SGD(p, lr=0.1), agents=1, input_shape=(4,), spark=spark).fit(df)
            print("TRAINED")
        except UserError as e:
            print("REFUSED", e)
        spark.stop()
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1 and "Spark Connect session" in refused[0] and "single-user/dedicated" in refused[0], \
        out.stdout


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
        spark.stop()
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["PROFILE"] == "2" and lines["BARRIER"] == "2", out.stdout
    assert lines["COORDINATOR"] == "agent0,agent1", out.stdout
    alive, seconds, error = lines["INTERRUPTED"].split()
    assert alive == "True" and int(seconds) < 30 and error != "None", out.stdout
