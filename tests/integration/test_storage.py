"""Outputs and checkpoints on cluster storage through Spark's own Hadoop FileSystem (file:// URIs here;
hdfs://, s3a://, abfss://, dbfs:/ take the same path on a cluster)."""
import json
import os

import pytest

from mpca import storage
from mpca.config import load_config
from mpca.errors import UserError

pytestmark = pytest.mark.cluster()


def test_hadoop_store_roundtrip_through_the_driver_jvm(spark, tmp_path):
    s = storage.open_store(f"file://{tmp_path}/h")
    assert isinstance(s, storage.HadoopStore)
    s.makedirs()
    data = os.urandom(3 * 1024 * 1024)
    s.write_atomic("blob", data)
    assert s.read("blob") == data and "blob" in s.list()
    assert not [n for n in os.listdir(tmp_path / "h") if ".tmp-" in n]
    s.delete("blob")
    assert "blob" not in s.list()


def test_a_job_writes_outputs_and_checkpoints_to_a_uri(spark, tmp_path):
    from mpca import checkpoint, job
    from mpca.ml.spec import load_model

    out, ck = f"file://{tmp_path}/out", f"file://{tmp_path}/ck"
    cfg = load_config(["conf/digits.yaml"], [f"run.output_dir={out}", f"checkpoint.dir={ck}", "checkpoint.every_cycles=5",
                                             "stop.target_error=null", "stop.max_cycles=10", "eval.every_cycles=5",
                                             "cluster.master=existing", "progress=off"])
    result = job.run(cfg, spark=spark)
    assert result.exit_code == 0
    files = sorted(os.listdir(tmp_path / "out"))
    assert {"model.pt", "model.json", "history.csv", "timeline.csv", "summary.json"} <= set(files), files
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["paths"]["model"] == f"{out}/model.pt"
    assert checkpoint.latest(ck).cycle == 10
    assert load_model(str(tmp_path / "out" / "model.pt")) is not None


def test_an_unreachable_cluster_uri_is_found_before_training(spark, tmp_path):
    from mpca import job

    cfg = load_config(["conf/digits.yaml"], [f"run.output_dir={tmp_path}/o", "checkpoint.dir=s3a://no-bucket/ck",
                                             "cluster.master=existing"])
    # s3a is a scheme a cluster's Hadoop may know: not refused before Spark; this cluster has no s3a filesystem,
    # so the check right after the session starts refuses it, before any training
    tracker = spark.sparkContext.statusTracker()
    with pytest.raises(UserError, match="not reachable from this cluster"):
        job.run(cfg, spark=spark)
    assert not tracker.getActiveJobsIds()
