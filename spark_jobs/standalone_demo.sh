#!/usr/bin/env bash
# Run the default job on a throw-away Spark *standalone* cluster on this machine, through spark-submit:
# a master and N workers (2 cores each, one 'agentslot' each), then everything is stopped again.
#
#   bash spark_jobs/standalone_demo.sh [WORKERS] [extra key=value overrides...]
#
# Uses the pyspark of the active Python (the repository's .venv by default).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS="${1:-2}"; shift || true
PY="${PYTHON:-$PWD/.venv/bin/python}"
SPARK_HOME="$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}" PYSPARK_PYTHON="$PY"
TMP="$(mktemp -d /tmp/mpca-standalone.XXXXXX)"
printf '#!/bin/sh\necho '"'"'{"name":"agentslot","addresses":["0"]}'"'"'\n' > "$TMP/agentslot.sh"
chmod 755 "$TMP/agentslot.sh"
PORT=$(( 20000 + RANDOM % 20000 ))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
"$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$PORT" \
  --webui-port 0 > "$TMP/master.log" 2>&1 &
pids+=($!)
for i in $(seq 1 "$WORKERS"); do
  SPARK_WORKER_OPTS="-Dspark.worker.resource.agentslot.amount=1 -Dspark.worker.resource.agentslot.discoveryScript=$TMP/agentslot.sh" \
  "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker --cores 2 --memory 1536m \
    --work-dir "$TMP/work$i" --webui-port 0 "spark://127.0.0.1:$PORT" > "$TMP/worker$i.log" 2>&1 &
  pids+=($!)
done
sleep 6
"$SPARK_HOME/bin/spark-submit" --master "spark://127.0.0.1:$PORT" \
  --conf spark.executor.cores=2 --conf spark.executor.memory=1g --conf "spark.pyspark.python=$PY" \
  --conf spark.executor.resource.agentslot.amount=1 \
  --conf "spark.executor.resource.agentslot.discoveryScript=$TMP/agentslot.sh" \
  --conf spark.ui.enabled=false \
  spark_jobs/train.py --config conf/digits.yaml run.output_dir=runs/standalone "training.agents=$WORKERS" "$@"
