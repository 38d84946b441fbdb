"""Data beyond an agent's memory and sources beyond Parquet, on the shared local-cluster."""
import functools
import json
import logging
import re

import numpy as np
import pandas as pd
import pytest
import torch

from mpca import cli
from mpca.config import load_config
from mpca.data.datasets import dataset_dataframe, load, to_dataframe
from mpca.errors import UserError
from mpca.data.sources import read_source
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


def test_agents_train_from_partitions_spilled_to_local_disk(spark):
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, max_seconds=40,
                  target_error=0.25, eval_every_seconds=2, data={"input_shape": [1, 8, 8], "agent_memory_mb": 0.0},
                  spark=spark).fit(dataset_dataframe(spark, "digits"))
    assert [a["data_on_disk"] for a in fit.agents] == [True, True]
    assert fit.final.error < 0.3, fit.final.error
    same = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, max_cycles=3,
                   data={"input_shape": [1, 8, 8], "agent_memory_mb": 1000.0}, spark=spark).fit(
        dataset_dataframe(spark, "digits"))
    assert [a["data_on_disk"] for a in same.agents] == [False, False]  # within the budget: in memory


def test_local_data_becomes_consecutive_partitions_not_a_local_relation(spark):
    x, y = load("digits")
    df = to_dataframe(spark, x, y, partitions=4)
    # a local relation's rows are copied again on the driver by every query (the driver's heap ran out)
    assert df._jdf.queryExecution().analyzed().getClass().getSimpleName() != "LocalRelation"
    parts = df.select("label").rdd.glom().map(lambda rows: [r.label for r in rows]).collect()
    assert [len(p) for p in parts] == [450, 450, 450, 447] and sum(parts, []) == y.tolist()  # rows in order


def test_data_ordered_by_label_is_named_and_data_shuffle_deals_every_class_to_every_agent(spark, caplog):
    x, y = load("digits")
    order = np.argsort(y, kind="stable")
    ordered = to_dataframe(spark, x[order], y[order], partitions=4)  # coalesced: agent 0 gets classes 0–4
    caplog.set_level(logging.WARNING, logger="mpca.run")
    for shuffle in (False, True):
        caplog.clear()
        Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, max_cycles=2,
                data={"input_shape": [1, 8, 8], "shuffle": shuffle}, spark=spark).fit(ordered)
        warned = [r.getMessage() for r in caplog.records if "differ in their labels" in r.getMessage()]
        if shuffle:
            assert warned == []
        else:
            assert len(warned) == 1 and re.search(r"holds [56] of the 10 labels \(total variation 0\.[45]", warned[0])


def _digits_csv(tmp_path):
    x, y = load("digits")
    frame = pd.DataFrame(x.reshape(len(x), -1), columns=[f"p{i}" for i in range(64)])
    frame["digit"] = y
    path = tmp_path / "digits.csv"
    frame.to_csv(path, index=False)
    return str(path)


def test_the_cli_trains_on_and_scores_a_csv_file_with_feature_columns(spark, tmp_path):
    path = _digits_csv(tmp_path)
    cols = ", ".join(f"p{i}" for i in range(64))
    source = ["cluster.master=existing", f"data.path={path}", "data.format=csv", "data.label=digit",
              "data.options={header: 'true', inferSchema: 'true'}", f"data.feature_columns=[{cols}]"]
    code = cli.main(["train", "-c", "conf/digits.yaml", f"run.output_dir={tmp_path}/out", "progress=off",
                     "stop.target_error=null", "stop.max_seconds=10", *source])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 0 and summary["final_holdout_error"] < 0.5, summary
    code = cli.main(["predict", "-c", "conf/digits.yaml", "--model", str(tmp_path / "out" / "model.pt"),
                     "--data", path, "--out", str(tmp_path / "scored"), *source])
    scored = spark.read.parquet(str(tmp_path / "scored")).toPandas()
    assert code == 0 and len(scored) == len(load("digits")[1]) and "p0" in scored and "features" not in scored
    assert (scored["prediction"] == scored["digit"]).mean() > 0.5


def test_a_catalog_table_is_a_source_and_unreadable_sources_are_one_line(spark, tmp_path):
    dataset_dataframe(spark, "digits").createOrReplaceTempView("mpca_digits")
    d = load_config(["conf/digits.yaml"], ["data.table=mpca_digits"]).data
    df = read_source(spark, d)
    assert df.count() == len(load("digits")[1]) and {"features", "label"} <= set(df.columns)
    bad = [(["data.table=no_such_table"], "no_such_table"),
           ([f"data.path={tmp_path}", "data.format=nosuchformat"], "needs its package"),
           ([f"data.path={_digits_csv(tmp_path)}", "data.format=csv", "data.options={header: 'true'}",
             "data.feature_columns=[p0, nope]"], "nope")]
    for overrides, why in bad:
        d = load_config(["conf/digits.yaml"], overrides).data
        with pytest.raises(UserError, match=why) as e:
            read_source(spark, d)
        assert "\n" not in str(e.value)


