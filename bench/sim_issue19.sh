#!/usr/bin/env bash
# Issue 19, item 4: the simulator at 16,384 and 100,000 ranks for any byte
# count (release build). One line per run: the wall time and peak resident
# memory of the whole process (/usr/bin/time -v), the simulated time, the
# events the engine processed and how the run was aggregated (kind/period,
# and the block sizes when they are uneven), or the start of its error.
#
#   * the issue's 16,384-rank ring in full mode: refused with its estimate;
#   * --aggregate: ring, direct, hier allreduce, pairwise reducescatter,
#     butterfly allreduce (xor-aggregated at 16,384; 100,000 is not a power
#     of two, so there it runs in full mode) on switch, fat-tree (2:1) and
#     two-level, 256 MB, 64 MB and 1,000,003 B;
#   * tree and double binary tree allreduce at 16,384 ranks in full mode.
#
# Usage: bash bench/sim_issue19.sh [timeout seconds per run, default 300]
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-300}
nice -n 10 cargo build --release -q -p ferrocoll-cli
fc=target/release/ferrocoll
echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-13s %-9s %-8s %-8s %9s %8s %12s %11s  %s\n' \
  ranks coll algo topology bytes wall_s rss_MB time_us events how
run() {
  local topo=$1 coll=$2 algo=$3 bytes=$4; shift 4
  local kind=${topo%%:*} n out wall rss
  n=$(sed -E 's/.*ranks=([0-9]+).*/\1/; s/.*nodes=([0-9]+),gpus=([0-9]+).*/\1*\2/' <<<"$topo")
  n=$((n))
  out=$( { timeout "$limit" /usr/bin/time -v "$fc" sim "$coll" --topology "$topo" --bytes "$bytes" \
           --algo "$algo" --mode contention --json "$@"; } 2>&1 ) || true
  # A run that timeout killed has no figures from time.
  wall=$(grep 'Elapsed (wall clock)' <<<"$out" | awk '{print $NF}' | awk -F: '{ if (NF == 3) print $1*3600+$2*60+$3; else print $1*60+$2 }' || true)
  rss=$(grep 'Maximum resident' <<<"$out" | awk '{printf "%.0f", $NF/1024}' || true)
  local line
  line=$(grep '^{' <<<"$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
a = j["aggregated"]
how = "full" if a is None else "%s/%d" % (a["kind"], a["period"])
if a is not None and a["uneven"] is not None:
    how += " uneven %s" % "/".join(str(e) for e in a["uneven"]["block_elements"])
print("%12.1f %11d  %s" % (j["time_us"], j["events"], how))' 2>/dev/null) ||
    line=$(printf '%12s %11s  %s' - - "$(grep -m1 -o 'error: .*' <<<"$out" | cut -c1-150 || echo "killed after ${limit} s")")
  printf '%-6s %-13s %-9s %-8s %-8s %9s %8s %s\n' "$n" "$coll" "$algo" "$kind" "$bytes" "${wall:-$limit}" "${rss:--}" "$line"
}
# The issue's command, as it was (grew to 24 GB and was killed after 105 s).
run switch:ranks=16384,bw=50GB/s,lat=2us allreduce ring 256MB
# 256 MB, 64 MB and 1,000,003 B split unevenly over 16,384 ranks; over
# 100,000 the first two split evenly (640 and 160 elements), so 256 MiB
# and 64 MiB (671.1 and 167.8) are run there too.
for n in 16384 100000; do
  sw="switch:ranks=$n,bw=50GB/s,lat=2us"
  ft="fat-tree:ranks=$n,leaf=32,bw=50GB/s,lat=1us,oversub=2"
  tl="two-level:nodes=$((n / 8)),gpus=8,intra=450GB/s@1us,inter=50GB/s@2us"
  sizes="256MB 64MB 1000003"
  [ "$n" = 100000 ] && sizes="256MB 256MiB 64MB 64MiB 1000003"
  for topo in "$sw" "$ft" "$tl"; do
    for bytes in $sizes; do
      run "$topo" allreduce ring "$bytes" --aggregate
      run "$topo" allreduce direct "$bytes" --aggregate
      run "$topo" allreduce hier "$bytes" --aggregate
      run "$topo" reducescatter pairwise "$bytes" --aggregate
      # 16,384 is a power of two: exclusive-or symmetry. 100,000 is not:
      # the extra ranks' pre/post step breaks every symmetry, full mode
      # (the butterfly moves whole vectors, so MiB and MB alike).
      if [ "$n" = 16384 ]; then
        run "$topo" allreduce butterfly "$bytes" --aggregate
      elif [ "${bytes%MiB}" = "$bytes" ]; then
        run "$topo" allreduce butterfly "$bytes"
      fi
    done
  done
done
# Trees: no shift symmetry, O(N log N) messages, full mode.
for topo in switch:ranks=16384,bw=50GB/s,lat=2us \
            fat-tree:ranks=16384,leaf=32,bw=50GB/s,lat=1us,oversub=2 \
            two-level:nodes=2048,gpus=8,intra=450GB/s@1us,inter=50GB/s@2us; do
  for bytes in 256MB 64MB 1000003; do
    run "$topo" allreduce tree "$bytes"
    run "$topo" allreduce dbtree "$bytes"
  done
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
