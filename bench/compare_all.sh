#!/usr/bin/env bash
# Every collective next to the peers, in one run, as busbw ratios (issue 20):
#   allreduce, allgather, reducescatter, alltoall, bcast, reduce (f32, sum,
#   sizes as nccl-tests counts them, `ferrocoll bench`'s --help says how)
#   shm, 2 ranks and 4 ranks (4 on 2 cores: oversubscribed) vs Open MPI (shared memory)
#   tcp, 2 ranks                                              vs torch.distributed gloo (TCP loopback)
# with a verdict per target: ferrocoll's busbw >= 1.0x Open MPI at every size
# (shm), >= 2x gloo at every size from 1 MiB (tcp).
# The tcp tables also show busbw as a fraction of what one loopback TCP stream
# carries, measured before and after them by bench/tcp_stream.c (4 MiB writes,
# ferrocoll's socket buffers; the larger of the two runs counts): one
# direction for bcast and reduce (only the root sends), each direction of
# both at once for the others (every rank sends and receives; on 2 ranks
# busbw is then the bytes per second each way).
#
# bcast is timed in place (`--in-place`), as both peers' broadcasts are; the
# other collectives out of place, as the peers time them.
#
# Iterations follow the peers' benchmarks (1000 calls below 64 KiB, 100 below
# 4 MiB, 10 above; 5 warm-up calls), so both sides average over as many calls.
# The peers run from bench/peer_mpi_coll.c and bench/peer_gloo_coll.py, copies
# of ../shared/peers' with `reduce` added.
#
# Usage: bash bench/compare_all.sh [MAXBYTES] [FACTOR]   (default 64M 2)
#   COLLS="allreduce bcast" limits the collectives; CONFIGS="shm:2 tcp:2" the
#   configurations; PEER_VENV is a venv with torch (default /tmp/venv, else
#   /tmp/peer-venv, created by ../shared/peers/run_peers.sh); RAW=DIR keeps the
#   raw JSON lines there. ROUNDS=R (default 1) runs ferrocoll and the peer in
#   turn R times per table and reports, per size and side, the round with the
#   median time (both sides alike): on a VM whose speed drifts, one round's
#   small sizes can be 10-100x off either way. With R > 1 a `paired x` column
#   beside it gives each size's median over the rounds of that round's ratio
#   (the two sides of a round ran one right after the other), and each
#   verdict line how many sizes that puts under the target: an aside, the
#   verdict stays on the median rounds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
hi=${1:-64M}
factor=${2:-2}
colls=${COLLS:-allreduce allgather reducescatter alltoall bcast reduce}
configs=${CONFIGS:-shm:2 shm:4 tcp:2}
venv=${PEER_VENV:-/tmp/venv}
rounds=${ROUNDS:-1}
[[ -x $venv/bin/python ]] || venv=/tmp/peer-venv
hi_bytes=$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$hi")

cargo build --release -q -p ferrocoll-cli
fc=target/release/ferrocoll
tmp=${RAW:-$(mktemp -d)}
mkdir -p "$tmp"
[[ -n ${RAW:-} ]] || trap 'rm -rf "$tmp"' EXIT

need_mpi=0; need_gloo=0
for c in $configs; do [[ $c == shm:* ]] && need_mpi=1; [[ $c == tcp:* ]] && need_gloo=1; done
if ((need_mpi)); then
  command -v mpicc >/dev/null || { echo "compare_all.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev, or run ../shared/peers/run_peers.sh once)" >&2; exit 1; }
  mpicc -O2 -o "$tmp/mpi_coll" bench/peer_mpi_coll.c
fi
if ((need_gloo)); then
  "$venv/bin/python" -c 'import torch' 2>/dev/null || { echo "compare_all.sh: needs a venv with torch in PEER_VENV (../shared/peers/run_peers.sh makes /tmp/peer-venv)" >&2; exit 1; }
  cc -O2 -pthread -o "$tmp/tcp_stream" bench/tcp_stream.c
fi
# Runs bench/tcp_stream.c once, prints its lines and keeps "ONE BOTH_A BOTH_B"
# (GB/s) in the file $1.
stream_limit() {
  "$tmp/tcp_stream" 1 >"$1.txt"
  cat "$1.txt"
  sed -n 's/.*: \([0-9.]*\)\( + \([0-9.]*\)\)\{0,1\} GB\/s.*/\1 \3/p' "$1.txt" | tr '\n' ' ' >"$1"
}