def test_the_teacher_task_is_the_same_rows_on_every_partitioning(spark):
    """Generated on the executors from the row index: 2 or 5 partitions give the same rows as the driver."""
    from mpca.compat import to_arrow
    from mpca.data.checks import tensors
    from mpca.data.synthetic import TeacherTask

    task = TeacherTask(rows=9_000, features=8, hidden=16, seed=5)
    expected_x, expected_y = task.take(np.arange(task.rows))
    for partitions in (2, 5):
        df = task.dataframe(spark, partitions)
        assert df.rdd.getNumPartitions() == partitions
        x, y = tensors(to_arrow(df), "features", "label", (8,))
        assert np.array_equal(x.numpy(), expected_x) and np.array_equal(y.numpy(), expected_y), partitions


def test_generated_rows_come_in_a_partition_per_agent_where_agents_outnumber_data_partitions(spark):
    """A job's generated data (the teacher task, a bundled dataset) has at least one partition per agent, so the
    agents' job coalesces it without a shuffle; a path keeps its own layout."""
    from mpca.data.sources import job_dataframe

    teacher = load_config([], ["data.dataset=teacher", "data.input_shape=[8]", "data.teacher.features=8",
                               "data.teacher.rows=4000", "data.teacher.hidden=16"]).data
    assert teacher.partitions == 4
    assert [job_dataframe(spark, teacher, k).rdd.getNumPartitions() for k in (1, 4, 6)] == [4, 4, 6]
    digits = load_config([], []).data
    assert [job_dataframe(spark, digits, k).rdd.getNumPartitions() for k in (2, 8)] == [4, 8]


def test_the_holdout_split_depends_on_each_rows_content_not_on_partitioning_or_order(spark):
    """mpca.data.split: 2 or 5 partitions, rows in either order — the same holdout rows, ≈ the fraction, the two
    sides disjoint and together every row; another seed, another split; the numpy hash finds the same rows."""
    from pyspark.sql import functions as F

    from mpca.compat import to_arrow
    from mpca.data.checks import tensors
    from mpca.data.split import evaluation_rows, evaluation_subset, hash_split, holdout_mask
    from mpca.data.synthetic import TeacherTask

    task = TeacherTask(rows=20_000, features=8, hidden=16, seed=3)

    def sides(df, seed=0):
        train, hold = hash_split(df, "features", "label", 0.1, seed)
        return [{tuple(r) for r in tensors(to_arrow(side), "features", "label", (8,))[0].numpy().tolist()}
                for side in (train, hold)]

    train, hold = sides(task.dataframe(spark, 2))
    assert 1_800 <= len(hold) <= 2_200 and not train & hold and len(train | hold) == task.rows
    assert sides(task.dataframe(spark, 5).orderBy(F.desc("label")))[1] == hold
    assert sides(task.dataframe(spark, 2), seed=1)[1] != hold
    x, y = task.take(np.arange(task.rows))  # the simulator's copy of the split (mpca.data.xxhash), no JVM
    mask = holdout_mask(x, y, 0.1, 0)
    assert {tuple(r) for r in x[mask].tolist()} == hold
    # the rows the trainer scores on: with no partition holding more than max_rows holdout rows (~1,000 each of
    # 2, ~400 each of 5), the 1,200 of the smallest hash — the same, in the same order, on either partitioning
    # and in numpy (not so a sort's shuffle: its partitions can hold more, e.g. one coalesced by AQE)
    def scored(df, max_rows):
        split = hash_split(df, "features", "label", 0.1, 0)[1]
        return tensors(to_arrow(evaluation_rows(split, "features", "label", 0, max_rows)), "features", "label",
                       (8,))[0].numpy()

    evaluated = [scored(task.dataframe(spark, 2), 1200),
                 scored(task.dataframe(spark, 5), 1200)]
    assert np.array_equal(evaluated[0], evaluated[1])
    assert np.array_equal(evaluated[0], x[mask][evaluation_subset(x[mask], y[mask], 0, 1200)])
    # fewer: of each partition's first 300 holdout rows (a bounded read), the 300 smallest, every time
    few = [scored(task.dataframe(spark, 2), 300) for _ in range(2)]
    firsts = [(x[lo:lo + 10_000][mask[lo:lo + 10_000]][:300], y[lo:lo + 10_000][mask[lo:lo + 10_000]][:300])
              for lo in (0, 10_000)]  # spark.range's 2 partitions: rows 0-9,999 and 10,000-19,999
    px, py = np.concatenate([f[0] for f in firsts]), np.concatenate([f[1] for f in firsts])
    assert np.array_equal(few[0], few[1]) and np.array_equal(few[0], px[evaluation_subset(px, py, 0, 300)])
    trainer = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, input_shape=(8,), holdout=0.1,
                      holdout_max_rows=1200, spark=spark)
    assert np.array_equal(trainer._split(task.dataframe(spark, 3))[1].numpy(), evaluated[0])  # what fit scores on


