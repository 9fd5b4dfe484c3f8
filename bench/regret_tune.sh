#!/usr/bin/env bash
# Regret of `auto` with a tuned table and with the cost model only, after
# `ferrocoll tune` (issue 19). For each transport and group size:
#   1. `ferrocoll tune` writes the table (its own file, in $tmp);
#   2. REGRET_REPS times (default 2), fresh runs (other processes, other
#      samples than the tuned ones) of `ferrocoll tune --with-auto`, once
#      with auto reading the table (FERROCOLL_TUNE=<table>) and once model
#      only (FERROCOLL_TUNE=off). Each run times every forced candidate and
#      `auto` in the same rounds of one process, taking turns (the tuner's
#      sampling: loops of calls filling 20 ms, 7 samples, medians).
# A size counts when auto's median is within 1.10 of the fastest forced
# candidate's median of the same run; a size's regret is the median over
# the runs. Why one process per run and not one per algorithm (as this
# script did before): on this VM a process's speed at small sizes is
# bimodal (the same binary's 8 B-512 B allgather ran at 0.17 us in some
# processes and 0.45 us in others), and its speed drifts 2-6x over minutes,
# so algorithms timed in separate processes minutes apart compare the
# processes and the minutes, not the algorithms (the old oracle, the first
# run's fastest algorithm scored on the others, reached only 60-71 %).
# Also printed: auto's choice scored by the time of the forced candidate it
# ran (the selection alone; auto's handle and that candidate's handle run
# the same code, and their ratio is printed too), the oracle (the table's
# fastest, scored in the fresh runs: how far the tuned order holds in other
# processes, the ceiling for any table) and the spread of a forced
# candidate's median between fresh runs.
# Usage: bash bench/regret_tune.sh [TRANSPORT...]   (default: thread shm tcp)
# REGRET_RANKS (default "2 4"), REGRET_MAX (largest size, default 64M),
# REGRET_COLLS (default allreduce allgather reducescatter alltoall bcast),
# TUNE_ARGS (extra arguments of every `ferrocoll tune`), REGRET_KEEP=DIR
# keeps the tables and the raw JSON there; REGRET_SCORE=DIR only scores such
# a kept directory again (no runs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=$PWD/target/release/ferrocoll
transports=${*:-thread shm tcp}
ranks=${REGRET_RANKS:-2 4}
reps=${REGRET_REPS:-2}
max=${REGRET_MAX:-64M}
colls=${REGRET_COLLS:-allreduce allgather reducescatter alltoall bcast}
if [ -n "${REGRET_SCORE:-}" ]; then tmp=$REGRET_SCORE; transports=""; else
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT; fi
echo "# commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), $(nproc) cores"
for t in $transports; do
  for n in $ranks; do
    table=$tmp/tune-$t-$n.json
    tune() {
      # shellcheck disable=SC2086
      $fc tune --transport "$t" -n "$n" -e "$max" --colls "$(echo $colls | tr ' ' ,)" ${TUNE_ARGS:-} "$@"
    }
    echo "# tune $t n=$n: $(uptime)" >&2
    tune --out "$table" > "$tmp/tune-$t-$n.txt"
    for rep in $(seq "$reps"); do
      echo "# fresh runs $t n=$n, $rep of $reps: $(uptime)" >&2
      FERROCOLL_TUNE="$table" tune --with-auto --json --out "$tmp/scratch.json" |
        grep '^{' > "$tmp/fresh-$t-$n-table-$rep.jsonl"
      FERROCOLL_TUNE=off tune --with-auto --json --out "$tmp/scratch.json" |
        grep '^{' > "$tmp/fresh-$t-$n-model-$rep.jsonl"
    done
  done
done
if [ -n "${REGRET_KEEP:-}" ] && [ -z "${REGRET_SCORE:-}" ]; then
  mkdir -p "$REGRET_KEEP" && cp "$tmp"/tune-* "$tmp"/fresh-* "$REGRET_KEEP"/
fi
python3 - "$tmp" <<'PY'
import collections, glob, json, os, statistics, sys

