#!/usr/bin/env bash
# Regret of `auto`: its time over the best forced algorithm's time at each
# size, all measured in the same run, for the size rule and for the cost
# model (FERROCOLL_AUTO=model, with the profile in FERROCOLL_PROFILE if set).
# Every configuration runs 3 times and keeps each size's fastest mean: on a
# shared 2-core machine a single descheduled iteration can inflate a 20-call
# mean tenfold at small sizes, which would measure the machine, not the choice.
# Usage: bash bench/regret.sh [RANKS...]   (default: 2 4)
#
# REGRET_PROFILES="name=path ..." also runs the model's choice with each of
# these profiles (names of letters, digits and _), in the same runs, so that
# profiles are compared against the same forced-algorithm times
# (auto_model_<name>). REGRET_REPS sets the runs (default 3). Each mode is
# scored three ways: by the fastest run's mean (the lines as before), by the
# fastest run's median ("by median"), which one descheduled call moves less,
# and by the median over the runs of each run's median ("by median of runs").
# The fastest-run scores are biased against auto wherever several algorithms
# run the same plan (2 ranks): the best forced time is then the fastest of
# (algorithms x runs) samples, auto's the fastest of runs samples, so noise
# alone puts auto behind; the median of runs is not. REGRET_KEEP=DIR keeps
# the raw bench JSON there. REGRET_COLLS sets the collectives (default
# "allreduce allgather alltoall"; any `ferrocoll bench` collective with more
# than one algorithm), REGRET_TRANSPORT the transport (default: thread; shm or
# tcp start the ranks as processes).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=target/release/ferrocoll
ranks=${*:-2 4}
reps=${REGRET_REPS:-3}
profiles=${REGRET_PROFILES:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
colls=${REGRET_COLLS:-allreduce allgather alltoall}
transport=()
if [ -n "${REGRET_TRANSPORT:-}" ]; then transport=(--transport "$REGRET_TRANSPORT"); fi
for coll in $colls; do
  algos=$($fc model "$coll" -n 4 --json | python3 -c 'import json,sys; print(" ".join(c["algo"] for c in json.load(sys.stdin)["candidates"]))')
  for n in $ranks; do
    run() { $fc bench "$coll" "${transport[@]}" -n "$n" -b 8 -e 64M -f 8 --iters 20 --warmup 5 --json "$@"; }
    for rep in $(seq "$reps"); do
      for a in $algos; do run --algo "$a" >> "$tmp/$coll-$n-$a.json"; done
      FERROCOLL_AUTO=rule run >> "$tmp/$coll-$n-auto_rule.json"
      FERROCOLL_AUTO=model run >> "$tmp/$coll-$n-auto_model.json"
      for p in $profiles; do
        FERROCOLL_AUTO=model FERROCOLL_PROFILE="${p#*=}" run >> "$tmp/$coll-$n-auto_model_${p%%=*}.json"
      done
    done
  done
done
if [ -n "${REGRET_KEEP:-}" ]; then mkdir -p "$REGRET_KEEP" && cp "$tmp"/*.json "$REGRET_KEEP"/; fi
python3 - "$tmp" <<'PY'
import glob, json, os, sys, collections
d = sys.argv[1]
modes = set()
for field, label, pick in (("time_us", "", min), ("median_us", " by median", min),
                           ("median_us", " by median of runs",
                            lambda v: sorted(v)[len(v) // 2])):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in glob.glob(os.path.join(d, "*.json")):
        coll, n, algo = os.path.basename(f)[:-5].split("-", 2)
        if algo.startswith("auto"):
            modes.add(algo)
        for line in open(f):
            r = json.loads(line)
            runs[(coll, int(n), r["bytes"])][algo].append((r[field], r["algo"]))
    # (coll, n, bytes) -> {algo: (time, algorithm that ran)}
    times = {key: {a: pick(v) for a, v in t.items()} for key, t in runs.items()}
    for mode in ["auto_rule", "auto_model"] + sorted(modes - {"auto_rule", "auto_model"}):
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
        print(f"{mode}{label}: regret <= 1.10 at {ok}/{total} sizes ({100*ok/total:.0f}%); worst: " +
              ", ".join(f"{c} n={n} {b}B {a} {r:.2f}" for r, (c, n, b), a in worst[:4]))
PY
