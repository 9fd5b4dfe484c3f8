#!/usr/bin/env bash
# A/B of two ferrocoll commands on one collective over TCP, 2 ranks, interleaved run by run
# (the machine's load hits both alike): REPS runs of each, ITERS timed calls per size, sizes MIN
# to MAX by 4; prints each size's median busbw of either, its range, and their ratio. A command
# may carry variables: "env FERROCOLL_TCP_STREAMS=2 /tmp/fc-new".
# Usage: bash bench/ab_tcp.sh "CMD_A" "CMD_B" COLL MIN MAX REPS ITERS
#   e.g. flock /tmp/ferrocoll-bench.lock bash bench/ab_tcp.sh /tmp/fc-base /tmp/fc-new bcast 1M 64M 3 10
a=$1 b=$2 coll=$3 lo=$4 hi=$5 reps=$6 it=$7
for ((r = 0; r < reps; r++)); do
  for tag in A B; do
    if [[ $tag == A ]]; then cmd=$a; else cmd=$b; fi
    # shellcheck disable=SC2086 # the command's words split on purpose
    $cmd bench "$coll" --transport tcp -n 2 -b "$lo" -e "$hi" -f 4 --iters "$it" --warmup 3 --no-check --json 2>/dev/null | sed "s/^/$tag /"
  done
done | python3 -c '
import sys, json, statistics as st
d = {}
for line in sys.stdin:
    tag, js = line.split(" ", 1)
    if not js.startswith("{"): continue
    r = json.loads(js); d.setdefault((r["bytes"], tag), []).append(r["busbw"])
for b in sorted({k[0] for k in d}):
    A, B = d[(b,"A")], d[(b,"B")]
    print(f"{b:>10} A busbw {st.median(A):6.2f} [{min(A):.2f}-{max(A):.2f}]  B {st.median(B):6.2f} [{min(B):.2f}-{max(B):.2f}]  B/A {st.median(B)/st.median(A):5.2f}")
'
