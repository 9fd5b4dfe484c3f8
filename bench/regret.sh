#!/usr/bin/env bash
# Regret of `auto`: its time over the best forced algorithm's time at each
# size, all measured in the same run, for the size rule and for the cost
# model (FERROCOLL_AUTO=model, with the profile in FERROCOLL_PROFILE if set).
# Every configuration runs 3 times and keeps each size's fastest mean: on a
# shared 2-core machine a single descheduled iteration can inflate a 20-call
# mean tenfold at small sizes, which would measure the machine, not the choice.
# Usage: bash bench/regret.sh [RANKS...]   (default: 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=target/release/ferrocoll
ranks=${*:-2 4}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for coll in allreduce allgather alltoall; do
  algos=$($fc model "$coll" -n 4 --json | python3 -c 'import json,sys; print(" ".join(c["algo"] for c in json.load(sys.stdin)["candidates"]))')
  for n in $ranks; do
    run() { $fc bench "$coll" -n "$n" -b 8 -e 64M -f 8 --iters 20 --warmup 5 --json "$@"; }
    for rep in 1 2 3; do
      for a in $algos; do run --algo "$a" >> "$tmp/$coll-$n-$a.json"; done
      FERROCOLL_AUTO=rule run >> "$tmp/$coll-$n-auto_rule.json"
      FERROCOLL_AUTO=model run >> "$tmp/$coll-$n-auto_model.json"
    done
  done
done
python3 - "$tmp" <<'PY'
import glob, json, os, sys, collections
d = sys.argv[1]
times = collections.defaultdict(dict)  # (coll, n, bytes) -> {algo: time}
for f in glob.glob(os.path.join(d, "*.json")):
    coll, n, algo = os.path.basename(f)[:-5].split("-", 2)
    for line in open(f):
        r = json.loads(line)
        key = (coll, int(n), r["bytes"])
        if algo not in times[key] or r["time_us"] < times[key][algo][0]:
            times[key][algo] = (r["time_us"], r["algo"])
for mode in ("auto_rule", "auto_model"):
    ok = total = 0
    worst = []
    for key in sorted(times):
        t = times[key]
        best = min(v[0] for a, v in t.items() if not a.startswith("auto"))
        regret = t[mode][0] / best
        total += 1
        ok += regret <= 1.10
        worst.append((regret, key, t[mode][1]))
    worst.sort(reverse=True)
    print(f"{mode}: regret <= 1.10 at {ok}/{total} sizes ({100*ok/total:.0f}%); worst: " +
          ", ".join(f"{c} n={n} {b}B {a} {r:.2f}" for r, (c, n, b), a in worst[:4]))
PY
