#!/usr/bin/env bash
# Every collective next to the peers, in one run, as busbw ratios (issue 20):
#   allreduce, allgather, reducescatter, alltoall, bcast, reduce (f32, sum,
#   sizes as nccl-tests counts them, `ferrocoll bench`'s --help says how)
#   shm, 2 ranks and 4 ranks (4 on 2 cores: oversubscribed) vs Open MPI (shared memory)
#   tcp, 2 ranks                                              vs torch.distributed gloo (TCP loopback)
# with a verdict per target: ferrocoll's busbw >= 1.0x Open MPI at every size
# (shm), >= 2x gloo at every size from 1 MiB (tcp), and for the 2-rank shm
# allreduce (heap buffers, as every table here) >= 2x Open MPI from 512 KiB.
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
#   verdict stays on the median rounds. RECHECK=K (K >= 6; 9 is a good
#   choice) then runs every size under its target again, alone, K times,
#   the two sides one right after the other, and gives it a second verdict
#   on the median of those K paired ratios, with a sign test that says
#   whether the rounds can tell it from the target at all (below K = 6 no
#   split of the rounds reaches p < 0.05). A tcp size under 0.7x the
#   stream is rechecked against runs of bench/tcp_stream.c the same way.
#   RECHECK_ONLY=1 with RAW=DIR of an earlier run (same COLLS, CONFIGS,
#   ROUNDS) reports it again and runs (or goes on with) its recheck.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
hi=${1:-64M}
factor=${2:-2}
colls=${COLLS:-allreduce allgather reducescatter alltoall bcast reduce}
configs=${CONFIGS:-shm:2 shm:4 tcp:2}
venv=${PEER_VENV:-/tmp/venv}
rounds=${ROUNDS:-1}
if [[ -n ${RECHECK:-} ]] && ((RECHECK > 0 && RECHECK < 6)); then
  echo "compare_all.sh: RECHECK=$RECHECK is too few rounds for the sign test to tell anything (use 6 or more, e.g. 9)" >&2
  exit 2
fi
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
# A recheck of an earlier run reports that run's limit again.
if [[ -n ${RECHECK_ONLY:-} && -s $tmp/limit ]]; then
  limit=$(cat "$tmp/limit")
else
  limit=$("$fc" bench allreduce -n 1 -b 16M -e 16M --iters 1 --warmup 0 | sed -n 's/.*on one thread \([0-9.]*\) GB\/s.*/\1/p')
  echo "$limit" >"$tmp/limit"
fi
echo "# machine limit: single-thread memcpy of 16 MiB = $limit GB/s"
((rounds > 1)) && echo "# $rounds rounds, ferrocoll and the peer in turn; per size and side the round with the median time"
# (A recheck of an earlier run reports that run's stream limits again.)
if [[ -z ${RECHECK_ONLY:-} ]]; then : >"$tmp/stream_before"; : >"$tmp/stream_after"; fi
if ((need_gloo)) && [[ -z ${RECHECK_ONLY:-} ]]; then stream_limit "$tmp/stream_before"; fi

