"""`mpca train --dry-run` on the shared local-cluster: every check a run makes, nothing trained or written."""
import pytest
import yaml

from mpca.cli import main

pytestmark = pytest.mark.cluster()


def test_a_dry_run_checks_data_and_cluster_prints_the_resolved_config_and_trains_nothing(spark, tmp_path, capsys):
    argv = ["train", "--dry-run", "-c", "conf/digits.yaml", "cluster.master=existing", f"run.output_dir={tmp_path}/out"]
    assert main(argv + ["algorithm.name=weaksync"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["algorithm"]["name"] == "weaksync" and resolved["data"]["dataset"] == "digits"
    assert "nothing was trained" in out and not (tmp_path / "out").exists()
    assert main(argv + ["training.agents=9", "cluster.executor_wait_s=2"]) == 2  # no executor is coming
    assert "cluster too small" in capsys.readouterr().err
    assert main(argv + ["data.input_shape=[1, 4, 4]"]) == 2  # one batch through the model: the shape is wrong
    assert "input_shape" in capsys.readouterr().err
