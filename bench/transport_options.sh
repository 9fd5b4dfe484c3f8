#!/usr/bin/env bash
# The process transports' options, measured against each other in one run
# (f32 sum allreduce, 2 ranks; busbw in GB/s per size, or mean/median us):
#   pinning (FERROCOLL_BIND) on 8 B latency, shm and tcp
#   the shared-memory fast path for small calls (FERROCOLL_SHM_FAST=auto/off)
#   on 8 B latency, 2 and 4 ranks, next to Open MPI's (when mpirun is there)
#   single-copy path (FERROCOLL_SHM_SINGLE_COPY=on/off) on shm bandwidth
#   TCP streams per peer (FERROCOLL_TCP_STREAMS) on tcp bandwidth
#   checksums (FERROCOLL_CHECKSUM=1, CRC32C per message) on shm and tcp
# Usage: bash bench/transport_options.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
fc=target/release/ferrocoll
row() { python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
name = sys.argv[1]
if len(rows) == 1:
    r = rows[0]
    print("%-34s mean %.2f us, median %.2f us" % (name, r["time_us"], r["median_us"]))
else:
    print("%-34s %s" % (name, " ".join("%dK:%.1f" % (r["bytes"] >> 10, r["busbw"]) for r in rows)))
' "$1"; }
echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
echo "## 8 B allreduce, 2 ranks, 20000 calls"
for t in shm tcp; do
  for b in auto none; do
    FERROCOLL_BIND=$b "$fc" bench allreduce --transport $t -n 2 -b 8 -e 8 --iters 20000 --warmup 100 --json | row "$t FERROCOLL_BIND=$b"
  done
done
echo "## 8 B allreduce, shm: small-call fast path on and off (20000 calls; 4 ranks share the cores: 5000)"
for n in 2 4; do
  calls=$((n == 2 ? 20000 : 5000))
  for f in auto off; do
    FERROCOLL_SHM_FAST=$f "$fc" bench allreduce --transport shm -n $n -b 8 -e 8 --iters $calls --warmup 200 --json | row "shm n=$n FERROCOLL_SHM_FAST=$f"
  done
  peers=${PEERS:-../shared/peers}
  if command -v mpirun >/dev/null && [[ -f $peers/run_peers.sh ]]; then
    bash "$peers/run_peers.sh" allreduce $n 8 8 2 openmpi 2>/dev/null | python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())
print("%-34s mean %.2f us (1000 calls)" % (sys.argv[1], r["time_us"]))
' "Open MPI n=$n"
  fi
done
echo "## busbw GB/s, ring, 2 ranks (size in KiB)"
for sc in off on; do
  FERROCOLL_SHM_SINGLE_COPY=$sc "$fc" bench allreduce --algo ring --transport shm -n 2 -b 512K -e 64M -f 2 --iters 20 --warmup 3 --json | row "shm FERROCOLL_SHM_SINGLE_COPY=$sc"
done
for k in 1 2 4; do
  FERROCOLL_TCP_STREAMS=$k "$fc" bench allreduce --algo ring --transport tcp -n 2 -b 512K -e 64M -f 2 --iters 20 --warmup 3 --json | row "tcp FERROCOLL_TCP_STREAMS=$k"
done
echo "## checksums: busbw GB/s, auto algorithm, 2 ranks (size in KiB), off then on"
for t in shm tcp; do
  for c in 0 1; do
    FERROCOLL_CHECKSUM=$c "$fc" bench allreduce --transport $t -n 2 -b 64K -e 64M -f 4 --iters 20 --warmup 3 --json | row "$t FERROCOLL_CHECKSUM=$c"
  done
done
