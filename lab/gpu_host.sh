#!/bin/bash
# One pass of the checks that need a host this repository's usual machine is not: a CUDA device and more cores.
#
#   bash lab/gpu_host.sh OUT_DIR [SECONDS]        (from the checkout's root; SECONDS: the whole pass, default 540)
#
# 1. facts: cores, GPUs, versions; whether the emulated cluster (lab/netcluster.py) can run here;
# 2. `make test-gpu`'s tests (tests/gpu: agents on the host's CUDA devices through Spark's resource scheduling);
# 3. the Eq. 7 pull against a training step on the CPU and the GPU (mpca.bench.pull);
# 4. with the time left, issue 23's ≈ 100 regime that a 2-core machine cannot hold (`bench compare --regime
#    vgga-gbe`, K = 4, emulated devices on the CPU, medians of 3: mpca and mpca@int8 (issue 25) against sync
#    and DiLoCo at the settings the simulator found best, H = 62, DiLoCo's outer learning rate 0.5) when the
#    emulated cluster runs here; else the ≈ 12 regime's emulated devices at K = 8 on local-cluster with no link
#    (labelled so by the benchmark itself).
# REPEATS (default 3), MAX_SECONDS (per run, default 60), PULL=0 (skip step 3) and TESTS=0 (skip step 2) shorten
# a pass; WIRE=int8 with ALGORITHMS= (empty) runs step 4's baselines alone with that wire format; INT8=0 leaves
# mpca@int8 out; K8=1 runs instead K = 8 in the ≈ 12 regime (mpca against sync, DiLoCo and EASGD; VARIANTS
# replaces the baselines' settings, ALGORITHMS= leaves mpca out).
# Writes at most 6 files to OUT_DIR: facts.txt, test-gpu.log, bench.log, compare.json, compare.png and runs.tgz
# (every finished run's history.csv and run.json, so that a pass cut short by its time keeps them).
# Needs python3 with torch, pyspark, pytest (and pytest-timeout) importable, and java on PATH; the emulated
# cluster needs root, ip and tc (iproute2) and network namespaces.  A trimmed Spark jar set must keep Arrow's
# jars (arrow-vector, arrow-format, arrow-memory-core, arrow-memory-netty, arrow-memory-netty-buffer-patch,
# arrow-compression, flatbuffers-java): without them every DataFrame built from Arrow fails in the JVM, and
# pyspark's collect of Arrow batches waits forever on the dead thread.
set -u
out=${1:?usage: lab/gpu_host.sh OUT_DIR [SECONDS]}
deadline=$(( $(date +%s) + ${2:-540} ))
left() { echo $(( deadline - $(date +%s) )); }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}

{
  echo "== $(date -u +%FT%TZ) host $(hostname), $(nproc) cores, $(free -g | awk '/Mem/{print $2}') GiB"
  nvidia-smi -L 2>&1
  $py -c "import sys, torch, pyspark, numpy, pyarrow, pandas; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), 'pyspark', pyspark.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__, 'pandas', pandas.__version__)" 2>&1
  java -version 2>&1 | head -1
  echo "== emulated cluster: $($py -c 'from lab.netcluster import available; print(available())' 2>&1 | tail -1)"
  if [ "${PULL:-1}" != 0 ]; then
    echo "== mpca.bench.pull (resnet110, batch 64)"
    timeout 90 $py -m mpca.bench.pull --model resnet110 --repeats 5 2>&1 | tail -4
  fi
} > "$out/facts.txt" 2>&1
cat "$out/facts.txt"

if [ "${TESTS:-1}" != 0 ]; then
  echo "== tests/gpu ($(left) s left)"
  MPCA_GPU_TESTS=1 timeout 240 $py -m pytest tests/gpu -p no:cacheprovider -q -rA --timeout 200 > "$out/test-gpu.log" 2>&1
  echo "tests/gpu exit $?"; tail -15 "$out/test-gpu.log"
fi

common=(--no-tune --repeats "${REPEATS:-3}" --targets 0.3,0.26,0.24 --out /tmp/gpu-host-compare
        --max-seconds "${MAX_SECONDS:-60}")
emulated=$(grep -c "emulated cluster: (True" "$out/facts.txt")
if [ "${K8:-0}" != 0 ] && [ "$emulated" != 0 ]; then
  # issue 23's K = 8 in the ≈ 12 regime (100 Mbit, T = 300 ms), each baseline at the period the simulator put first
  # on its K = 8 grid (sync H 8/15/30/60, DiLoCo H 30/60, EASGD τ 15/30); VARIANTS (';'-separated) replaces them
  IFS=';' read -r -a vs <<< "${VARIANTS:-sync:H15=sync,every=15;diloco:H30=diloco,every=30;easgd:t15=easgd,every=15}"
  labels=(--algorithms "${ALGORITHMS-mpca}"); for v in "${vs[@]}"; do [ -n "$v" ] && labels+=(--variant "$v"); done
  cmd=(bench compare --regime resnet110-gbe "${common[@]}" "${labels[@]}" training.agents=8
       "cluster.master=local-cluster[8,2,1024]" cluster.gpus=none)
elif [ "$emulated" != 0 ]; then
  # WIRE=int8 ALGORITHMS= : the baselines alone, each with that wire format (labelled sync:H62@int8, ...)
  labels=(--algorithms "${ALGORITHMS-mpca}" --variant "sync:H62=sync,every=62"
          --variant "diloco:H62=diloco,every=62,outer_lr=0.5")
  if [ -n "${WIRE:-}" ]; then labels+=(--wire "$WIRE"); elif [ "${INT8:-1}" != 0 ]; then
    labels+=(--variant "mpca@int8=mpca"); fi
  cmd=(bench compare --regime vgga-gbe "${common[@]}" "${labels[@]}" training.agents=4
       "cluster.master=local-cluster[4,2,1024]" cluster.gpus=none)
else
  cmd=(bench compare --device-step 0.3 "${common[@]}" --algorithms mpca
       --variant "diloco:H60=diloco,every=60" --variant "sync:H15=sync,every=15" training.agents=8
       "cluster.master=local-cluster[8,2,1024]" cluster.gpus=none)
fi
budget=$(( $(left) - 15 ))
echo "== mpca ${cmd[*]} ($budget s)"
if [ "$budget" -gt 90 ]; then
  timeout "$budget" $py -m mpca.cli "${cmd[@]}" > "$out/bench.log" 2>&1
  echo "bench exit $?"; tail -30 "$out/bench.log"
  cp /tmp/gpu-host-compare/compare.json /tmp/gpu-host-compare/*.png "$out/" 2>/dev/null
  tar czf "$out/runs.tgz" -C /tmp --exclude=checkpoints --exclude=warm-up gpu-host-compare 2>/dev/null
else
  echo "no time left for the benchmark" | tee "$out/bench.log"
fi
