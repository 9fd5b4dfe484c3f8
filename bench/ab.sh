#!/usr/bin/env bash
# A/B of two ferrocoll binaries on one collective, interleaved run by run (so that the
# machine's load hits both alike): REPS runs of each, 200 timed calls per size, sizes MIN to
# MAX by 4; prints each size's median time of either and their ratio.
# Usage: bash bench/ab.sh BASE NEW COLL TRANSPORT RANKS MIN MAX REPS [bench options]
#   e.g. cp target/release/ferrocoll /tmp/fc-new; bash bench/ab.sh /tmp/fc-base /tmp/fc-new reduce shm 2 32K 8M 3
base=$1 new=$2 coll=$3 t=$4 n=$5 lo=$6 hi=$7 reps=$8; shift 8
for ((r=0;r<reps;r++)); do
  for b in base new; do
    bin=${!b}
    "$bin" bench "$coll" --transport "$t" -n "$n" -b "$lo" -e "$hi" -f 4 --iters 200 --warmup 5 --no-check --json "$@" 2>/dev/null | sed "s/^/$b /"
  done
done | python3 -c '
import sys, json, statistics as st
d = {}
for line in sys.stdin:
    tag, js = line.split(" ", 1)
    if not js.startswith("{"): continue
    r = json.loads(js); d.setdefault((r["bytes"], tag), []).append(r["time_us"])
for b in sorted({k[0] for k in d}):
    a, n = st.median(d[(b,"base")]), st.median(d[(b,"new")])
    print(f"{b:>10} base {a:10.1f} us  new {n:10.1f} us  new/base {n/a:6.2f}")
'
