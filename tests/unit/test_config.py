"""Configuration mistakes: one clear line naming the key, exit code 2, no traceback (the console command in
its own process: tests/e2e/test_cli_errors.py)."""
import os

import pytest

from mpca.cli import main
from mpca.config import load_config
from mpca.errors import UserError

MISTAKES = [
    (["training.agnts=2"], "unknown configuration key 'training.agnts'"),
    (["training.agents=two"], "'training.agents'"),
    (["training.agents=0"], "'training.agents'"),
    (["optimizer.name=rmsprop"], "'optimizer.name'"),
    (["optimizer.lr=-1"], "'optimizer.lr'"),
    (["stop.max_cycles=null", "stop.max_seconds=null", "stop.target_error=null"], "set at least one of stop."),
    (["cluster.master=local[2]"], "'cluster.master'"),
    (["training.agents=5"], "training.agents=5 but cluster.master has 2 executor(s)"),
    (["data.dataset=null"], "give exactly one of data.dataset"),
    (["algorithm.alpha.peak=2"], "alpha.peak must lie in [0, 1]"),
    (["algorithm.mpca.alpha.peak=2"], "alpha.peak must lie in [0, 1]"),
    (["wire.format=fp8"], "'wire.format'"),
    (["wire.block=8"], "'wire.block'"),
    (["algorithm.name=sgd"], "unknown algorithm 'sgd'; choose one of adag, aeasgd, agn, ddp, delayed_diloco, diloco, downpour, dynsgd, easgd, mpca, rudra-async, rudra-hardsync, rudra-softsync, single, streaming_diloco, sync"),
    (["algorithm.name=sync", "algorithm.every=0"], "'algorithm.every'"),
    (["algorithm.name=sync", "algorithm.shards=3"], "unknown configuration key 'algorithm.shards'"),
    (["algorithm.name=single"], "algorithm 'single' trains one agent"),
    (["data.input_shape=[0,8]"], "'data.input_shape'"),
    (["data.holdout=1.5"], "'data.holdout'"),
    (["cluster.master=local-cluster[2,1,1024]"], "agents need 2"),
    (["stop.target_error=5"], "'stop.target_error'"),
    (["nonsense"], "is not key=value"),
    (["algorithm.shards=0"], "'algorithm.shards'"),
]


