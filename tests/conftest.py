"""Shared fixtures.  Integration tests share one real local-cluster Spark session per cluster shape.

A test asks for a shape with ``@pytest.mark.cluster(executors=3, cores=2, fake_gpus=0)`` (``gpus=1``: this host's
real GPUs, tests/gpu only); tests are
ordered so that each shape's session starts once, and every session is stopped at the end.
"""
import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM the tests start (the drivers, local-cluster's workers and executors, spark-submit's launcher, those of
# the CLI and notebook subprocesses) compiles with C1 alone: the tests' JVMs live for seconds to minutes, and on
# 2 cores a local-cluster session then starts in ~7 s instead of ~11 s; test_runtime + test_wire ran in 116 s
# instead of 133 s.  Only the JIT differs from what users run; benchmarks never go through this file.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
# Spark SQL's warehouse (./spark-warehouse by default: a catalog lookup creates it) of the shared sessions in a
# temporary directory: tests write only under temporary directories (CI checks the tree).  Not through
# PYSPARK_SUBMIT_ARGS: a session launched with it scheduled the overlap tests' exchange tasks differently.
_WAREHOUSE = tempfile.mkdtemp(prefix="mpca-tests-warehouse-")
atexit.register(shutil.rmtree, _WAREHOUSE, True)
DEFAULT_SHAPE = (2, 2, 0, False, 1, 0)
SECURE_CONF = {  # Spark's own authentication and encryption (RPC, shuffle/broadcast blocks, Python broadcasts)
    "spark.authenticate": "true",
    "spark.authenticate.secret": "mpca-test-secret",
    "spark.network.crypto.enabled": "true",
    "spark.io.encryption.enabled": "true",
}
_state = {"shape": None, "spark": None}
# tests/spark35 checks the second environment of `make test-spark35` (which sets MPCA_EXPECT_PYSPARK)
collect_ignore = [] if os.environ.get("MPCA_EXPECT_PYSPARK") else ["spark35"]
# tests/gpu needs a CUDA device: `make test-gpu` (MPCA_GPU_TESTS=1) runs it, and fails without one
collect_ignore += [] if os.environ.get("MPCA_GPU_TESTS") else ["gpu"]


def _shape(item):
    m = item.get_closest_marker("cluster")
    if m is None:
        return DEFAULT_SHAPE if "spark" in getattr(item, "fixturenames", ()) else None
    kw = m.kwargs
    return (kw.get("executors", 2), kw.get("cores", 2), kw.get("fake_gpus", 0), kw.get("secure", False),
            kw.get("agents_per_executor", 1), kw.get("gpus", 0))


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster(executors, cores, fake_gpus, secure, agents_per_executor, gpus): local-cluster the test needs")
    config.addinivalue_line("markers", "standalone: starts its own Spark in a subprocess (the shared one is stopped)")


def pytest_collection_modifyitems(session, config, items):
    # tests without Spark first (unit tests, and the integration/e2e tests that start only plain processes),
    # then Spark tests grouped by cluster shape (default shape first), then those that start their own Spark
    def key(item):
        if item.get_closest_marker("standalone"):
            return (2,)
        s = _shape(item)
        return (0,) if s is None else (1, s != DEFAULT_SHAPE, s)

    items.sort(key=key)


def _session_for(shape):
    from mpca.runtime.cluster import local_session

    if _state["shape"] != shape:
        if _state["spark"] is not None:
            _state["spark"].stop()
        executors, cores, gpus, secure, per, real_gpus = shape
        _state["spark"] = local_session(executors, cores, 1024, app_name=f"mpca-tests-{executors}x{cores}g{gpus}",
                                        fake_gpus_per_executor=gpus, gpus_per_executor=real_gpus,
                                        conf={"spark.sql.warehouse.dir": _WAREHOUSE, **(SECURE_CONF if secure else {})},
                                        agents_per_executor=per)
        _state["spark"].sparkContext.setLogLevel("ERROR")
        _state["shape"] = shape
    return _state["spark"]


@pytest.fixture(scope="session")
def _spark_sessions():
    yield _session_for
    if _state["spark"] is not None:
        _state["spark"].stop()
        _state["spark"] = None


@pytest.fixture
def spark(request, _spark_sessions):
    return _spark_sessions(_shape(request.node) or DEFAULT_SHAPE)


@pytest.fixture(scope="session", autouse=True)
def _ship_test_helpers_by_value():
    """Executors cannot import tests/: ship the helper module's functions by value."""
    from pyspark import cloudpickle

    from tests import helpers

    cloudpickle.register_pickle_by_value(helpers)
    yield


@pytest.fixture
def mlflow_environment(monkeypatch):
    """No MLFLOW_* variables from outside; afterwards none left behind, no active run, no tracking URI or
    experiment set (mlflow.set_tracking_uri/set_experiment export MLFLOW_TRACKING_URI/MLFLOW_EXPERIMENT_ID)."""
    import sys

    from mpca.tracking import MLFLOW_ENV

    for k in MLFLOW_ENV:
        monkeypatch.delenv(k, raising=False)
    yield
    mlflow = sys.modules.get("mlflow")  # None while a test hides it
    if mlflow is not None:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
        mlflow.tracking.fluent._active_experiment_id = None
    for k in MLFLOW_ENV:
        os.environ.pop(k, None)


@pytest.fixture
def no_shared_spark(_spark_sessions):
    """Stop the shared session: the test starts Spark in its own process (2 cores cannot host both)."""
    if _state["spark"] is not None:
        _state["spark"].stop()
        _state["spark"] = None
        _state["shape"] = None
