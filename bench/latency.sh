#!/usr/bin/env bash
# Small-allreduce latency per call (f32 sum, 8 B by default), back to back:
# ferrocoll over shared memory with the small-call fast path
# (FERROCOLL_SHM_FAST=auto), without it (off: plans through the rings), and
# Open MPI (when mpicc/mpirun are there), REPS times; rank 0's line of each.
# Each line: mean, percentiles and the tail of CALLS timed calls.
# Usage: bash bench/latency.sh [REPS] [RANKS] [CALLS] [COUNT]   (3 2 200000 2)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}; n=${2:-2}; calls=${3:-200000}; count=${4:-2}
cargo build --release -q -p ferrocoll-cli
cargo build --release -q -p ferrocoll --example latency
fc=target/release/ferrocoll
mpi=""
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpi=$(mktemp -d)/mpi_latency; trap 'rm -rf "$(dirname "$mpi")"' EXIT
  mpicc -O2 -o "$mpi" bench/mpi_latency.c
fi
echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= reps; r++)); do
  for f in auto off; do
    printf "FERROCOLL_SHM_FAST=%-4s " "$f"
    FERROCOLL_SHM_FAST=$f "$fc" run -n "$n" target/release/examples/latency "$calls" "$count" | sed -n 's/^\[0\] //p'
  done
  if [[ -n $mpi ]]; then
    printf "%-23s " "Open MPI"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$n" --oversubscribe "$mpi" "$calls" "$count" 2>/dev/null | grep '^rank 0 '
  fi
done
