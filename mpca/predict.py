"""Scheduled scoring: ``mpca predict -c conf.yaml --model runs/x/model.pt --data in.parquet --out out.parquet``.

``--data`` is read like ``data.path`` (``data.format``, ``data.options``, ``data.feature_columns``); the output
is Parquet.

The architecture comes from ``model.json`` beside the model (else from the config's ``model`` section),
the feature column and ``data.input_shape`` from the config, the cluster from ``cluster.master``.  The
output holds every input column but the features, plus ``--prediction-col`` (default ``prediction``).
Mistakes (missing model or data, an existing output without ``--overwrite``, a model that does not fit)
are one line and exit 2 before Spark starts.
"""
from __future__ import annotations

import os

from mpca.errors import UserError


def predict(cfg, model_path: str, data: str, out: str, overwrite: bool = False,
            prediction_col: str = "prediction", spark=None) -> int:
    from mpca import job
    from mpca.data.sources import read_source
    from mpca.ml.estimator import TorchClassificationModel
    from mpca.ml.spec import load_model, read_spec, registry_spec
    from mpca.runtime.cluster import session_for

    if "://" not in model_path and not os.path.exists(model_path):
        raise UserError(f"--model {model_path!r} does not exist; give a trained model.pt (mpca train writes one)")
    d = cfg.data
    if "://" not in data and not os.path.exists(data):
        raise UserError(f"--data {data!r} does not exist; give a file or directory Spark reads as {d.format} "
                        "(data.format)")
    if "://" not in out and os.path.exists(out) and not overwrite:
        raise UserError(f"--out {out!r} exists; remove it or add --overwrite")
    spec = read_spec(model_path) or registry_spec(cfg.model.name, cfg.model.args)
    module = load_model(model_path, spec)  # fails here, before Spark, when weights and architecture differ
    if "://" not in data and d.format == "parquet" and not d.feature_columns:
        import pyarrow.dataset as ds

        names = ds.dataset(data, format="parquet").schema.names
        if d.features not in names:
            raise UserError(f"column {d.features!r} not in {data!r} (columns: {sorted(names)}); set data.features")
    own = spark is None
    if own:
        job.preflight(cfg, starting_spark=cfg.cluster.master != "existing")
        spark, own = session_for(cfg.cluster, cfg.run.name)
    try:
        df = read_source(spark, d, path=data, scoring=True)
        scorer = TorchClassificationModel.of(module, spec, list(d.input_shape), featuresCol=d.features,
                                             predictionCol=prediction_col)
        scored = scorer.transform(df).drop(d.features)
        scored.write.mode("overwrite" if overwrite else "errorifexists").parquet(out)
        rows = spark.read.parquet(out).count()
    finally:
        if own:
            spark.stop()
    print(f"scored {rows} rows with {spec.target} → {out}", flush=True)
    return 0
