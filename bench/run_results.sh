#!/usr/bin/env bash
# Reproduces the figures in bench/RESULTS.md on the current machine.
# Usage: bash bench/run_results.sh > /tmp/results.txt   (takes a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=target/release/ferrocoll
run() { echo; echo "\$ $*"; "$@"; }

echo "## machine"; lscpu | grep -E "Model name|^CPU\(s\)|L1d|L2|L3"; git rev-parse --short HEAD

echo; echo "## 1. reduction kernel vs copy (criterion, cache-resident)"
echo "\$ cargo bench -p ferrocoll --bench kernels -- --warm-up-time 1 --measurement-time 3"
cargo bench -q -p ferrocoll --bench kernels -- --warm-up-time 1 --measurement-time 3 2>/dev/null \
  | grep -E "^f32|thrpt" || true

echo; echo "## 2. allreduce, 4 ranks: auto, ring, tree"
run $fc bench allreduce -n 4 -b 8 -e 64M -f 4 --iters 20 --warmup 5
run $fc bench allreduce -n 4 -b 8 -e 64M -f 4 --iters 20 --warmup 5 --algo ring
run $fc bench allreduce -n 4 -b 8 -e 64M -f 4 --iters 20 --warmup 5 --algo tree

echo; echo "## 3. slicing of large elementwise collectives (ring allreduce, 4 ranks)"
run env FERROCOLL_SLICE_BYTES=0 $fc bench allreduce -n 4 -b 1M -e 64M --iters 10 --warmup 3 --algo ring
run env FERROCOLL_SLICE_BYTES=2097152 $fc bench allreduce -n 4 -b 1M -e 64M --iters 10 --warmup 3 --algo ring

echo; echo "## 4. 8 ranks on 2 cores (oversubscribed)"
run $fc bench allreduce -n 8 -b 8 -e 16M -f 8 --iters 10 --warmup 3

echo; echo "## 5. every collective checked, 4 ranks, 8 B .. 1 MiB (JSON lines)"
for c in allreduce allgather reducescatter alltoall bcast reduce gather scatter; do
  run $fc bench $c --json -n 4 -e 1M --check
done
