#!/usr/bin/env bash
# ferrocoll next to Open MPI on this machine, in the same run, as ratios.
# Usage: bash bench/compare_thread.sh [COLL] [RANKS] [MIN] [MAX] [FACTOR]
# Open MPI runs one process per rank over shared memory (installed from
# Debian by ../shared/peers/run_peers.sh if missing); ferrocoll runs its ranks
# as threads (transport `thread`). Prints one row per size: both times and
# ferrocoll's speed-up (Open MPI time / ferrocoll time; > 1 means faster).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peers=${PEERS:-$here/../../shared/peers}
coll=${1:-allreduce}; n=${2:-4}; lo=${3:-8}; hi=${4:-33554432}; f=${5:-4}
cd "$here/.."
cargo build --release -q
fc=$(mktemp); mpi=$(mktemp); trap 'rm -f "$fc" "$mpi"' EXIT
target/release/ferrocoll bench "$coll" --json -n "$n" -b "$lo" -e "$hi" -f "$f" --iters 20 --warmup 5 >"$fc"
bash "$peers/run_peers.sh" "$coll" "$n" "$lo" "$hi" "$f" openmpi >"$mpi"
python3 - "$fc" "$mpi" "$coll" "$n" <<'PY'
import json, sys
fc = {r["bytes"]: r for r in map(json.loads, open(sys.argv[1]))}
mpi = {r["bytes"]: r for r in map(json.loads, open(sys.argv[2])) if "bytes" in r}
print(f"# {sys.argv[3]}, {sys.argv[4]} ranks: ferrocoll (thread) vs Open MPI (processes, shm)")
print(f"# {'bytes':>10} {'ferrocoll us':>13} {'algo':>6} {'Open MPI us':>12} {'speed-up':>9}")
for b in sorted(set(fc) & set(mpi)):
    a, m = fc[b]["time_us"], mpi[b]["time_us"]
    print(f"  {b:>10} {a:>13.1f} {fc[b]['algo']:>6} {m:>12.1f} {m / a:>9.2f}")
PY