d = sys.argv[1]
# (transport, n, mode) -> (coll, bytes) -> [per-run (auto median, ran, {algo: median})]
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(os.path.join(d, "fresh-*.jsonl"))):
    _, t, n, mode, _rep = os.path.basename(f)[: -len(".jsonl")].split("-")
    points = collections.defaultdict(dict)
    ran = {}
    for line in open(f):
        r = json.loads(line)
        key = (r["coll"], r["bytes"])
        points[key][r["algo"]] = r["median_us"]
        if r["algo"] == "auto":
            ran[key] = r["ran"]
    for key, times in points.items():
        if "auto" not in times:
            continue
        forced = {a: v for a, v in times.items() if a != "auto"}
        runs[(t, int(n), mode)][key].append((times["auto"], ran[key], forced))

def tally(groups, label, ok):
    for g in (label[0], f"{label[0]} n={label[1]}", label[2]):
        groups[g][0] += ok
        groups[g][1] += 1
    groups["all"][0] += ok
    groups["all"][1] += 1

def line(name, groups, worst):
    ok, total = groups["all"]
    print(f"{name}: regret <= 1.10 at {ok}/{total} sizes ({100 * ok / max(total, 1):.0f}%); "
          + "; ".join(f"{g} {a}/{b}" for g, (a, b) in sorted(groups.items()) if g != "all"))
    worst.sort(reverse=True)
    print("  worst: " + ", ".join(f"{t} {c} n={n} {b}B ran {a} {r:.2f}"
                                 for r, (t, n, c, b), a in worst[:8]))

def auto_timed(auto, ran, forced):
    """auto's own handle, timed beside the candidates."""
    return auto / min(forced.values())

def auto_choice(auto, ran, forced):
    """The forced candidate auto ran, timed in the same run: the choice
    alone, without the sampling noise between two handles of one algorithm
    (falls back to auto's own time where auto ran no forced candidate)."""
    return forced.get(ran, auto) / min(forced.values())

for mode, name in (("table", "auto_table"), ("model", "auto_model")):
    for score, suffix in ((auto_timed, ""), (auto_choice, " (its choice scored by the candidate's time)")):
        groups = collections.defaultdict(lambda: [0, 0])
        worst = []
        for (t, n, m), points in sorted(runs.items()):
            if m != mode:
                continue
            for (coll, b), rs in sorted(points.items()):
                regret = statistics.median(score(*r) for r in rs)
                ran = "/".join(sorted({r for _, r, _ in rs}))
                tally(groups, (t, n, coll), regret <= 1.10)
                worst.append((regret, (t, n, coll, b), ran))
        line(name + suffix, groups, worst)

# auto's own handle against the handle of the algorithm it ran, same run:
# the overhead of choosing per call plus the noise between two handles.
ratios = sorted(auto / forced[ran] for pts in runs.values() for rs in pts.values()
                for auto, ran, forced in rs if ran in forced)
if ratios:
    print(f"auto / the candidate it ran, same run: median {ratios[len(ratios) // 2]:.3f}, "
          f"p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[int(len(ratios) * 0.9)]:.2f} "
          f"over {len(ratios)} points")

# The tuned table's fastest, scored in the fresh runs (both modes' runs
# time every forced candidate): the ceiling of any table of that run.
groups = collections.defaultdict(lambda: [0, 0])
worst = []
spread = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(d, "tune-*.json"))):
    t, n = os.path.basename(f)[len("tune-"): -len(".json")].split("-")
    table = json.load(open(f))["tables"][0]
    for p in table["points"]:
        key = (p["coll"], p["bytes"])
        pick = p["times"][0]["algo"]
        fresh = runs[(t, int(n), "table")].get(key, []) + runs[(t, int(n), "model")].get(key, [])
        if not fresh:
            continue
        regret = statistics.median(forced[pick] / min(forced.values()) for _, _, forced in fresh)
        tally(groups, (t, int(n), p["coll"]), regret <= 1.10)
        worst.append((regret, (t, int(n), p["coll"], p["bytes"]), pick))
        for a in fresh[0][2]:
            v = [forced[a] for _, _, forced in fresh if a in forced]
            if len(v) >= 2:
                spread[f"{t} n={n}"].append(max(v) / min(v))
line("oracle (the tuned table's fastest, timed in the fresh runs)", groups, worst)
for g, v in sorted(spread.items()):
    v.sort()
    print(f"run-to-run spread {g}: a forced candidate's slowest/fastest fresh-run median "
          f"{v[len(v) // 2]:.2f}, p90 {v[int(len(v) * 0.9)]:.2f}; over 1.10 at "
          f"{sum(x > 1.10 for x in v)}/{len(v)}")
PY
