#!/usr/bin/env bash
# ferrocoll's process transports next to the peers, in one run, as ratios
# (issue 4's targets, f32 sum allreduce):
#   shm, 2 ranks   vs Open MPI (shared memory): busbw >= 2x from 512 KiB to 64 MiB; 8 B latency <= Open MPI's
#                  (per-call p50 of 200,000 calls, bench/latency.sh, the same loop for both)
#   shm, 4 ranks   (oversubscribed on 2 cores): 8 B median <= 50 us; 16 MiB busbw >= 1 GB/s
#   tcp, 2 ranks   vs torch.distributed gloo (TCP loopback): busbw >= 2x from 1 MiB; 8 B latency <= 1/10 of gloo's
# and the machine's limit: single-core memcpy bandwidth, measured here.
# shm with 2 ranks runs twice: buffers on the heap (Vec), and buffers from
# ferrocoll::SharedBuffer (bench --buffers shared), which peers read in place.
#
# Usage: bash bench/compare.sh [MAXBYTES]   (default 64 MiB)
# Needs the peers of ../shared/peers (run_peers.sh installs Open MPI from Debian
# and torch into a venv on first use: a large download). The cost-model profiles
# for shm and tcp are calibrated first (ferrocoll calibrate), so `auto` chooses
# with this machine's numbers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peers=${PEERS:-$here/../../shared/peers}
hi=${1:-67108864}
cd "$here/.."
cargo build --release -q
fc=target/release/ferrocoll
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
for tn in shm:2 shm:4 tcp:2; do
  t=${tn%:*}; n=${tn#*:}
  "$fc" calibrate --transport "$t" -n "$n" -e 16M --out "$tmp/$t$n.json" 2>/dev/null | grep '^# fit' | sed "s/^# /# calibrate $t, $n ranks: /"
done

# Machine limit: bench prints memcpy bandwidth of its largest size on one thread.
limit=$("$fc" bench allreduce -n 1 -b 16M -e 16M --iters 1 --warmup 0 | sed -n 's/.*on one thread \([0-9.]*\) GB\/s.*/\1/p')
echo "# machine limit: single-thread memcpy of 16 MiB = $limit GB/s"

run_fc() { # transport ranks out [bench options]
  FERROCOLL_PROFILE="$tmp/$1$2.json" "$fc" bench allreduce --transport "$1" -n "$2" -b 8 -e "$hi" -f 2 \
    --iters 20 --warmup 5 --json "${@:4}" >"$3"
}
run_fc shm 2 "$tmp/shm2"
run_fc shm 2 "$tmp/shm2s" --buffers shared
run_fc shm 4 "$tmp/shm4"
run_fc tcp 2 "$tmp/tcp2"
bash "$peers/run_peers.sh" allreduce 2 8 "$hi" 2 openmpi >"$tmp/ompi2" 2>"$tmp/ompi.err" || { cat "$tmp/ompi.err" >&2; exit 1; }
bash "$peers/run_peers.sh" allreduce 4 8 "$hi" 2 openmpi >"$tmp/ompi4" 2>>"$tmp/ompi.err" || { cat "$tmp/ompi.err" >&2; exit 1; }
bash "$peers/run_peers.sh" allreduce 2 8 "$hi" 2 gloo >"$tmp/gloo2" 2>"$tmp/gloo.err" || { cat "$tmp/gloo.err" >&2; exit 1; }
# The 2-rank shm latency target is judged per call, with the same timing loop
# for both libraries (bench/latency.sh: 200,000 calls, percentiles): the
# bench's 20-call means above catch a neighbour's preemption as often as not.
bash bench/latency.sh 1 2 200000 >"$tmp/latency" 2>"$tmp/latency.err" || { cat "$tmp/latency.err" >&2; exit 1; }

python3 - "$tmp" "$limit" <<'PY'
import json, sys, os
tmp, limit = sys.argv[1], float(sys.argv[2])
def load(name):
    rows = {}
    for line in open(os.path.join(tmp, name)):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            if "bytes" in r:
                rows[r["bytes"]] = r
    return rows

verdicts = []
def table(title, fc, peer, peer_name, bw_from, bw_ratio, lat_ratio):
    print(f"\n## {title}")
    print(f"# {'bytes':>10} {'algo':>10} {'fc us':>9} {'fc med':>8} {'fc busbw':>9} {peer_name+' us':>10} "
          f"{peer_name+' busbw':>11} {'busbw x':>8} {'fc/limit':>8}")
    bw_ok, worst = True, float("inf")
    for b in sorted(set(fc) & set(peer)):
        f, p = fc[b], peer[b]
        ratio = f["busbw"] / p["busbw"] if p["busbw"] > 0 else float("inf")
        print(f"  {b:>10} {f['algo']:>10} {f['time_us']:>9.1f} {f['median_us']:>8.1f} {f['busbw']:>9.2f} "
              f"{p['time_us']:>10.1f} {p['busbw']:>11.2f} {ratio:>8.2f} {f['busbw'] / limit:>8.3f}")
        if b >= bw_from:
            if ratio < bw_ratio:
                bw_ok = False
            worst = ratio if worst is None else min(worst, ratio)
    verdicts.append(f"{title}: busbw >= {bw_ratio}x {peer_name} from {bw_from} B: "
                    f"{'met' if bw_ok else 'MISSED'} (worst {worst:.2f}x)")
    if lat_ratio is None:
        return
    small = min(set(fc) & set(peer))
    lat = fc[small]["time_us"] / peer[small]["time_us"]
    verdicts.append(f"{title}: {small} B latency {fc[small]['time_us']:.2f} us vs {peer[small]['time_us']:.2f} us "
                    f"= {lat:.3f} of {peer_name}'s (target <= {lat_ratio}): {'met' if lat <= lat_ratio else 'MISSED'}")

table("shm, 2 ranks, vs Open MPI", load("shm2"), load("ompi2"), "ompi", 512 << 10, 2.0, None)
table("shm, 2 ranks, SharedBuffer, vs Open MPI", load("shm2s"), load("ompi2"), "ompi", 512 << 10, 2.0, None)
print("\n## 8 B allreduce per call, 2 ranks, shm (bash bench/latency.sh 1 2 200000)")
p50 = {}
for line in open(os.path.join(tmp, "latency")):
    print("  " + line.rstrip())
    key = "fast" if line.startswith("FERROCOLL_SHM_FAST=auto") else "ompi" if line.startswith("Open MPI") else None
    if key and " p50 " in line:
        p50[key] = float(line.split(" p50 ")[1].split()[0])
if "fast" in p50 and "ompi" in p50:
    r = p50["fast"] / p50["ompi"]
    verdicts.append(f"shm, 2 ranks: 8 B latency p50 {p50['fast']:.3f} us vs Open MPI {p50['ompi']:.3f} us "
                    f"= {r:.3f} of ompi's (target <= 1.0): {'met' if r <= 1.0 else 'MISSED'}")
table("tcp, 2 ranks, vs gloo", load("tcp2"), load("gloo2"), "gloo", 1 << 20, 2.0, 0.1)
shm4, ompi4 = load("shm4"), load("ompi4")
table("shm, 4 ranks (oversubscribed), vs Open MPI, for reference", shm4, ompi4, "ompi", 1 << 62, 0.0, float("inf"))
verdicts = [v for v in verdicts if "4 ranks" not in v]
med = shm4[min(shm4)]["median_us"]
verdicts.append(f"shm, 4 ranks: 8 B median {med:.1f} us (target <= 50): {'met' if med <= 50 else 'MISSED'}")
big = shm4.get(16 << 20)
if big:
    verdicts.append(f"shm, 4 ranks: 16 MiB busbw {big['busbw']:.2f} GB/s (target >= 1): {'met' if big['busbw'] >= 1 else 'MISSED'}")
print("\n## Targets")
for v in verdicts:
    print("  " + v)
PY