def test_missing_and_broken_config_files(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_unknown_model_and_unwritable_output(tmp_path, capsys):
    assert main(["train", "-c", "conf/digits.yaml", "model.name=vgg99", f"run.output_dir={tmp_path}/out"]) == 2
    assert "model.name 'vgg99' is unknown" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # a directory cannot be created under a file, not even by root
    assert main(["train", "-c", "conf/digits.yaml", f"run.output_dir={blocker}/out"]) == 2
    assert "not writable" in capsys.readouterr().err


def test_presets_merge_and_overrides_win():
    cfg = load_config(["conf/digits.yaml", "conf/cluster/yarn_gpu.yaml"], ["cluster.executor_wait_s=5"])
    assert cfg.cluster.master == "existing" and cfg.training.use_gpus is True
    assert cfg.cluster.executor_wait_s == 5 and cfg.model.name == "small_cnn"
    assert cfg.algorithm.hyper().alpha(0) == 0.0


def test_one_config_holds_every_algorithm_and_name_picks_one():
    from mpca.algorithm import algorithm_names

    for name in algorithm_names():
        agents = ["training.agents=1"] if name == "single" else []
        cfg = load_config(["conf/digits.yaml"], [f"algorithm.name={name}", *agents])
        assert cfg.algorithm.name == name
    assert load_config(["conf/digits.yaml"], ["algorithm.name=sync"]).algorithm.every == 20  # its subsection
    mp = load_config(["conf/digits.yaml"], ["algorithm.alpha.peak=0.3"]).algorithm
    assert mp.alpha.peak == 0.3 and mp.alpha.target == 0.05  # a flat override merges into the subsection


def test_trainer_keywords_map_onto_the_one_settings_object():
    from mpca.config import Settings, settings_from
    from mpca.errors import UserError

    s = settings_from(agents=3, max_cycles=7, algorithm="diloco", input_shape=(1, 8, 8), stop={"max_seconds": 5})
    assert isinstance(s, Settings) and s.training.agents == 3 and s.algorithm.name == "diloco"
    assert s.stop.max_seconds == 5 and s.stop.max_cycles is None  # a whole section replaces the shortcut's
    assert settings_from(s, algorithm={"every": 9}).algorithm.every == 9  # same algorithm: settings merge
    with pytest.raises(UserError, match="unknown option 'agentz'"):
        settings_from(agentz=2)
    with pytest.raises(UserError, match="'data.holdout'"):
        settings_from(holdout=1.0)


@pytest.mark.parametrize("path", ["conf/digits.yaml", "conf/mnist_mlp.yaml", "conf/teacher_mlp.yaml", "conf/lm.yaml",
                                  "conf/resnet20.yaml"])
def test_shipped_configs_validate(path):
    cfg = load_config([path])
    from mpca.models import build_model

    params = sum(p.numel() for p in build_model(cfg.model.name, cfg.model.args).parameters())
    assert params > {"digits": 10_000, "resnet20": 250_000}.get(os.path.basename(path)[:-5], 1_000_000)


def _parquet(tmp, name, **columns):
    """A small Parquet data set in ``tmp/name`` (digits rows unless columns are replaced)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mpca.data.datasets import arrow_table, load

    x, y = load("digits")
    table = arrow_table(x[:64], y[:64])
    for col, values in columns.items():
        table = table.drop_columns([col]) if values is None else table.set_column(
            table.schema.get_field_index(col), col, pa.array(values)) if col in table.column_names else \
            table.append_column(col, pa.array(values))
    os.makedirs(tmp / name, exist_ok=True)
    pq.write_table(table.slice(0, 0) if name == "empty" else table, str(tmp / name / "part-0.parquet"))
    return f"data.path={tmp / name}"


def _on_data(tmp, name, **columns):
    return ["train", "-c", "conf/digits.yaml", "data.dataset=null", _parquet(tmp, name, **columns)]


def _bad_inputs(tmp):
    """Every mistake a user can make before training starts: (argv, text the one line must hold)."""
    latin1 = tmp / "latin1.yaml"
    latin1.write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    train = ["train", "-c", "conf/digits.yaml"]
    return [(train + over, expected) for over, expected in MISTAKES] + [
        (["train", "-c", "conf/"], "is a directory"),
        (["train", "-c", str(latin1)], "not UTF-8"),
        (["train"], "give a job config"),
        (train + ["data.dataset=null", f"data.path={tmp}/missing.parquet"], "data.path"),
        (train + [f"checkpoint.init_from={tmp}/nope.pt"], "checkpoint.init_from"),
        (train + ["checkpoint.dir=nosuch://bucket/ck"], "not reachable"),
        (train + ["run.output_dir=nosuch://nn/x"], "unknown scheme 'nosuch'"),
        (train + ["algorithm.name=ddp", "algorithm.timeout_s=-1"], "'algorithm.timeout_s'"),
        (train + ["cluster.service_port=70000"], "'cluster.service_port'"),
        (train + ["cluster.master=sc://spark-connect:15002:7"], "is not a Spark Connect address"),
        (train + ["cluster.gpus=two"], "cluster.gpus is auto, none or a whole number"),
        (train + ["cluster.gpus=64"], "CUDA device(s) visible"),
        (train + ["training.min_agents=3"], "min_agents=3 exceeds training.agents=2"),
        (train + ["training.agents=3-1"], "a range needs 1 <= MIN <= MAX"),
        (train + ["training.device_step_s=0.3"], "training.device_step_s is now emulation.device_step_s"),  # moved
        (train + ["training.device_speed={1: 0.5}"], "training.device_speed is now emulation.device_speed"),
        (train + ["emulation.device_speed={1: 0.5}"], "emulation.device_speed needs emulation.device_step_s"),
        (train + ["training.agents=2-x"], "give a count (4) or a range MIN-MAX"),
        (train + ["data.path=x.parquet"], "data.path 'x.parquet' does not exist"),  # the override's source wins
        (train + ["data.path=x.csv", "data.format=csv"], "Spark reads as csv"),
        (train + ["data.format=csv;"], "data.format"),
        (["bench", "compare", "--algorithms", "mpca,adam"], "unknown 'adam'"),
        (["bench", "compare", "--targets", "0.1,x"], "--targets"),
        (["bench", "compare", "--device-speed", "fast"], "--device-speed takes AGENT:SPEED"),
        (["bench", "compare", "--device-speed", "1:0.5,2:0.5"], "the comparison slows one agent"),
        (["bench", "compare", "--straggler", "1:0.5"], "--straggler is now --device-speed"),  # renamed options
        (["bench", "compare", "--device-step", "0.1"], "--device-step is now --device-step-s"),
        (["simulate", "--step-s", "0.1"], "--step-s is now --device-step-s (the one spelling of emulation.device_step_s"),
        (["plan", "--parameters", "1000", "--speeds", "1:0.5"], "--speeds is now --device-speed"),
        (["simulate", "--device-speed", "1:1.5"], "speeds in (0, 1]"),
        (["bench", "compare", "--regime", "vgga-gbe", "--network", "100mbit"], "sets --network 30mbit"),
        (["bench", "compare", "--tune"], "--tune needs a --regime"),
        (["bench", "compare", "--agents", "0,2"], "--agents takes numbers >= 1"),
        (["bench", "compare", "--network", "fast"], "--network: bad link rate 'fast'"),
        # data and training functions, checked with pyarrow and one batch on the driver, before Spark
        (_on_data(tmp, "empty"), "no rows"),
        (_on_data(tmp, "nofeatures", features=None), "column 'features' not in the data"),
        (_on_data(tmp, "nolabel", label=None), "column 'label' not in the data"),
        (_on_data(tmp, "strings", features=["x"] * 64), "cannot be read"),
        (_on_data(tmp, "toomany", label=[12] * 64), "labels reach 12 but the model outputs 10 classes"),
        (_on_data(tmp, "negative", label=[-1] * 64), "negative values"),
        (_on_data(tmp, "floats", label=[0.5] * 64), "does not fit the loss"),
        (_on_data(tmp, "digits") + ["data.input_shape=[64]"], "cannot take the data's rows"),
        (_on_data(tmp, "digits") + ["data.input_shape=[1,4,4]"], "input_shape"),
        (_on_data(tmp, "digits") + ["data.label=target"], "column 'target' not in the data"),
        # sequence models (conf/lm.yaml): the metric, the corpus, the tokens, the tracking store
        (["train", "-c", "conf/lm.yaml", "stop.target_loss=null", "stop.target_error=0.5"],
         "stop.target_error needs eval.metric: error"),
        (["train", "-c", "conf/digits.yaml", "stop.target_error=null", "stop.target_loss=1.0"],
         "stop.target_loss needs eval.metric: loss"),
        (["train", "-c", "conf/lm.yaml", f"data.text.root={tmp}"], "holds no .py files"),
        (_on_lm_data(tmp, "tokens", token=300), "token ids in 'features' reach 0..300"),
        (_on_lm_data(tmp, "ragged", ragged=True), "ragged"),
        (train + [f"tracking.mlflow.tracking_uri={tmp.as_uri()}/mlruns"], "MLFLOW_ALLOW_FILE_STORE=true"),
    ]


def _on_lm_data(tmp, name, token=None, ragged=False):
    """conf/lm.yaml on a Parquet data set of 64-token windows, one token replaced or one row cut short."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [[float(i % 200)] * 64 for i in range(32)]
    labels = [[i % 200] * 64 for i in range(32)]
    if token is not None:
        rows[20][3] = float(token)  # past the 16 rows of the one-batch check: the whole-data check finds it
    if ragged:
        rows[7] = rows[7][:40]
    os.makedirs(tmp / name, exist_ok=True)
    pq.write_table(pa.table({"features": rows, "label": labels}), str(tmp / name / "part-0.parquet"))
    return ["train", "-c", "conf/lm.yaml", "data.dataset=null", f"data.path={tmp / name}"]


CASES = len(MISTAKES) + 50  # with the cases below MISTAKES in _bad_inputs; the test checks the total


@pytest.mark.parametrize("case", range(CASES))
def test_bad_input_is_one_line_exit_2_before_spark_starts(tmp_path, capsys, case):
    """One line, exit 2, within seconds, before any Spark session (none is started in this process)."""
    import time

    cases = _bad_inputs(tmp_path)
    assert len(cases) == CASES
    argv, expected = cases[case]
    if argv[0] == "train" and not any(a.startswith("run.output_dir") for a in argv) and len(argv) > 1:
        argv.append(f"run.output_dir={tmp_path}/out")
    t0 = time.time()
    def mlflow_env():
        return {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}

    environment = mlflow_env()
    code = main(argv)
    assert mlflow_env() == environment  # nothing leaks to later jobs (MLflow's set_tracking_uri exports its URI)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("mpca"), err
    assert expected in err, err
    assert time.time() - t0 < 15  # found before any Spark session was started
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is None


def test_a_failed_job_still_writes_its_summary(tmp_path, capsys):
    import json

    out = tmp_path / "out"
    assert main(["train", "-c", "conf/digits.yaml", f"run.output_dir={out}", "data.dataset=null",
                 f"data.path={tmp_path}/missing.parquet"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "user_error" and summary["exit_code"] == 2 and "data.path" in summary["message"]


def test_a_failed_job_writes_its_summary_only_where_outputs_go(tmp_path, monkeypatch):
    """An output URI gets summary.json through its store where reachable (file://) and nowhere else: an
    unknown scheme leaves the working directory as it was (it had got ./nosuch:/nn/x/summary.json)."""
    import json

    config = os.path.abspath("conf/digits.yaml")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    missing = ["data.dataset=null", f"data.path={tmp_path}/missing.parquet"]
    assert main(["train", "-c", config, "run.output_dir=nosuch://nn/x"] + missing) == 2
    assert main(["train", "-c", config, "run.output_dir=hdfs://nn:8020/x"] + missing) == 2  # no Spark, no libhdfs
    assert os.listdir(cwd) == []
    uri = (tmp_path / "remote" / "out").as_uri()
    assert main(["train", "-c", config, f"run.output_dir={uri}"] + missing) == 2
    summary = json.loads((tmp_path / "remote" / "out" / "summary.json").read_text())
    assert summary["status"] == "user_error" and "data.path" in summary["message"]
    assert os.listdir(cwd) == []


def test_a_later_data_source_replaces_the_earlier_one(tmp_path):
    assert load_config(["conf/digits.yaml"], ["data.path=x.csv"]).data.dataset is None
    d = load_config(["conf/digits.yaml"], ["data.table=db.t"]).data
    assert (d.dataset, d.path, d.table) == (None, None, "db.t")
    assert load_config(["conf/digits.yaml"], ["data.path=x", "data.dataset=mnist5k"]).data.path is None
    layer = tmp_path / "source.yaml"
    layer.write_text("data:\n  path: /data/x.parquet\n")
    d = load_config(["conf/digits.yaml", str(layer)]).data
    assert (d.dataset, d.path) == (None, "/data/x.parquet")
    with pytest.raises(UserError, match="exactly one"):
        load_config(["conf/digits.yaml"], ["data.dataset=null"])


def test_a_java_exception_through_py4j_is_reported_by_its_own_message():
    from mpca.errors import error_line

    class Py4JLike(Exception):
        pass

    e = Py4JLike("An error occurred while calling o59.load.\n: org.apache.spark.SparkClassNotFoundException: "
                 "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: nosuch.\n\tat org.apache.spark.X(X.scala:1)")
    assert error_line(e) == "SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] Failed to find the data source: nosuch."
    assert error_line(ValueError("plain\nsecond")) == "plain" and error_line(ValueError()) == "ValueError"


def test_version_quiet_verbose_and_the_resolved_config(tmp_path, capsys):
    from mpca.config import resolved_yaml

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("mpca 0.")
    assert main(["-v", "train", "-q", "-c", "conf/digits.yaml"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    cfg = load_config(["conf/digits.yaml"], ["algorithm.name=weaksync", "algorithm.c=1", "data.path=x.csv",
                                             "data.format=csv"])
    again = tmp_path / "config.yaml"
    again.write_text(resolved_yaml(cfg))
    assert load_config([str(again)]) == cfg  # the saved config reruns the same job


def test_a_dry_run_reports_problems_before_spark_as_one_line(tmp_path, capsys):
    code = main(["train", "--dry-run", "-c", "conf/digits.yaml", f"run.output_dir={tmp_path}/out",
                 f"data.path={tmp_path}/missing.parquet"])
    assert code == 2 and "does not exist" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_section_and_its_shortcut_share_a_name():
    from mpca.config import settings_from

    assert settings_from(wire="int8").wire.format == "int8"  # the shortcut: wire.format
    whole = settings_from(wire={"format": "int4", "block": 128})  # the section, given whole
    assert (whole.wire.format, whole.wire.block) == ("int4", 128)


def test_an_agents_range_makes_an_elastic_run_that_starts_with_its_minimum():
    from mpca.config import TrainingSection

    t = TrainingSection(agents="2-4")
    assert (t.agents, t.min_agents, t.elastic, t.start_agents) == (4, 2, True, 2)
    assert TrainingSection(agents=[1, 3]).start_agents == 1
    assert TrainingSection.model_validate(t.model_dump()) == t  # survives a round trip
    fixed = TrainingSection(agents=3, min_agents=2)  # min_agents alone: a loss tolerated, not an elastic start
    assert (fixed.elastic, fixed.start_agents) == (False, 3)
    assert TrainingSection(agents="3-3").elastic is False
    with pytest.raises(ValueError, match="drop training.min_agents=3"):
        TrainingSection(agents="2-4", min_agents=3)


@pytest.mark.parametrize("algorithm, data, line", [
    ({"name": "sync"}, {}, "sync's agents wait for the driver's model themselves"),
    ({"name": "diloco"}, {}, "diloco's agents wait for the driver's model themselves"),
    ({"name": "easgd"}, {}, "easgd's agents exchange without them"),
    ({"name": "ddp"}, {}, "ddp's agents exchange without them"),
    ({"name": "mpca"}, {"stream": True}, "set data.stream: false"),
])
def test_lock_step_paces_only_agents_that_never_wait_and_needs_every_row_first(algorithm, data, line):
    from mpca.config import Settings

    with pytest.raises(ValueError, match=line):
        Settings(training={"lock_step": 5}, algorithm=algorithm, data=data)
    ok = Settings(training={"lock_step": 5}, cluster={"reduce": "ordered"})
    assert (ok.training.lock_step, ok.cluster.reduce, ok.algorithm.name) == (5, "ordered", "mpca")
    assert Settings(algorithm=algorithm, cluster={"reduce": "ordered"}).training.lock_step is None
