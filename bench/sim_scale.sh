#!/usr/bin/env bash
# The simulator at scale (issue 6's speed goals), release build: full runs
# (every rank's plan, message by message) up to 16,384 ranks, and the
# aggregated mode (one rank per class of identical ranks) up to 131,072.
# Prints one line per run: the run's own wall time (`wall_s`, from the
# JSON) and the peak resident memory of the process (/usr/bin/time %M).
# Usage: bash bench/sim_scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=target/release/ferrocoll
echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
printf '%-10s %-9s %-62s %-16s %7s %12s %11s %9s %9s\n' coll algo topology bytes ranks time_us events wall_s max_rss
run() {
  local coll=$1 algo=$2 topo=$3 bytes=$4; shift 4
  local out rss
  out=$( { /usr/bin/time -f 'RSS %M' "$fc" sim "$coll" --topology "$topo" --bytes "$bytes" --algo "$algo" --json "$@"; } 2>&1 )
  rss=$(grep '^RSS' <<<"$out" | awk '{printf "%.0fMB", $2/1024}')
  grep '^{' <<<"$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
agg = j.get("aggregated")
tag = "" if agg is None else " (aggregated, %s by %d)" % (agg["kind"], agg["period"])
print("%-10s %-9s %-62s %-16s %7d %12.1f %11d %9.2f %9s%s" % (j["coll"], j["algo"], sys.argv[1], sys.argv[2], j["ranks"], j["time_us"], j["events"], j["wall_s"], sys.argv[3], tag))
' "$topo" "$bytes" "$rss"
}
# Full runs.
run allreduce ring switch:ranks=1024,bw=50GB/s,lat=2us 64MiB
run allreduce ring switch:ranks=4096,bw=50GB/s,lat=2us 64MiB
run allreduce butterfly switch:ranks=16384,bw=50GB/s,lat=2us 64MiB
run allreduce hier two-level:nodes=2048,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us 64MiB --mode ideal
# The same calls aggregated, then far larger clusters.
run allreduce ring switch:ranks=1024,bw=50GB/s,lat=2us 64MiB --aggregate
run allreduce ring switch:ranks=4096,bw=50GB/s,lat=2us 64MiB --aggregate
run allreduce butterfly switch:ranks=16384,bw=50GB/s,lat=2us 64MiB --aggregate
run allreduce ring switch:ranks=16384,bw=50GB/s,lat=2us 64MiB --aggregate
run allreduce ring switch:ranks=100000,bw=50GB/s,lat=2us 64MB --aggregate
run allreduce hier two-level:nodes=12500,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us 64MB --aggregate
run allreduce ring rail:nodes=12500,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us 64MB --aggregate
run allreduce butterfly switch:ranks=131072,bw=50GB/s,lat=2us 64MiB --aggregate
run alltoall direct fat-tree:ranks=131072,leaf=32,bw=50GB/s,lat=1us,oversub=2 512MiB --aggregate
