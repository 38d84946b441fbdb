#!/bin/bash
# The simulated rows of docs/results/2026-11-28-rivals.md (one seed each; K = 8 was run by an earlier version of
# this script with the same settings).
# run from a checkout with mpca installed: bash docs/results/2026-11-28-rivals/sim/run.sh OUT
OUT=${1:-sim-out}; mkdir -p "$OUT"
run() { local name=$1; shift
  mpca simulate -q --eval-every 1 --targets 0.3,0.26,0.24 --rows 100000 --json "$OUT"/$name.json "$@" > "$OUT"/$name.txt 2>&1; }
INF="-k 4 --device-step-s 0.3 --link inf --max-seconds 60"
jobs_list=("inf-k4-mpca|$INF -a mpca" "inf-k4-mpcafp32|$INF -a mpca --wire fp32" "inf-k4-sync5|$INF -a sync algorithm.every=5"
  "inf-k4-sync15|$INF -a sync algorithm.every=15" "inf-k4-sd30|$INF -a streaming_diloco algorithm.every=30"
  "inf-k4-dl30|$INF -a diloco algorithm.every=30"
  "r12-k4-mpca|-k 4 --device-step-s 0.3 --link 100mbit --max-seconds 60 -a mpca"
  "r12-k4-sd30|-k 4 --device-step-s 0.3 --link 100mbit --max-seconds 60 -a streaming_diloco algorithm.every=30")
for k in 16 32; do
  R12="-k $k --device-step-s 0.3 --link 100mbit --max-seconds 60"
  R100="-k $k --device-step-s 0.1 --link 30mbit --max-seconds 30"
  jobs_list+=("r12-k$k-mpca|$R12 -a mpca" "r12-k$k-sd30|$R12 -a streaming_diloco algorithm.every=30"
              "r12-k$k-dl30|$R12 -a diloco algorithm.every=30"
              "r100-k$k-mpca|$R100 -a mpca" "r100-k$k-sd31|$R100 -a streaming_diloco algorithm.every=31"
              "r100-k$k-dl62|$R100 -a diloco algorithm.every=62 algorithm.outer_lr=0.5")
done
for j in "${jobs_list[@]}"; do
  name=${j%%|*}; args=${j#*|}
  run $name $args &
  while [ $(jobs -r | wc -l) -ge 2 ]; do sleep 1; done
done
wait