echo "# commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
limit=$("$fc" bench allreduce -n 1 -b 16M -e 16M --iters 1 --warmup 0 | sed -n 's/.*on one thread \([0-9.]*\) GB\/s.*/\1/p')
echo "# machine limit: single-thread memcpy of 16 MiB = $limit GB/s"
((rounds > 1)) && echo "# $rounds rounds, ferrocoll and the peer in turn; per size and side the round with the median time"
: >"$tmp/stream_before"; : >"$tmp/stream_after"
if ((need_gloo)); then stream_limit "$tmp/stream_before"; fi

# The size bands of the peers' iteration counts, clipped to [8, hi].
bands() {
  local lo=8 b
  for b in "65536:1000" "4194304:100" "$((hi_bytes * 2)):10"; do
    local top=${b%:*} it=${b#*:} e=$lo
    ((lo > hi_bytes)) && break
    while ((e * factor < top && e * factor <= hi_bytes)); do e=$((e * factor)); done
    echo "$lo $e $it"
    lo=$((e * factor))
  done
}

for coll in $colls; do
  for cfg in $configs; do
    t=${cfg%:*}; n=${cfg#*:}
    for ((round = 0; round < rounds; round++)); do
      out="$tmp/fc_${coll}_${t}${n}.r$round"
      : >"$out"
      # MPI_Bcast and torch's broadcast are in place (one buffer): time ours
      # in place too, or ferrocoll's root pays a copy of input to output
      # that the peers never make (about half the time from 2 MiB up).
      form=()
      [[ $coll == bcast ]] && form=(--in-place)
      while read -r lo e it; do
        "$fc" bench "$coll" --transport "$t" -n "$n" -b "$lo" -e "$e" -f "$factor" \
          --iters "$it" --warmup 5 --no-check --json "${form[@]}" >>"$out"
      done < <(bands)
      peer="$tmp/peer_${coll}_${t}${n}.r$round"
      : >"$peer"
      if [[ $t == shm ]]; then
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$n" --oversubscribe \
          "$tmp/mpi_coll" "$coll" 8 "$hi_bytes" "$factor" >"$peer" 2>"$peer.err" || { cat "$peer.err" >&2; exit 1; }
      else
        port=$((20000 + RANDOM % 20000)); pids=()
        for ((r = 0; r < n; r++)); do
          RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$venv/bin/python" bench/peer_gloo_coll.py "$coll" 8 "$hi_bytes" "$factor" >>"$peer" 2>"$peer.err.$r" &
          pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || { cat "$peer".err.* >&2; exit 1; }; done
      fi
    done
  done
done

if ((need_gloo)); then stream_limit "$tmp/stream_after"; fi

python3 - "$tmp" "$limit" "$colls" "$configs" "$(cat "$tmp/stream_before")" "$(cat "$tmp/stream_after")" "$rounds" <<'PY'
import json, os, sys
tmp, limit, colls, configs = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
rounds = int(sys.argv[7])
# The stream limits, the larger of the runs before and after: one direction,
# and each direction of both at once (their mean).
runs = [[float(x) for x in r.split()] for r in sys.argv[5:7] if r.split()]
one_way = max((r[0] for r in runs), default=0.0)
both_ways = max(((r[1] + r[2]) / 2 for r in runs if len(r) == 3), default=0.0)
if runs:
    print(f"\n# tcp stream limit (larger of before/after): one direction {one_way:.2f} GB/s, "
          f"each direction of both at once {both_ways:.2f} GB/s")

def rounds_of(name):
    """Per size, each round's record by round number, from the files
    name.r0, name.r1, ..."""
    rounds = {}
    i = 0
    while os.path.exists(path := os.path.join(tmp, f"{name}.r{i}")):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if "bytes" in r:
                    rounds.setdefault(r["bytes"], {})[i] = r
        i += 1
    return rounds

def median_rounds(rounds):
    """Per size, the record of the round with the median time (the lower
    middle of an even count)."""
    return {b: sorted(rs.values(), key=lambda r: r["time_us"])[(len(rs) - 1) // 2]
            for b, rs in rounds.items()}

def paired(fc_rounds, peer_rounds):
    """Per size, the median over the rounds of each round's busbw ratio:
    ferrocoll and the peer of one round ran one right after the other, so
    a drift of the machine's speed between rounds cancels out of it (an
    aside beside the verdict, which stays on the median rounds)."""
    out = {}
    for b in set(fc_rounds) & set(peer_rounds):
        ratios = sorted(fc_rounds[b][i]["busbw"] / peer_rounds[b][i]["busbw"]
                        for i in set(fc_rounds[b]) & set(peer_rounds[b]) if peer_rounds[b][i]["busbw"] > 0)
        if ratios:
            out[b] = ratios[(len(ratios) - 1) // 2]
    return out

verdicts = []
for coll in colls:
    for cfg in configs:
        t, n = cfg.split(":")
        fc_rounds, peer_rounds = rounds_of(f"fc_{coll}_{t}{n}"), rounds_of(f"peer_{coll}_{t}{n}")
        fc, peer = median_rounds(fc_rounds), median_rounds(peer_rounds)
        pair = paired(fc_rounds, peer_rounds)
        name, want, start = ("ompi", 1.0, 0) if t == "shm" else ("gloo", 2.0, 1 << 20)
        stream = (one_way if coll in ("bcast", "reduce") else both_ways) if t == "tcp" else 0.0
        print(f"\n## {coll}, {t}, {n} ranks, vs {name}")
        if stream > 0:
            which = "one direction" if coll in ("bcast", "reduce") else "each direction of both at once"
            print(f"# stream: {which} of one loopback TCP stream, {stream:.2f} GB/s")
        print(f"# {'bytes':>10} {'algo':>10} {'fc us':>10} {'fc busbw':>9} {name + ' us':>10} "
              f"{name + ' busbw':>11} {'busbw x':>8} {'fc/limit':>8}"
              + (f" {'fc/stream':>9} {name + '/stream':>11}" if stream > 0 else "")
              + (f" {'paired x':>8}" if rounds > 1 else ""))
        misses, worst, short, lowest, paired_misses = [], None, [], None, []
        for b in sorted(set(fc) & set(peer)):
            f, p = fc[b], peer[b]
            ratio = f["busbw"] / p["busbw"] if p["busbw"] > 0 else float("inf")
            mark = ""
            if b >= start:
                if ratio < want:
                    misses.append(b)
                    mark = " <"
                worst = ratio if worst is None else min(worst, ratio)
                if stream > 0:
                    of_stream = f["busbw"] / stream
                    if of_stream < 0.7:
                        short.append(b)
                    lowest = of_stream if lowest is None else min(lowest, of_stream)
            tail = f" {f['busbw'] / stream:>9.2f} {p['busbw'] / stream:>11.2f}" if stream > 0 else ""
            if rounds > 1:
                tail += f" {pair.get(b, float('nan')):>8.2f}"
                if b >= start and pair.get(b, want) < want:
                    paired_misses.append(b)
            print(f"  {b:>10} {f['algo']:>10} {f['time_us']:>10.1f} {f['busbw']:>9.3f} {p['time_us']:>10.1f} "
                  f"{p['busbw']:>11.3f} {ratio:>8.2f} {f['busbw'] / limit:>8.3f}{tail}{mark}")
        where = "every size" if start == 0 else f"every size >= {start} B"
        if worst is None:
            verdicts.append(f"{coll:>13} {t} {n}: no measured size in the target's range")
            continue
        verdict = "met" if not misses else f"MISSED at {len(misses)} sizes ({', '.join(str(m) for m in misses)})"
        aside = f" (paired rounds: under {want}x at {len(paired_misses)} sizes)" if rounds > 1 else ""
        verdicts.append(f"{coll:>13} {t} {n}: busbw >= {want}x {name} at {where}: {verdict}; worst {worst:.2f}x{aside}")
        if lowest is not None:
            verdict = "met" if not short else f"MISSED at {len(short)} sizes ({', '.join(str(m) for m in short)})"
            verdicts.append(f"{coll:>13} {t} {n}: busbw >= 0.7x the stream at {where}: {verdict}; lowest {lowest:.2f}x")

print("\n## Targets")
for v in verdicts:
    print("  " + v)
PY
