#!/usr/bin/env bash
# N-way comparison of one collective over shared memory, interleaved round by
# round (so that the VM's drifting speed hits every side alike): ferrocoll
# binaries, forced algorithms and Open MPI side by side, each size's median
# time over the rounds and its range. Where bench/ab.sh compares two
# commands, this one compares any number, and the peer with them.
#
# Usage: [ITERS=N] [EXTRA="--in-place"] bash bench/nway.sh COLL RANKS MIN MAX ROUNDS SIDE...
#   SIDE is `ompi` (bench/peer_mpi_coll.c under mpirun, its own iteration
#   counts), an algorithm name for target/release/ferrocoll (`auto`, `ring`,
#   `direct`, ...), or NAME=BINARY (that ferrocoll binary, algorithm `auto`).
#   Sizes go MIN to MAX by 2 (suffixes K, M); ITERS (default 100) timed calls
#   per size for ferrocoll, after 5 warm-up calls; EXTRA goes to every
#   ferrocoll run (e.g. --in-place for broadcasts, as the peers time them).
#   e.g. bash bench/nway.sh bcast 4 64K 1M 3 auto tree direct ompi
# The runs' lines go to a file and are parsed after the last round: a Python
# interpreter starting beside a run slows its first sizes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
coll=$1 n=$2 lo=$3 hi=$4 rounds=$5
shift 5
bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
lo_b=$(bytes "$lo") hi_b=$(bytes "$hi")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ " $* " == *" ompi "* ]]; then
  command -v mpicc >/dev/null || { echo "nway.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
  mpicc -O2 -o "$tmp/mpi_coll" bench/peer_mpi_coll.c
fi
cargo build --release -q -p ferrocoll-cli
read -r -a extra <<<"${EXTRA:-}"
for ((r = 0; r < rounds; r++)); do
  for side in "$@"; do
    if [[ $side == ompi ]]; then
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$n" --oversubscribe \
        "$tmp/mpi_coll" "$coll" "$lo_b" "$hi_b" 2 2>/dev/null | sed "s/^/ompi /"
    else
      if [[ $side == *=* ]]; then bin=${side#*=} algo=auto name=${side%%=*}; else bin=target/release/ferrocoll algo=$side name=$side; fi
      "$bin" bench "$coll" --transport shm -n "$n" -b "$lo" -e "$hi" -f 2 --iters "${ITERS:-100}" \
        --warmup 5 --no-check --json --algo "$algo" "${extra[@]}" | sed "s/^/$name /"
    fi
  done
done >"$tmp/raw"
python3 - "$tmp/raw" <<'PY'
import collections, json, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, js = line.split(" ", 1)
    if js.startswith("{"):
        r = json.loads(js)
        times[(side, r["bytes"])].append(r["time_us"])
sides = list(dict.fromkeys(k[0] for k in times))
print(f"# time per call in us: median over the rounds (range)")
# A cell is as wide as the widest one, plus two spaces (64 MiB calls take
# tens of thousands of microseconds).
width = 2 + max([len(s) for s in sides] + [len(f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})") for t in times.values()])
print(f"{'bytes':>10}" + "".join(f"{s:>{width}}" for s in sides))
for b in sorted({k[1] for k in times}):
    cells = []
    for s in sides:
        t = times.get((s, b))
        cells.append(f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" if t else "-")
    print(f"{b:>10}" + "".join(f"{c:>{width}}" for c in cells))
PY
