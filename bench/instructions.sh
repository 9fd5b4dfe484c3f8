#!/usr/bin/env bash
# Instructions one rank executes per call of a small collective, counted by
# valgrind's callgrind: a count that does not move with the VM's speed, so
# two builds (or ferrocoll and Open MPI) compare exactly where timings of
# 0.1-0.3 us a call drift by half between rounds.
#
# Usage: bash bench/instructions.sh COLL BYTES RANK [SIDE]
#   SIDE is a ferrocoll binary (default target/release/ferrocoll) or `ompi`
#   (bench/peer_mpi_coll.c under mpirun). Runs 2 ranks over shared memory;
#   only RANK runs under callgrind (50x slower, so it never waits for the
#   other: the count is its own path, without polling).
#   ferrocoll: inclusive instructions of `Communicator::run` per call
#   (broadcasts in place, as the peers time them); Open MPI: of PMPI_<Coll>.
#   e.g. bash bench/instructions.sh bcast 8 0          # the broadcast's root
#        bash bench/instructions.sh bcast 8 0 ompi
# Needs valgrind (apt-get install valgrind) and, for ompi, Open MPI.
set -euo pipefail

coll=${1:?COLL}
bytes=${2:?BYTES}
rank=${3:?RANK}
side=${4:-target/release/ferrocoll}
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
tmp=$(mktemp -d)
trap "rm -rf $tmp" EXIT
out="$tmp/callgrind.out"
vg=(valgrind --tool=callgrind "--callgrind-out-file=$out")

if [ "$side" = ompi ]; then
  command -v mpicc >/dev/null || { echo "instructions.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
  # -g: the call counts come from the annotated source of the caller.
  mpicc -O2 -g -o "$tmp/mpi_coll" bench/peer_mpi_coll.c
  prog=("$tmp/mpi_coll" "$coll" "$bytes" "$bytes")
  if [ "$rank" = 0 ]; then
    first=("${vg[@]}" "${prog[@]}") second=("${prog[@]}")
  else
    first=("${prog[@]}") second=("${vg[@]}" "${prog[@]}")
  fi
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np 1 "${first[@]}" : -np 1 "${second[@]}" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  case $coll in
    bcast) func=PMPI_Bcast ;;
    reduce) func=PMPI_Reduce ;;
    allreduce) func=PMPI_Allreduce ;;
    *) echo "instructions.sh: ompi side knows bcast, reduce and allreduce" >&2; exit 1 ;;
  esac
else
  bin=$(realpath "$side")
  extra=()
  [ "$coll" = bcast ] && extra=(--in-place)
  # The launcher starts the same wrapper for every rank; only RANK runs
  # under valgrind.
  cat >"$tmp/rank.sh" <<EOF
#!/bin/sh
if [ "\$FERROCOLL_RANK" = "$rank" ]; then exec ${vg[*]} "$bin" "\$@"; fi
exec "$bin" "\$@"
EOF
  chmod +x "$tmp/rank.sh"
  FERROCOLL_TIMEOUT=600 "$bin" run -n 2 -- "$tmp/rank.sh" bench "$coll" -b "$bytes" -e "$bytes" \
    --iters 20000 --warmup 100 --no-check "${extra[@]}" >/dev/null 2>&1
  func='Communicator>::run'
fi

# The inclusive count of the function over the call that ran most often
# (the timed loops; setup calls of it run once or twice).
callgrind_annotate --inclusive=yes --threshold=100 "$out" 2>/dev/null | python3 -c '
import re, sys
func = sys.argv[1]
best = None
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S.*?:(.*?) \(([\d,]+)x\)", line)
    if m and m.group(2).endswith(func):
        n, calls = int(m.group(1).replace(",", "")), int(m.group(3).replace(",", ""))
        if best is None or calls > best[1]:
            best = (n, calls)
if best is None:
    sys.exit("instructions.sh: no calls of " + func + " in the profile")
print("%.0f instructions a call (%d calls)" % (best[0] / best[1], best[1]))
' "$func"
