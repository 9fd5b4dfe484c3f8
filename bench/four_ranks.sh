#!/usr/bin/env bash
# Issue 20 item 5: four ranks on two cores, 128 KiB - 8 MiB. Is the gap to
# Open MPI the algorithm choice (auto picks `direct` there) or the waiting
# policy (how long a waiting rank polls before it sleeps, FERROCOLL_SPIN_US,
# when there are two ranks per core)? Every algorithm of the collective is
# forced, and auto is run under several spin limits, in ROUNDS rounds that
# take turns with Open MPI (the machine's speed drifts over minutes, so each
# configuration meets the same machine); per size the median over rounds of
# each configuration's mean time per call, and its busbw against Open MPI's.
#
# Usage: bash bench/four_ranks.sh [COLL] [LO] [HI] [ROUNDS]
#        (default allreduce 128K 8M 3; ALGOS="direct ring" and SPINS="0 30"
#        narrow the configurations; N=4 the ranks; RAW=DIR keeps the JSON)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
coll=${1:-allreduce}
lo=${2:-128K}
hi=${3:-8M}
rounds=${4:-3}
n=${N:-4}
declare -A default_algos=(
  [allreduce]="direct ring ring2 butterfly hd star tree dbtree"
  [allgather]="direct ring butterfly bruck"
  [reducescatter]="direct ring halving pairwise"
  [alltoall]="direct pairwise bruck"
  [bcast]="tree scatter_allgather pipeline direct"
)
algos=${ALGOS:-${default_algos[$coll]:-direct ring}}
spins=${SPINS:-0 5 30 200}

cargo build --release -q -p ferrocoll-cli
fc=target/release/ferrocoll
tmp=${RAW:-$(mktemp -d)}
mkdir -p "$tmp"
[[ -n ${RAW:-} ]] || trap 'rm -rf "$tmp"' EXIT
command -v mpicc >/dev/null || { echo "four_ranks.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
mpicc -O2 -o "$tmp/mpi_coll" bench/peer_mpi_coll.c
to_bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
lo_b=$(to_bytes "$lo"); hi_b=$(to_bytes "$hi")

echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $coll, shm, $n ranks, $lo - $hi, $rounds rounds; forced: $algos; auto with FERROCOLL_SPIN_US in: $spins (default: unset)"
for ((r = 1; r <= rounds; r++)); do
  for a in $algos; do
    "$fc" bench "$coll" --transport shm -n "$n" -b "$lo" -e "$hi" -f 2 --algo "$a" \
      --iters 100 --warmup 5 --no-check --json >>"$tmp/fc_algo_$a" || echo "# $a failed in round $r" >&2
  done
  "$fc" bench "$coll" --transport shm -n "$n" -b "$lo" -e "$hi" -f 2 \
    --iters 100 --warmup 5 --no-check --json >>"$tmp/fc_auto"
  for s in $spins; do
    FERROCOLL_SPIN_US=$s "$fc" bench "$coll" --transport shm -n "$n" -b "$lo" -e "$hi" -f 2 \
      --iters 100 --warmup 5 --no-check --json >>"$tmp/fc_spin_$s"
  done
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$n" --oversubscribe \
    "$tmp/mpi_coll" "$coll" "$lo_b" "$hi_b" 2 >>"$tmp/ompi" 2>"$tmp/ompi.err" || { cat "$tmp/ompi.err" >&2; exit 1; }
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$tmp" <<'PY'
import json, os, statistics, sys
tmp = sys.argv[1]

def load(name):
    """Per size: the list of (time_us, busbw, algo) over the rounds."""
    rows = {}
    for line in open(os.path.join(tmp, name)):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if "bytes" in r:
                rows.setdefault(r["bytes"], []).append((r["time_us"], r["busbw"], r.get("algo", "")))
    return rows

names = sorted(f for f in os.listdir(tmp) if f.startswith("fc_"))
ompi = load("ompi")
confs = {f[3:]: load(f) for f in names}
sizes = sorted(ompi)
print("\n## median time per call over the rounds (us); in brackets busbw x Open MPI's; * the fastest")
head = f"{'bytes':>9} {'ompi':>8}" + "".join(f" {c:>17}" for c in confs)
print(head)
for b in sizes:
    o = statistics.median(t for t, _, _ in ompi[b])
    med = {c: statistics.median(t for t, _, _ in rows[b]) for c, rows in confs.items() if b in rows}
    best = min(med, key=med.get) if med else None
    line = f"{b:>9} {o:>8.1f}"
    for c in confs:
        if c in med:
            mark = "*" if c == best else " "
            line += f" {med[c]:>9.1f} ({o / med[c]:>4.2f}){mark}"
        else:
            line += f" {'-':>17}"
    print(line)
auto = confs.get("auto", {})
print("\n## what auto ran, per size:", ", ".join(f"{b}: {auto[b][0][2]}" for b in sizes if b in auto))
PY
