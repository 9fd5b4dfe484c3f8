#!/usr/bin/env bash
# Regret of `auto` with a tuned table and with the cost model only, after
# `ferrocoll tune` (issue 19): for each transport and group size, tune first
# (into a table of its own), then in fresh runs (other processes, other
# samples than the tuned ones) bench every forced candidate, auto with the
# table (FERROCOLL_TUNE=<table>) and auto without it (FERROCOLL_TUNE=off),
# interleaved, REGRET_REPS times (default 3). A size counts when auto's time
# is within 1.10 of the best forced algorithm's. Scored as bench/regret.sh
# scores (the fastest run's mean; the median over the runs of each run's
# median, which is not biased against auto by taking the best of more
# samples for the forced side), and against an oracle that picks the
# fastest forced algorithm of the first run and is scored on the others
# (how far the runs agree with each other: the ceiling noise leaves).
# Usage: bash bench/regret_tune.sh [TRANSPORT...]   (default: thread shm tcp)
# REGRET_RANKS (default "2 4"), REGRET_MAX (largest size, default 64M),
# REGRET_COLLS (default allreduce allgather reducescatter alltoall bcast),
# TUNE_ARGS (extra arguments of `ferrocoll tune`), REGRET_KEEP=DIR keeps the
# tables and the raw bench JSON there; REGRET_SCORE=DIR only scores such a
# kept directory again (no runs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=$PWD/target/release/ferrocoll
transports=${*:-thread shm tcp}
ranks=${REGRET_RANKS:-2 4}
reps=${REGRET_REPS:-3}
max=${REGRET_MAX:-64M}
colls=${REGRET_COLLS:-allreduce allgather reducescatter alltoall bcast}
if [ -n "${REGRET_SCORE:-}" ]; then tmp=$REGRET_SCORE; transports=""; else
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT; fi
# The profile the library would read stays as it is; tables go to $tmp.
for t in $transports; do
  for n in $ranks; do
    table=$tmp/tune-$t-$n.json
    echo "# tune $t n=$n: $(uptime)" >&2
    # shellcheck disable=SC2086
    $fc tune --transport "$t" -n "$n" -e "$max" --colls "$(echo $colls | tr ' ' ,)" \
      --out "$table" ${TUNE_ARGS:-} > "$tmp/tune-$t-$n.txt"
    echo "# bench $t n=$n: $(uptime)" >&2
    for coll in $colls; do
      algos=$($fc model "$coll" -n "$n" --json | python3 -c 'import json,sys; print(" ".join(c["algo"] for c in json.load(sys.stdin)["candidates"]))')
      run() { $fc bench "$coll" -n "$n" --transport "$t" -b 8 -e "$max" -f 8 --iters 20 --warmup 5 --json "$@"; }
      for rep in $(seq "$reps"); do
        for a in $algos; do run --algo "$a" >> "$tmp/$t-$coll-$n-$a.json"; done
        FERROCOLL_TUNE="$table" run >> "$tmp/$t-$coll-$n-auto_table.json"
        FERROCOLL_TUNE=off run >> "$tmp/$t-$coll-$n-auto_model.json"
      done
    done
  done
done
if [ -n "${REGRET_KEEP:-}" ] && [ -z "${REGRET_SCORE:-}" ]; then mkdir -p "$REGRET_KEEP" && cp "$tmp"/*.json "$tmp"/*.txt "$REGRET_KEEP"/; fi
python3 - "$tmp" <<'PY'
import glob, json, os, sys, collections
d = sys.argv[1]
for field, label, pick in (("time_us", "fastest run's mean", min),
                           ("median_us", "median of runs' medians",
                            lambda v: sorted(v)[len(v) // 2])):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for f in glob.glob(os.path.join(d, "*.json")):
        if os.path.basename(f).startswith("tune-"):
            continue
        t, coll, n, algo = os.path.basename(f)[:-5].split("-", 3)
        for line in open(f):
            r = json.loads(line)
            runs[(t, coll, int(n), r["bytes"])][algo].append((r[field], r["algo"]))
    times = {key: {a: pick(v) for a, v in t.items()} for key, t in runs.items()}
    print(f"## scored by the {label}")
    for mode in ("auto_table", "auto_model"):
        groups = collections.defaultdict(lambda: [0, 0])
        worst = []
        for key in sorted(times):
            t = times[key]
            if mode not in t:
                continue
            best = min(v[0] for a, v in t.items() if not a.startswith("auto"))
            regret = t[mode][0] / best
            for g in ("all", key[0], f"{key[0]} n={key[2]}", key[1]):
                groups[g][0] += regret <= 1.10
                groups[g][1] += 1
            worst.append((regret, key, t[mode][1]))
        worst.sort(reverse=True)
        ok, total = groups["all"]
        print(f"{mode}: regret <= 1.10 at {ok}/{total} sizes ({100*ok/max(total,1):.0f}%); " +
              "; ".join(f"{g} {a}/{b}" for g, (a, b) in sorted(groups.items()) if g != "all"))
        print("  worst: " + ", ".join(f"{tr} {c} n={n} {b}B {a} {r:.2f}"
                                     for r, (tr, c, n, b), a in worst[:6]))
# The noise ceiling: a chooser that knew the first run's times and took
# its fastest forced algorithm, scored on the other runs. No chooser does
# better on average than the runs agree with each other.
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob(os.path.join(d, "*.json")):
    if os.path.basename(f).startswith("tune-"):
        continue
    t, coll, n, algo = os.path.basename(f)[:-5].split("-", 3)
    for line in open(f):
        r = json.loads(line)
        runs[(t, coll, int(n), r["bytes"])][algo].append(r["median_us"])
med = lambda v: sorted(v)[len(v) // 2]
groups = collections.defaultdict(lambda: [0, 0])
for key, t in sorted(runs.items()):
    forced = {a: v for a, v in t.items() if not a.startswith("auto") and len(v) >= 2}
    if not forced:
        continue
    pick = min(forced, key=lambda a: forced[a][0])
    rest = {a: med(v[1:]) for a, v in forced.items()}
    regret = rest[pick] / min(rest.values())
    for g in ("all", f"{key[0]} n={key[2]}"):
        groups[g][0] += regret <= 1.10
        groups[g][1] += 1
ok, total = groups["all"]
print(f"oracle (the fastest forced algorithm of the first run, scored by the median of the other runs' medians): "
      f"regret <= 1.10 at {ok}/{total} sizes ({100*ok/max(total,1):.0f}%); " +
      "; ".join(f"{g} {a}/{b}" for g, (a, b) in sorted(groups.items()) if g != "all"))
# How far runs of the same forced algorithm agree: the largest over the
# smallest of its runs' medians, per size.
spread = collections.defaultdict(list)
for key, t in runs.items():
    for a, v in t.items():
        if not a.startswith("auto") and len(v) >= 2:
            spread[f"{key[0]} n={key[2]}"].append(max(v) / min(v))
for g, v in sorted(spread.items()):
    v.sort()
    print(f"run-to-run spread {g}: a forced algorithm's slowest/fastest run median {v[len(v)//2]:.2f}, "
          f"p90 {v[int(len(v) * 0.9)]:.2f}; over 1.10 at {sum(x > 1.10 for x in v)}/{len(v)} sizes")
PY
