#!/usr/bin/env bash
# Allreduce across 2 hosts x 2 ranks on the namespace cluster
# (bench/cluster.sh), for each link rate: busbw of hier, ring and auto
# (after `ferrocoll calibrate` on the same cluster) and of torch gloo, from
# 64 KiB to 256 MiB, next to the link's limit; then the bytes hier puts on a
# host's uplink (tc's counters) against the seeds' formula. Root only.
#
#   bench/multihost.sh [RATE...]     (default: 1gbit 5gbit)
#
# PEER_VENV: a venv with torch for the gloo column (default .venv; none: skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${*:-1gbit 5gbit}
BIN=target/release/ferrocoll
PY=${PEER_VENV:-.venv}/bin/python
NAME=fcb
cargo build --release -q -p ferrocoll-cli
OUT=$(mktemp -d)
trap 'bench/cluster.sh down --name $NAME; rm -rf "$OUT"' EXIT
HOSTS="${NAME}h0:2,${NAME}h1:2"
run() { "$BIN" run --quiet-others --hosts "$HOSTS" --agent "bench/cluster.sh exec" -- "$@"; }
uplink_bytes() {
    ip netns exec "${NAME}h0" tc -s qdisc show dev eth0 | awk '/Sent/ {print $2; exit}'
}
for rate in $RATES; do
    bench/cluster.sh down --name $NAME
    bench/cluster.sh up --name $NAME --hosts 2 --rate "$rate" --subnet 40 >/dev/null
    echo "== $rate: calibrating" >&2
    run "$BIN" calibrate -e 16M --repeat 2 --out "$OUT/profile.json" >"$OUT/calibrate.txt" 2>&1
    grep -E "^\[0\] # (fit|intra|inter)" "$OUT/calibrate.txt" | sed 's/^\[0\] //'
    for algo in hier ring auto; do
        echo "== $rate: $algo" >&2
        FERROCOLL_PROFILE="$OUT/profile.json" run "$BIN" bench allreduce -b 64K -e 256M -f 4 \
            --iters 3 --warmup 1 --json --algo "$algo" | sed 's/^\[0\] //' >"$OUT/$algo.json"
    done
    if [ -x "$PY" ]; then
        echo "== $rate: gloo" >&2
        # gloo finds its own address from the interface, not the host name.
        GLOO_SOCKET_IFNAME=eth0 run "$PY" bench/multihost_gloo.py 65536 268435456 4 | sed 's/^\[0\] //' >"$OUT/gloo.json"
    else
        echo "no $PY: gloo skipped" >&2
        : >"$OUT/gloo.json"
    fi
    # hier's bytes through host 0's uplink: 10 calls of 64 MiB.
    before=$(uplink_bytes)
    FERROCOLL_PROFILE="$OUT/profile.json" run "$BIN" bench allreduce -b 64M -e 64M --iters 10 \
        --warmup 0 --no-check --algo hier >/dev/null
    after=$(uplink_bytes)
    python3 - "$OUT" "$rate" "$before" "$after" <<'PY'
import json, re, sys
out, rate, before, after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(name):
    rows = {}
    for line in open(f"{out}/{name}.json"):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["bytes"]] = r
    return rows
hier, ring, auto, gloo = (load(n) for n in ("hier", "ring", "auto", "gloo"))
m = re.match(r"(\d+)([kmg]?)bit", rate)
bits = int(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
n, g = 4, 2
# hier's inter-host phase moves 2(G-1)/G of the buffer through each host's
# link: busbw = 2(n-1)/n * M / t is at most this.
limit = 2 * (n - 1) / n * bits / 8 / (2 * (g - 1) / g) / 1e9
print(f"# allreduce, 2 hosts x 2 ranks, links {rate}; busbw GB/s; limit {limit:.3f} GB/s (hier, inter-host bytes only)")
print(f"{'bytes':>10} {'hier':>8} {'ring':>8} {'auto':>8} {'auto_algo':>10} {'gloo':>8} {'auto/limit':>10} {'auto/gloo':>9} {'wrong':>5}")
for b in sorted(auto):
    a = auto[b]
    gl = gloo.get(b, {}).get("busbw")
    wrong = sum(int(t.get(b, {}).get("wrong") or 0) for t in (hier, ring, auto, gloo))
    print(f"{b:>10} {hier.get(b, {}).get('busbw', 0):>8.3f} {ring.get(b, {}).get('busbw', 0):>8.3f} "
          f"{a['busbw']:>8.3f} {a['algo']:>10} {gl if gl is not None else float('nan'):>8.3f} "
          f"{a['busbw'] / limit:>10.2f} {a['busbw'] / gl if gl else float('nan'):>9.2f} {wrong:>5}")
M, calls = 64 << 20, 10
formula = calls * 2 * (g - 1) / g * M  # per host, one direction: M/L per rank, L ranks
print(f"# hier uplink bytes of host 0 for {calls} x 64 MiB (tc counter, IP packets): {after - before}; "
      f"seeds' formula 2(G-1)/G * M per call: {formula:.0f}; ratio {(after - before) / formula:.4f} "
      f"(TCP/IP headers and ferrocoll's 64-byte frame headers are the excess)")
PY
done
