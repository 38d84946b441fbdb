"""End to end through the console command and the notebook, each in its own process with its own Spark."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

from mpca import checkpoint
from mpca.data.datasets import load_digits
from mpca.models import SmallCNN

pytestmark = [pytest.mark.standalone, pytest.mark.usefixtures("no_shared_spark")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mpca(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _error_on_all_digits(state) -> float:
    x, y = load_digits()
    m = SmallCNN(8)
    m.load_state_dict(state)
    m.eval()
    with torch.no_grad():
        pred = m(torch.from_numpy(x).reshape(-1, 1, 8, 8)).argmax(1).numpy()
    return float((pred != y).mean())


def test_cli_trains_digits_below_5_percent(tmp_path):
    out = tmp_path / "run"
    p = _mpca(f"run.output_dir={out}", "stop.target_error=0.04", "stop.max_seconds=240", "progress=log")
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "target_reached" and summary["final_holdout_error"] < 0.05
    for key in ("model", "history", "plot", "timeline"):
        assert os.path.exists(summary["paths"][key]), key
    assert "final holdout error" in p.stdout
    state = torch.load(summary["paths"]["model"], weights_only=True)  # loads in plain PyTorch
    assert _error_on_all_digits(state) < 0.1
    assert "holdout error" in p.stderr  # progress lines (not a terminal → log lines)


def test_kill_driver_then_resume_from_checkpoint(tmp_path):
    out = tmp_path / "run"
    name = f"killtest-{uuid.uuid4().hex[:8]}"
    args = [f"run.output_dir={out}", f"run.name={name}", "checkpoint.every_cycles=5", "stop.target_error=null",
            "stop.max_seconds=null", "stop.max_cycles=400", "progress=log"]
    proc = subprocess.Popen([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckdir = out / "checkpoints"
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            ck = checkpoint.latest(str(ckdir)) if ckdir.exists() else None
            if ck is not None and ck.cycle >= 15:
                break
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("no checkpoint within 240 s")
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies mid-run
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the driver's JVM and its executors go away with it (the JVM's shutdown — stopping the local cluster and its
    # executors — has been seen to take over a minute on this 2-core machine)
    deadline = time.time() + 180
    while time.time() < deadline and subprocess.run(["pgrep", "-f", name], capture_output=True).returncode == 0:
        time.sleep(1)
    left = subprocess.run(["pgrep", "-af", name], capture_output=True, text=True).stdout
    assert not left, f"Spark outlived its driver by 180 s: {left[:300]}"

    ck = checkpoint.latest(str(ckdir))
    assert ck is not None and ck.cycle >= 15  # intact: its checksum matched
    err_at_ck = _error_on_all_digits(ck.model_state)
    resumed = _mpca(f"run.output_dir={out}", f"run.name={name}-resumed", "checkpoint.resume=true",
                    "checkpoint.every_cycles=5", "stop.target_error=null", "stop.max_seconds=null",
                    f"stop.max_cycles={ck.cycle + 40}", "training.agents=1")  # resume works with another K
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_cycle"] == ck.cycle and summary["cycles"] == ck.cycle + 40
    final_state = torch.load(summary["paths"]["model"], weights_only=True)
    assert _error_on_all_digits(final_state) <= err_at_ck
    import pandas as pd

    hist = pd.read_csv(summary["paths"]["history"]).dropna(subset=["holdout_error"])
    after = hist[hist["cycle"] > ck.cycle]["holdout_error"].to_numpy()
    assert len(after) >= 2 and after[-1] <= after[0] + 0.02  # still falling (allowing holdout noise)


def test_init_from_previous_model_on_parquet_data_and_a_missed_target_exits_4(tmp_path):
    """The nightly-retrain case: a second job starts from the first job's model, on Parquet input; it stops at
    its cycle limit short of its target (an error of 0): exit code 4, status limit_reached."""
    pq = tmp_path / "digits.parquet"
    w = subprocess.run([sys.executable, "-m", "mpca.cli", "data", "digits", str(pq)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert w.returncode == 0, w.stderr
    first = tmp_path / "first"
    p = _mpca(f"run.output_dir={first}", "stop.target_error=null", "stop.max_cycles=20", "eval.every_cycles=10",
              "data.dataset=null", f"data.path={pq}")
    assert p.returncode == 0, p.stderr[-3000:]
    second = tmp_path / "second"
    p = _mpca(f"run.output_dir={second}", f"checkpoint.init_from={first}/model.pt", "stop.target_error=0.0",
              "stop.max_cycles=3", "eval.every_cycles=3", "algorithm.alpha.hold_cycles=0")
    s1 = json.loads((first / "summary.json").read_text())
    s2 = json.loads((second / "summary.json").read_text())
    if s2["final_holdout_error"] == 0.0:  # a trained model can score every holdout row right: the target is met
        assert p.returncode == 0 and s2["status"] == "target_reached" and s2["exit_code"] == 0, p.stderr[-3000:]
    else:
        assert p.returncode == 4, p.stderr[-3000:]
        assert s2["status"] == "limit_reached" and s2["exit_code"] == 4
    # three more cycles from a trained model stay near its error, far from a fresh model's ~90 %
    assert s2["final_holdout_error"] < 0.3 and s2["final_holdout_error"] < s1["final_holdout_error"] + 0.1
    # scheduled scoring with the second model: architecture from model.json, one prediction per row
    scored = tmp_path / "scored.parquet"
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "predict", "-c", "conf/digits.yaml", "--model",
                        f"{second}/model.pt", "--data", str(pq), "--out", str(scored)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import pyarrow.parquet as pqr

    table = pqr.read_table(str(scored))
    assert table.num_rows == 1797 and "features" not in table.column_names
    pred, label = table.column("prediction").to_numpy(), table.column("label").to_numpy()
    assert (pred == label).mean() > 0.7, (pred == label).mean()
    again = subprocess.run([sys.executable, "-m", "mpca.cli", "predict", "-c", "conf/digits.yaml", "--model",
                            f"{second}/model.pt", "--data", str(pq), "--out", str(scored)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--overwrite" in again.stderr  # never overwrites by surprise


def test_notebook_executes():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "holdout error" in outputs and "predicted" in outputs and "MLflow run" in outputs


def test_unreadable_data_path_is_one_line_exit_2(tmp_path):
    """A path that exists but is not Parquet (a missing one is refused before Spark starts: unit tests)."""
    t = time.time()
    (tmp_path / "junk.parquet").write_bytes(b"this is not parquet")
    p = _mpca(f"run.output_dir={tmp_path}/run", "data.dataset=null", f"data.path={tmp_path}/junk.parquet")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("mpca:")]
    assert lines == [lines[0]] and "cannot be read as Parquet" in lines[0] and "Traceback" not in p.stderr
    assert time.time() - t < 120


def test_spark_submit_entry_point(tmp_path):
    """spark-submit spark_jobs/train.py: the job uses spark-submit's session (here without agent pinning)."""
    out = tmp_path / "run"
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    p = subprocess.run([os.path.join(bindir, "spark-submit"), "--master", "local-cluster[2,2,1024]",
                        "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.ui.enabled=false",
                        "spark_jobs/train.py", "-c", "conf/digits.yaml", f"run.output_dir={out}",
                        "stop.target_error=null", "stop.max_cycles=10", "eval.every_cycles=5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cycles"] == 10 and summary["final_holdout_error"] < 0.5


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_after_the_cycle_and_write_everything(tmp_path, sig, code):
    """How YARN, Kubernetes and Airflow end a job: the run stops after its current cycle and still writes its
    model, final checkpoint and summary; the exit code says which signal (128 + signum)."""
    out = tmp_path / "run"
    name = f"sigtest-{uuid.uuid4().hex[:8]}"
    workers_before, apps_before = _pyspark_workers(), set(os.listdir(_spark_work())) if os.path.isdir(_spark_work()) else set()
    proc = subprocess.Popen([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml", f"run.output_dir={out}",
                             f"run.name={name}", "stop.target_error=null", "stop.max_seconds=null",
                             "stop.max_cycles=1000", "checkpoint.every_cycles=5", "progress=log"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and checkpoint.latest(str(out / "checkpoints")) is None:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.5)
        t_sig = time.time()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert time.time() - t_sig < 60
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "interrupted"
    assert summary["exit_code"] == code and os.path.exists(summary["paths"]["model"])
    assert checkpoint.latest(str(out / "checkpoints")).cycle == summary["cycles"]  # the final checkpoint
    assert "Traceback" not in err
    deadline = time.time() + 30
    while time.time() < deadline and subprocess.run(["pgrep", "-f", name], capture_output=True).returncode == 0:
        time.sleep(1)
    assert subprocess.run(["pgrep", "-f", name], capture_output=True).returncode != 0, "Spark outlived the job"
    assert len(_pyspark_workers()) <= len(workers_before), "a Python worker outlived the job"
    new_apps = set(os.listdir(_spark_work())) - apps_before
    assert new_apps, "no application directory: the test looks in the wrong place"
    left = [os.path.join(a, e, f) for a in new_apps for e in os.listdir(os.path.join(_spark_work(), a))
            if os.path.isdir(os.path.join(_spark_work(), a, e))
            for f in os.listdir(os.path.join(_spark_work(), a, e)) if f.startswith("mpca-")]
    assert not left, f"sockets or lock files left in the executors' directories: {left}"


def _spark_work() -> str:
    """Where local-cluster executors run: <SPARK_HOME>/work/<app>/<executor>."""
    import pyspark

    return os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "work")


def _pyspark_workers() -> list:
    from mpca.bench.exchange import processes_with

    return processes_with(b"pyspark.daemon", b"pyspark.worker")


def test_a_language_model_job_from_the_corpus_to_scored_windows(tmp_path):
    """`mpca data pytext` (split by file), `mpca train -c conf/lm.yaml` on its Parquet to a target loss, and
    `mpca predict` on the held-out files: the predicted next byte after every prefix of each window."""
    data = tmp_path / "pytext"
    w = subprocess.run([sys.executable, "-m", "mpca.cli", "data", "pytext", str(data), "--window", "32",
                        "--max-mb", "0.4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert w.returncode == 0 and "split by file" in w.stdout, w.stderr
    files = json.loads((data / "files.json").read_text())["files"]
    assert files["holdout"] and not set(files["train"]) & set(files["holdout"])
    out = tmp_path / "lm"
    small = ["data.input_shape=[32]", "data.text.window=32", "model.args.context=32", "model.args.width=32", "model.args.layers=2",
             "model.args.heads=2", "optimizer.lr=0.003", "training.batch_size=16"]
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/lm.yaml", f"run.output_dir={out}",
                        "data.dataset=null", f"data.path={data}/train", f"data.holdout_path={data}/holdout",
                        *small, "stop.target_loss=4.0", "stop.max_seconds=240", "progress=log",
                        "data.holdout_max_rows=100000"], cwd=ROOT,  # every held-out window scored, as predict does
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "loss" and summary["stop_reason"] == "target_loss", summary
    assert summary["final_holdout_loss"] <= 4.0 and "holdout loss" in p.stderr and "bits" in p.stderr
    import pandas as pd

    hist = pd.read_csv(out / "history.csv").dropna(subset=["holdout_loss"])
    assert (abs(hist["holdout_bits"] - hist["holdout_loss"] / 0.6931471805599453) < 1e-9).all()
    scored = tmp_path / "scored"
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "predict", "-c", "conf/lm.yaml", "--model",
                        f"{out}/model.pt", "--data", f"{data}/holdout", "--out", str(scored), *small], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    import pyarrow.parquet as pqr

    table = pqr.read_table(str(scored))
    pred = table.column("prediction").to_pylist()
    label = table.column("label").to_pylist()
    assert len(pred) == table.num_rows > 100 and all(len(r) == 32 for r in pred)
    wrong = sum(a != b for r, s in zip(pred, label) for a, b in zip(r, s)) / (32 * len(pred))
    assert abs(wrong - summary["final_holdout_error"]) < 1e-6  # the run's own per-token error on these windows


def test_the_language_model_notebook_executes():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(ROOT, "notebooks", "language_model.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "bits per byte" in outputs and "predicted" in outputs
