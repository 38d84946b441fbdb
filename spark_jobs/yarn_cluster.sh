#!/usr/bin/env bash
# Train the default job on YARN in cluster mode, outputs on HDFS.  Run from the repository root, in the
# environment you want shipped (mpca installed: `pip install 'mpca[demo]' venv-pack`).
#   HDFS_OUT=hdfs:///user/$USER/mpca/digits [GPU_DISCOVERY=/path/getGpusResources.sh] bash spark_jobs/yarn_cluster.sh [--dry-run] [key=value ...]
set -euo pipefail
HDFS_OUT="${HDFS_OUT:-hdfs:///user/${USER}/mpca/digits}"
[ -f mpca_env.tar.gz ] || venv-pack -o mpca_env.tar.gz
exec spark-submit --master yarn --deploy-mode cluster \
  --archives mpca_env.tar.gz#environment \
  --conf spark.pyspark.python=./environment/bin/python \
  --conf spark.yarn.appMasterEnv.PYSPARK_PYTHON=./environment/bin/python \
  --files conf/digits.yaml,conf/cluster/yarn_gpu.yaml \
  --conf spark.executor.cores=4 --conf spark.dynamicAllocation.enabled=false \
  --conf spark.executor.resource.gpu.amount=1 \
  --conf "spark.executor.resource.gpu.discoveryScript=${GPU_DISCOVERY:-/opt/spark/examples/src/main/scripts/getGpusResources.sh}" \
  spark_jobs/train.py -c digits.yaml -c yarn_gpu.yaml "run.output_dir=${HDFS_OUT}" "$@"
