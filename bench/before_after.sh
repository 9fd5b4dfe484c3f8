#!/usr/bin/env bash
# One build against another, back to back on the same machine: f32 sum
# allreduce busbw from `ferrocoll bench` (auto algorithm, built-in profile),
# over shm with 2 and 4 ranks and tcp with 2, REPS alternating rounds; prints
# the median busbw of each build per size and their ratio (after / before).
# Usage: bash bench/before_after.sh BEFORE_BIN AFTER_BIN [REPS] [MAXBYTES]
# (the binaries are target/release/ferrocoll of two checkouts).
set -euo pipefail
before=$1; after=$2; reps=${3:-3}; hi=${4:-67108864}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for tn in shm:2 shm:4 tcp:2; do
  t=${tn%:*}; n=${tn#*:}
  for ((r = 1; r <= reps; r++)); do
    for which in before after; do
      bin=$before; [[ $which == after ]] && bin=$after
      "$bin" bench allreduce --transport "$t" -n "$n" -b 8 -e "$hi" -f 8 --iters 20 --warmup 5 --json \
        2>/dev/null >"$tmp/$t$n.$which.$r"
    done
  done
  echo
  echo "## $t, $n ranks: busbw GB/s, median of $reps rounds (before | after | after/before)"
  python3 - "$tmp" "$t$n" "$reps" <<'PY'
import json, statistics, sys
tmp, key, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(which):
    out = {}
    for r in range(1, reps + 1):
        for line in open(f"{tmp}/{key}.{which}.{r}"):
            d = json.loads(line)
            out.setdefault(d["bytes"], []).append(d["busbw"])
    return {b: statistics.median(v) for b, v in out.items()}
b, a = load("before"), load("after")
print("| bytes | before | after | ratio |")
print("|---:|---:|---:|---:|")
for size in sorted(b):
    print(f"| {size} | {b[size]:.3f} | {a[size]:.3f} | {a[size] / b[size]:.2f} |")
PY
done
