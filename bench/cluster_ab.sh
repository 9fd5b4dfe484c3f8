#!/usr/bin/env bash
# A/B of two ferrocoll binaries on the 2-host x 2-rank namespace cluster
# (bench/cluster.sh, 1gbit links, root), interleaved run by run so that the
# machine's load hits both alike: MoE dispatch/combine (1, 4, 16 tokens a
# rank, H = 2048 bf16, top-2 of 16 experts, uniform; direct, two-level and
# rail forced) and allreduce, alltoall and allgather from 8 B to 1 MiB
# (auto). Prints the median over the runs of each run's per-call median,
# for either binary, and their ratio.
#
# Usage: bash bench/cluster_ab.sh BASE NEW [REPS]   (default 3 runs of each)
#   e.g. cp target/release/ferrocoll /tmp/fc-new; bash bench/cluster_ab.sh /tmp/fc-base /tmp/fc-new
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1 new=$2 reps=${3:-3}
NAME=fcab
raw=$(mktemp)
cleanup() { bench/cluster.sh down --name $NAME >/dev/null 2>&1 || true; rm -f "$raw"; }
trap cleanup EXIT
bench/cluster.sh down --name $NAME >/dev/null 2>&1 || true
bench/cluster.sh up --name $NAME --hosts 2 --rate 1gbit --subnet 61 >/dev/null
# As bench/moe.sh: the hosts share this machine's cores.
export FERROCOLL_BIND=none FERROCOLL_SPIN_US=200
for ((r = 0; r < reps; r++)); do
    for tag in base new; do
        bin=${!tag}
        run() { "$bin" run --quiet-others --hosts "${NAME}h0:2,${NAME}h1:2" --agent "bench/cluster.sh exec" -- "$@"; }
        run "$bin" bench moe --tokens 1,4,16 --hidden 2048 --topk 2 --experts 16 --dtype bf16 \
            --skew uniform --schedule direct,two-level,rail --iters 100 --warmup 10 --json 2>/dev/null | sed "s/^/$tag /"
        for coll in allreduce alltoall allgather; do
            run "$bin" bench $coll -b 8 -e 1M -f 8 --iters 200 --warmup 10 --no-check --json 2>/dev/null | sed "s/^/$tag /"
        done
    done
done >"$raw"
python3 - "$raw" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    tag, rest = line.split(" ", 1)
    js = rest.split("] ", 1)[-1]
    if not js.startswith("{"):
        continue
    r = json.loads(js)
    if r.get("bench") == "moe":
        for phase in ("dispatch", "combine"):
            d[(f"moe {r['requested']} {phase}", r["tokens"], tag)].append(r[f"{phase}_median_us"])
    else:
        d[(r["coll"], r["bytes"], tag)].append(r["median_us"])
print(f"{'what':>26} {'size':>8} {'base us':>10} {'new us':>10} {'new/base':>8}")
for what, size in sorted({k[:2] for k in d}):
    a, b = st.median(d[(what, size, "base")]), st.median(d[(what, size, "new")])
    unit = "tokens" if what.startswith("moe") else "B"
    print(f"{what:>26} {size:>8} {a:10.1f} {b:10.1f} {b / a:8.2f}  ({unit})")
PY
