#!/usr/bin/env bash
# A/B of two ferrocoll commands on one collective, interleaved run by run (so that the
# machine's load hits both alike): REPS runs of each, ITERS timed calls per size (default 200),
# sizes MIN to MAX by 4; prints each size's median time and busbw of either, the busbw range
# over the runs, and their ratio. A command may carry variables, split on spaces:
# "env FERROCOLL_TCP_STREAMS=2 /tmp/fc-new".
# Usage: [ITERS=N] bash bench/ab.sh BASE NEW COLL TRANSPORT RANKS MIN MAX REPS [bench options]
#   e.g. cp target/release/ferrocoll /tmp/fc-new; bash bench/ab.sh /tmp/fc-base /tmp/fc-new reduce shm 2 32K 8M 3
base=$1 new=$2 coll=$3 t=$4 n=$5 lo=$6 hi=$7 reps=$8; shift 8
iters=${ITERS:-200}
# The runs' lines go to a file and are parsed after the last run: a Python
# interpreter starting beside the first run slows its small sizes.
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for ((r=0;r<reps;r++)); do
  for b in base new; do
    # shellcheck disable=SC2086 # the command's words split on purpose
    ${!b} bench "$coll" --transport "$t" -n "$n" -b "$lo" -e "$hi" -f 4 --iters "$iters" --warmup 5 --no-check --json "$@" 2>/dev/null | sed "s/^/$b /"
  done
done >"$raw"
python3 -c '
import sys, json, statistics as st
d = {}
for line in sys.stdin:
    tag, js = line.split(" ", 1)
    if not js.startswith("{"): continue
    r = json.loads(js); d.setdefault((r["bytes"], tag), []).append((r["time_us"], r["busbw"]))
for b in sorted({k[0] for k in d}):
    line = f"{b:>10}"
    for tag in ("base", "new"):
        t = st.median(x[0] for x in d[(b, tag)])
        bw = [x[1] for x in d[(b, tag)]]
        line += f"  {tag} {t:10.1f} us busbw {st.median(bw):6.2f} [{min(bw):.2f}-{max(bw):.2f}]"
    a, n = (st.median(x[0] for x in d[(b, tag)]) for tag in ("base", "new"))
    print(f"{line}  new/base time {n/a:5.2f}")
' <"$raw"
