"""`mpca train` against a real MLflow tracking server (``mlflow server``: SQLite backend and registry, artifacts
uploaded through the server), started here: params, metrics, files, and the model as an MLflow PyTorch model
that loads (by run and from the registry) and predicts as mpca's own model.pt does.

``mlflow server`` is in the full ``mlflow`` package (the dev extra installs it); mpca itself needs only
mlflow-skinny."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

pytestmark = [pytest.mark.standalone, pytest.mark.usefixtures("no_shared_spark")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def mlflow_server(tmp_path):
    """The URI of an MLflow tracking server of its own (process group killed at the end)."""
    port = _free_port()
    log = open(tmp_path / "mlflow-server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db",
                             "--artifacts-destination", str(tmp_path / "artifacts")],
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240  # ~35 s on a busy 2-core machine
        while not _answers(f"{uri}/health"):
            assert proc.poll() is None, (tmp_path / "mlflow-server.log").read_text()[-3000:]
            assert time.time() < deadline, "mlflow server did not answer within 240 s"
            time.sleep(1)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the server, its uvicorn worker and job runners: a test's store
        except ProcessLookupError:
            pass
        proc.wait(30)
        log.close()


def test_train_logs_and_registers_the_model_on_a_tracking_server(tmp_path, mlflow_server, monkeypatch):
    import mlflow

    from mpca.data.datasets import load_digits
    from mpca.ml import load_model

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # the config alone decides
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml", f"run.output_dir={out}",
                        "stop.target_error=null", "stop.max_seconds=null", "stop.max_cycles=10", "eval.every_cycles=5",
                        f"tracking.mlflow.tracking_uri={mlflow_server}", "tracking.mlflow.experiment=mpca-e2e",
                        "tracking.mlflow.run_name=digits", "tracking.mlflow.register_as=digits-cnn"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # for this test's own MLflow calls (restored after)
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("mpca-e2e").experiment_id])
    assert run.info.run_name == "digits" and run.info.status == "FINISHED"
    assert run.data.params["stop.max_cycles"] == "10" and run.data.tags["stop_reason"] == "max_cycles"
    assert run.data.metrics["final_holdout_error"] == pytest.approx(summary["final_holdout_error"])
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "holdout_error")]
    cycles = {int(line.split(",")[1]) for line in (out / "history.csv").read_text().splitlines()[1:]}
    assert steps and steps == sorted(set(steps)) and set(steps) <= cycles  # step = the history row's cycle
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.pt", "model.json", "history.csv", "summary.json", "config.yaml"} <= files

    version = client.get_model_version("digits-cnn", "1")
    assert version.run_id == run.info.run_id
    assert summary["tracking"]["mlflow"] == {  # a scheduler finds the run and the model from summary.json
        "run_id": run.info.run_id, "experiment_id": run.info.experiment_id, "tracking_uri": mlflow_server,
        "model_uri": f"runs:/{run.info.run_id}/model", "registered_as": "digits-cnn"}
    info = mlflow.models.get_model_info(f"runs:/{run.info.run_id}/model")
    (spec,) = info.signature.inputs.inputs  # signature and input example from the training rows
    assert (str(spec.type), spec.shape) == ("float32", (-1, 1, 8, 8))
    assert info.saved_input_example_info["type"] == "ndarray"
    example = mlflow.models.Model.load(info.model_uri).load_input_example(
        mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(tmp_path / "dl")))
    assert example.shape == (5, 1, 8, 8) and str(example.dtype) == "float32"

    x = torch.from_numpy(load_digits()[0].reshape(-1, 1, 8, 8))  # every digit: another batch size than the example's
    with torch.no_grad():
        expected = load_model(str(out / "model.pt"))(x)
        for uri in (f"runs:/{run.info.run_id}/model", "models:/digits-cnn/1"):
            got = mlflow.pytorch.load_model(uri)(x)
            assert torch.allclose(got, expected, atol=1e-5), uri