# The size bands of the peers' iteration counts, clipped to [8, hi].
# The peers' iteration counts: 1000 calls below 64 KiB, 100 below 4 MiB,
# 10 above.
iter_bands=("65536:1000" "4194304:100")
iters_for() {
  local b
  for b in "${iter_bands[@]}"; do ((${1} < ${b%:*})) && { echo "${b#*:}"; return; }; done
  echo 10
}
bands() {
  local lo=8 b
  for b in "${iter_bands[@]}" "$((hi_bytes * 2)):10"; do
    local top=${b%:*} it=${b#*:} e=$lo
    ((lo > hi_bytes)) && break
    while ((e * factor < top && e * factor <= hi_bytes)); do e=$((e * factor)); done
    echo "$lo $e $it"
    lo=$((e * factor))
  done
}

# Runs ferrocoll's COLL over T with N ranks for sizes LO..E (step $factor),
# ITERS timed calls each, appending its JSON lines to OUT.
fc_run() {
  local coll=$1 t=$2 n=$3 lo=$4 e=$5 it=$6 out=$7 form=()
  # MPI_Bcast and torch's broadcast are in place (one buffer): time ours
  # in place too, or ferrocoll's root pays a copy of input to output
  # that the peers never make (about half the time from 2 MiB up).
  [[ $coll == bcast ]] && form=(--in-place)
  "$fc" bench "$coll" --transport "$t" -n "$n" -b "$lo" -e "$e" -f "$factor" \
    --iters "$it" --warmup 5 --no-check --json "${form[@]}" >>"$out" </dev/null
}

# Runs the peer (Open MPI for shm, gloo for tcp) for sizes LO..HI, its own
# iteration counts, appending its JSON lines to OUT.
peer_run() {
  local coll=$1 t=$2 n=$3 lo=$4 hi=$5 out=$6 r port pids=()
  if [[ $t == shm ]]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$n" --oversubscribe \
      "$tmp/mpi_coll" "$coll" "$lo" "$hi" "$factor" >>"$out" 2>"$out.err" </dev/null || { cat "$out.err" >&2; exit 1; }
  else
    local attempt failed
    for attempt in 1 2 3; do
      port=$((20000 + RANDOM % 20000)) pids=() failed=0
      : >"$out"
      for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          "$venv/bin/python" bench/peer_gloo_coll.py "$coll" "$lo" "$hi" "$factor" >>"$out" 2>"$out.err.$r" </dev/null &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || failed=1; done
      ((failed)) || return 0
      # The random port was taken (by a socket in TIME_WAIT, say): another.
      grep -q EADDRINUSE "$out".err.* || break
    done
    cat "$out".err.* >&2
    exit 1
  fi
}

# (A recheck of an earlier run reuses its rounds.)
[[ -n ${RECHECK_ONLY:-} ]] && colls_to_run="" || colls_to_run=$colls
for coll in $colls_to_run; do
  for cfg in $configs; do
    t=${cfg%:*}; n=${cfg#*:}
    for ((round = 0; round < rounds; round++)); do
      out="$tmp/fc_${coll}_${t}${n}.r$round"
      : >"$out"
      while read -r lo e it; do fc_run "$coll" "$t" "$n" "$lo" "$e" "$it" "$out"; done < <(bands)
      peer="$tmp/peer_${coll}_${t}${n}.r$round"
      : >"$peer"
      peer_run "$coll" "$t" "$n" 8 "$hi_bytes" "$peer"
    done
  done
done

if ((need_gloo)) && [[ -z ${RECHECK_ONLY:-} ]]; then stream_limit "$tmp/stream_after"; fi

: >"$tmp/misses"
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
        name = "ompi" if t == "shm" else "gloo"
        # (want, from bytes): busbw >= want x the peer's at every size from there.
        targets = [(1.0, 0)] if t == "shm" else [(2.0, 1 << 20)]
        if (coll, t, n) == ("allreduce", "shm", "2"):
            # Issue 20's heap-buffer target: 2x Open MPI from 512 KiB.
            targets.append((2.0, 512 << 10))
        stream = (one_way if coll in ("bcast", "reduce") else both_ways) if t == "tcp" else 0.0
        print(f"\n## {coll}, {t}, {n} ranks, vs {name}")
        if stream > 0:
            which = "one direction" if coll in ("bcast", "reduce") else "each direction of both at once"
            print(f"# stream: {which} of one loopback TCP stream, {stream:.2f} GB/s")
        print(f"# {'bytes':>10} {'algo':>10} {'fc us':>10} {'fc busbw':>9} {name + ' us':>10} "
              f"{name + ' busbw':>11} {'busbw x':>8} {'fc/limit':>8}"
              + (f" {'fc/stream':>9} {name + '/stream':>11}" if stream > 0 else "")
              + (f" {'paired x':>8}" if rounds > 1 else ""))
        ratios, short, lowest = {}, [], None
        for b in sorted(set(fc) & set(peer)):
            f, p = fc[b], peer[b]
            ratio = f["busbw"] / p["busbw"] if p["busbw"] > 0 else float("inf")
            ratios[b] = ratio
            # A row under any of its table's targets is marked.
            mark = " <" if any(b >= start and ratio < want for want, start in targets) else ""
            if stream > 0 and b >= targets[0][1]:
                of_stream = f["busbw"] / stream
                if of_stream < 0.7:
                    short.append(b)
                lowest = of_stream if lowest is None else min(lowest, of_stream)
            tail = f" {f['busbw'] / stream:>9.2f} {p['busbw'] / stream:>11.2f}" if stream > 0 else ""
            if rounds > 1:
                tail += f" {pair.get(b, float('nan')):>8.2f}"
            print(f"  {b:>10} {f['algo']:>10} {f['time_us']:>10.1f} {f['busbw']:>9.3f} {p['time_us']:>10.1f} "
                  f"{p['busbw']:>11.3f} {ratio:>8.2f} {f['busbw'] / limit:>8.3f}{tail}{mark}")
        for want, start in targets:
            where = "every size" if start == 0 else f"every size >= {start} B"
            in_range = [b for b in ratios if b >= start]
            if not in_range:
                verdicts.append(f"{coll:>13} {t} {n}: no measured size in the range of >= {want}x {name}")
                continue
            misses = [b for b in in_range if ratios[b] < want]
            worst = min(ratios[b] for b in in_range)
            paired_misses = [b for b in in_range if pair.get(b, want) < want]
            with open(os.path.join(tmp, "misses"), "a") as out:
                for m in misses:
                    out.write(f"{coll} {t} {n} {m} {want} {name}\n")
            verdict = "met" if not misses else f"MISSED at {len(misses)} sizes ({', '.join(str(m) for m in misses)})"
            if misses and stream > 0:
                # What the target asks of the link there: want x the peer's
                # busbw as a fraction of one loopback stream (above 1.0x,
                # more than one stream carries).
                need = [want * peer[m]["busbw"] / stream for m in misses]
                verdict += f", where {want}x {name} is {min(need):.2f}-{max(need):.2f}x the stream"
            aside = f" (paired rounds: under {want}x at {len(paired_misses)} sizes)" if rounds > 1 else ""
            verdicts.append(f"{coll:>13} {t} {n}: busbw >= {want}x {name} at {where}: {verdict}; worst {worst:.2f}x{aside}")
        if lowest is not None:
            where = f"every size >= {targets[0][1]} B"
            with open(os.path.join(tmp, "misses"), "a") as out:
                for m in short:
                    out.write(f"{coll} {t} {n} {m} 0.7 stream\n")
            verdict = "met" if not short else f"MISSED at {len(short)} sizes ({', '.join(str(m) for m in short)})"
            verdicts.append(f"{coll:>13} {t} {n}: busbw >= 0.7x the stream at {where}: {verdict}; lowest {lowest:.2f}x")

print("\n## Targets")
for v in verdicts:
    print("  " + v)
PY

# The recheck (RECHECK=K): every size under its target above runs again, on
# its own, K times, ferrocoll and the peer one right after the other (which
# goes first alternates), with the same iteration counts. A size's verdict
# then stays on the median over the K rounds of each round's busbw ratio,
# and a sign test says whether the rounds tell ferrocoll from the target at
# all: with p >= 0.05 the size is within the machine's noise of the target.
rechecks=${RECHECK:-0}
if ((rechecks > 0)) && [[ -s $tmp/misses ]]; then
  echo
  echo "# recheck: $(cut -d' ' -f1-4,6 "$tmp/misses" | sort -u | wc -l) sizes under a target, $rechecks rounds each, $(date -u +%H:%MZ)"
  # A size under two targets against the same peer (the 2-rank allreduce
  # under 1x and 2x Open MPI) runs once; both verdicts read those rounds.
  declare -A rechecked=()
  while read -r coll t n b want against; do
    key="${coll}_${t}${n}_${b}_$against"
    [[ -n ${rechecked[$key]:-} ]] && continue
    rechecked[$key]=1
    it=$(iters_for "$b")
    for ((round = 0; round < rechecks; round++)); do
      fout="$tmp/re_fc_${coll}_${t}${n}_${b}_$against.r$round" pout="$tmp/re_peer_${coll}_${t}${n}_${b}_$against.r$round"
      # Going on with an interrupted recheck: a round both sides finished stays.
      [[ -n ${RECHECK_ONLY:-} && -s $fout && -s $pout ]] && continue
      : >"$fout"; : >"$pout"
      # Against the stream the other side is one run of bench/tcp_stream.c.
      other() { if [[ $against == stream ]]; then "$tmp/tcp_stream" 1 >"$pout" </dev/null; else peer_run "$coll" "$t" "$n" "$b" "$b" "$pout"; fi; }
      if ((round % 2 == 0)); then
        fc_run "$coll" "$t" "$n" "$b" "$b" "$it" "$fout"; other
      else
        other; fc_run "$coll" "$t" "$n" "$b" "$b" "$it" "$fout"
      fi
    done
  done <"$tmp/misses"
  python3 - "$tmp" "$rechecks" <<'PY'
import json, math, os, re, sys
tmp, k = sys.argv[1], int(sys.argv[2])

def record(path):
    """The one size's JSON record in a run's output file."""
    for line in open(path):
        if line.startswith("{") and "bytes" in (r := json.loads(line)):
            return r
    raise SystemExit(f"compare_all.sh: no result in {path}")

def stream(path, coll):
    """A bench/tcp_stream.c run as a record: its busbw the stream's GB/s,
    one direction for bcast and reduce, else each direction of both at
    once (their mean), as the tables count it."""
    text = open(path).read()
    if coll in ("bcast", "reduce"):
        gbs = float(re.search(r"one direction: ([0-9.]+) GB/s", text).group(1))
    else:
        a, b = re.search(r"both directions: ([0-9.]+) \+ ([0-9.]+) GB/s", text).groups()
        gbs = (float(a) + float(b)) / 2
    return {"busbw": gbs, "time_us": float("nan")}

def sign_test(wins, n):
    """Two-sided sign test: the chance of a split at least this uneven if
    each round were a coin flip between above and below the target."""
    tail = sum(math.comb(n, i) for i in range(0, min(wins, n - wins) + 1)) / 2 ** n
    return min(1.0, 2 * tail)

print(f"# {'collective':>31} {'bytes':>10} {'fc us':>9} {'peer us':>9} {'paired x':>8} "
      f"{'range':>11} {'>= target':>9} {'sign p':>6}  verdict")
results = {}
for line in open(os.path.join(tmp, "misses")):
    coll, t, n, b, want, against = line.split()
    b, want = int(b), float(want)
    at = lambda side, i: os.path.join(tmp, f"re_{side}_{coll}_{t}{n}_{b}_{against}.r{i}")
    fc = [record(at("fc", i)) for i in range(k)]
    peer = [stream(at("peer", i), coll) if against == "stream" else record(at("peer", i)) for i in range(k)]
    ratios = sorted(f["busbw"] / p["busbw"] for f, p in zip(fc, peer) if p["busbw"] > 0)
    mid = lambda xs: sorted(xs)[(len(xs) - 1) // 2]
    x = mid(ratios)
    wins = sum(r >= want for r in ratios)
    p = sign_test(wins, len(ratios))
    verdict = "met" if x >= want else ("under, within noise" if p >= 0.05 else "MISSED")
    results.setdefault((coll, t, n, want, against), []).append((b, verdict, x))
    name = f"{coll} {t} {n} vs {want}x {against}"
    print(f"  {name:>31} {b:>10} {mid([f['time_us'] for f in fc]):>9.2f} {mid([q['time_us'] for q in peer]):>9.2f} "
          f"{x:>8.2f} {ratios[0]:>5.2f}-{ratios[-1]:<5.2f} {wins:>4}/{len(ratios):<4} {p:>6.3f}  {verdict}")
print("\n## Targets after the recheck (sizes that were under target)")
for (coll, t, n, want, against), rows in results.items():
    missed = [b for b, v, _ in rows if v == "MISSED"]
    noise = [b for b, v, _ in rows if v.startswith("under")]
    print(f"  {coll:>13} {t} {n} vs {want}x {against}: {len(rows)} rechecked; met {len(rows) - len(missed) - len(noise)}, "
          f"under within noise {len(noise)} ({', '.join(map(str, noise)) or '-'}), "
          f"MISSED {len(missed)} ({', '.join(map(str, missed)) or '-'})")
PY
fi
