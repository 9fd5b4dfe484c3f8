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

echo; echo "## 6. every algorithm of the catalogue, checked (n = 2, 3, 4, 5, 8 and topologies)"
echo "\$ bash bench/check_algorithms.sh 1M"
bash bench/check_algorithms.sh 1M | tail -3

echo; echo "## 7. allreduce, every algorithm, time in us per size (4 ranks flat; 8 ranks as 2x4)"
for spec in "4:" "8:2x4"; do
  n=${spec%%:*}; topo=${spec#*:}
  echo; echo "# n=$n topology=${topo:-flat}; columns: bytes then time_us per algorithm"
  printf "%-10s" algo; for b in 8 512 32768 2097152; do printf "%12s" "$b"; done; echo
  for a in ring ring2 tree dbtree butterfly hd direct star hier torus2d mesh2d; do
    printf "%-10s" "$a"
    # Capture first: a parser starting alongside would steal a core from the first size.
    out=$(env ${topo:+FERROCOLL_TOPO=$topo} $fc bench allreduce -n "$n" -b 8 -e 2M -f 64 --iters 50 \
      --warmup 10 --algo "$a" --json)
    python3 -c 'import json,sys; print("".join("%12.1f" % json.loads(l)["time_us"] for l in sys.stdin))' <<<"$out"
  done
done

echo; echo "## 8. cost model: ferrocoll model answers (time for 100,000 ranks) and calibration"
for c in allreduce allgather reducescatter alltoall bcast reduce gather scatter barrier; do
  s=$(date +%s%N); $fc model $c -n 100000 -b 1GB --json >/dev/null; e=$(date +%s%N)
  echo "model $c -n 100000: $(( (e - s) / 1000000 )) ms"
done
echo "\$ ferrocoll calibrate -n 4 -e 16M --out /tmp/ferrocoll-thread-profile.json"
$fc calibrate -n 4 -e 16M --out /tmp/ferrocoll-thread-profile.json 2>/dev/null | tail -2
