#!/usr/bin/env bash
# Runs every (collective, algorithm) pair of the catalogue through
# `ferrocoll bench --check` for several group sizes and topologies, and
# reports any size with wrong elements or an `algo` field that is not the
# forced algorithm. Exit status 1 if anything failed.
# Usage: bash bench/check_algorithms.sh [MAXBYTES]   (default 1M)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q || exit 1
fc=target/release/ferrocoll
max=${1:-1M}
declare -A algos=(
  [allreduce]="ring ring2 tree dbtree butterfly hd direct star hier torus2d mesh2d"
  [allgather]="ring butterfly bruck direct hier"
  [reducescatter]="ring halving pairwise direct hier"
  [bcast]="tree scatter_allgather pipeline direct"
  [reduce]="tree rs_gather pipeline"
  [alltoall]="direct pairwise bruck hier"
  [alltoallv]="direct pairwise hier"
  [gather]="linear tree"
  [scatter]="linear tree"
)
topo_aware=" hier torus2d mesh2d "
runs=0; bad=0
for coll in allreduce allgather reducescatter bcast reduce alltoall alltoallv gather scatter; do
  for algo in ${algos[$coll]}; do
    cases="2: 3: 4: 5: 8:"
    [[ $topo_aware == *" $algo "* ]] && cases="$cases 4:1x4 4:2x2 6:2x3 8:2x4 8:4x2 8:2x2x2 9:3x3 12:2x2x3"
    for c in $cases; do
      n=${c%%:*}; topo=${c#*:}
      out=$(env ${topo:+FERROCOLL_TOPO=$topo} FERROCOLL_ALGO=$coll:$algo $fc bench "$coll" -n "$n" \
            --check --json -e "$max" --iters 2 --warmup 1 2>&1)
      rc=$?; runs=$((runs + 1))
      wrong=$(grep -c '"wrong":0' <<<"$out")
      lines=$(grep -c '^{' <<<"$out")
      other=$(grep '^{' <<<"$out" | grep -vc "\"algo\":\"$algo\"")
      if [[ $rc != 0 || $lines == 0 || $wrong != "$lines" || $other != 0 ]]; then
        bad=$((bad + 1))
        echo "FAIL $coll:$algo n=$n topo=${topo:-flat} rc=$rc lines=$lines ok=$wrong other-algo=$other"
        grep -v '^{' <<<"$out" | head -3
      fi
    done
  done
done
echo "checked $runs runs (every size 8 B .. $max each); $bad failed"
[[ $bad == 0 ]]