def test_the_agents_set_aside_the_holdout_rows_the_driver_would_have_read_and_train_on_the_rest(spark):
    """fit's holdout comes from the agents (mpca.data.holdout), not from a second scan: the same rows, in the same
    order, as the driver's own read (evaluation_rows), and every other row trains."""
    from mpca.data.holdout import with_row_hash
    from mpca.data.synthetic import TeacherTask
    from mpca.runtime.run import AgentRun

    from mpca.models import build_model

    task = TeacherTask(rows=120_000, features=8, classes=4, hidden=8, seed=0)  # ~4,000 holdout rows a partition
    mlp = functools.partial(build_model, "mlp", {"in_features": 8, "hidden": [16], "num_classes": 4})
    trainer = Trainer(mlp, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(8,),
                      holdout=0.1, algorithm="mpca", spark=spark)  # the default 5,000 rows scored on
    df = task.dataframe(spark, 3)
    rows, train, _ = trainer._frames(df)
    driver_x, driver_y = trainer._split(df)[1:]
    run = AgentRun(spark, with_row_hash(rows, "features", "label", 0), model=mlp(), model_fn=mlp,
                   loss_fn=helpers.cross_entropy, optimizer_fn=helpers.adam, settings=trainer.settings, classes=4,
                   holdout_on_agents=True)
    with run:
        x, y, missing = run.holdout_rows(wait_s=60)  # once every agent has all of its rows
    assert missing == []
    trained = sum(int(s["rows"]) for s in run.summaries)
    assert len(x) == 5000 and np.array_equal(x.numpy(), driver_x.numpy()) and torch.equal(y, driver_y)
    assert trained == train.count()


def test_rows_arriving_slowly_all_arrive_and_the_run_scores_on_the_agents_holdout(spark):
    """data.stream (mpca.data.stream) with a slow source (how early an agent starts training depends on how fast its Python
    worker starts, so the ramp's rule is tested in tests/unit/test_agent.py): every training row arrives, the
    holdout is fetched once every agent has all of its rows — also where the run ends before that — and the
    curve starts from the initial model."""
    from mpca.data.synthetic import TeacherTask
    from mpca.models import build_model

    task = TeacherTask(rows=100_000, features=8, classes=4, hidden=8, seed=0)
    df = task.dataframe(spark, 2)
    mlp = functools.partial(build_model, "mlp", {"in_features": 8, "hidden": [16], "num_classes": 4})
    for cycles in (2, 30):
        fit = Trainer(mlp, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(8,), holdout=0.01,
                      stream=True, max_cycles=cycles, eval_every_cycles=2, spark=spark).fit(df.mapInArrow(helpers.slowly, df.schema))
        assert 98_000 < sum(s["rows"] for s in fit.agents) < 100_000, fit.agents  # every training row (1% held out)
        assert all(s["load_s"] >= fit.startup[s["agent"]]["data_s"] for s in fit.agents)
        history = fit.history
        assert history["cycle"].iloc[0] == 0 and history["wall_s"].iloc[0] == 0.0  # the initial model
        assert fit.final.error < history["holdout_error"].iloc[0] and fit.cycles == cycles


def test_the_first_rows_are_read_from_the_first_partition_only(spark):
    """take_arrow reads as DataFrame.take does (an Arrow collection of limit(n) computes every partition), and
    so do the first-rows check, MLflow's input example and the BatchNorm calibration rows (buffers="local")."""
    from types import SimpleNamespace

    from mpca.compat import take_arrow
    from mpca.data.checks import check_dataframe
    from mpca.tracking import input_example

    rows = spark.range(0, 8000, numPartitions=4).selectExpr("array(cast(id as float), 1.0f) as features",
                                                            "cast(id % 3 as bigint) as label")
    df = rows.mapInArrow(helpers.only_partition_zero, rows.schema)  # any other partition fails when computed
    table = take_arrow(df, 1024)
    assert table.num_rows == 1024 and table.column("features").to_pylist()[5] == [5.0, 1.0]
    assert str(table.schema.field("label").type) == "int64"
    assert check_dataframe(df, "features", "label", [2], lambda: torch.nn.Linear(2, 3), helpers.cross_entropy,
                           helpers.adam, full=False) == 3
    data = SimpleNamespace(features="features", label="label", input_shape=[2])
    assert input_example(df, data, rows=3).tolist() == [[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]
    rows = spark.range(0, 4 * 3000, numPartitions=4).selectExpr("array(cast(id as float), 1.0f) as features",
                                                                 "cast(id % 3 as bigint) as label", "id")
    bn = lambda: torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))  # noqa: E731
    trainer = Trainer(bn, helpers.cross_entropy, helpers.adam, input_shape=(2,), buffers="local", spark=spark)
    calibration = trainer._calibration(bn(), rows.mapInArrow(helpers.only_partition_zero, rows.schema))
    assert calibration.shape == (trainer.settings.eval.calibration_rows, 2) and calibration[7].tolist() == [7.0, 1.0]
