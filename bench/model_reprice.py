#!/usr/bin/env python3
"""Re-price kept regret runs with another cost model, measuring nothing.

`bench/regret_tune.sh` with `REGRET_KEEP=DIR` keeps, per transport and group
size, fresh runs of `ferrocoll tune --with-auto` (`fresh-T-N-model-R.jsonl`):
every forced candidate's median and what `auto` ran. This script asks
`ferrocoll model` (the binary given, with the built-in profile's parameters
and any extra flags) which algorithm it would pick at each point, and scores
that pick by the forced candidate's time in those same runs: within 1.10 of
the fastest forced candidate, the median over the runs (regret_tune.sh's
"auto_model, its choice scored by the candidate's time"). Where auto took a
transport's fast path (`shm-fast`), which is chosen before the model is asked,
auto's own time is scored. With the binary's own built-in model the picks
equal what auto ran in every run (printed), which checks the re-pricing.

Usage: python3 bench/model_reprice.py DIR FERROCOLL [--all=FLAGS] [--thread=FLAGS]
           [--transports "thread shm tcp"] [--builtin=FLAGS] [--misses]
  e.g. python3 bench/model_reprice.py /tmp/regret-full target/release/ferrocoll \
           --thread=--receiver-copies
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess

#: Profile::thread_default (crates/ferrocoll/src/cost/mod.rs) as `ferrocoll model` flags,
#: the built-in profile of every transport but TCP.
BUILTIN_FLAGS = {
    "--alpha": "3.7us",
    "--beta": "17GB/s",
    "--overhead": "0.6us",
    "--gamma": "0.02ns",
    "--copy": "0.017ns",
    "--cache": "32MiB",
    "--beta-mem": "8GB/s",
}
#: Profile::tcp_default: the thread numbers with alpha 6 us and o 3 us.
BUILTIN_TCP_FLAGS = {**BUILTIN_FLAGS, "--alpha": "6us", "--overhead": "3us"}


def as_args(flags: dict[str, str]) -> list[str]:
    """`{"--alpha": "3.7us"}` as `["--alpha", "3.7us"]`."""
    return [word for pair in flags.items() for word in pair]


BUILTIN = as_args(BUILTIN_FLAGS)
BUILTIN_TCP = as_args(BUILTIN_TCP_FLAGS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a REGRET_KEEP directory of bench/regret_tune.sh")
    ap.add_argument("ferrocoll", help="the ferrocoll binary whose `model` picks")
    ap.add_argument("--all", default="", help="extra `model` flags for every point")
    ap.add_argument(
        "--thread",
        default="",
        help="extra `model` flags for the thread transport's points",
    )
    ap.add_argument("--transports", default="thread shm")
    ap.add_argument(
        "--builtin",
        default="",
        help="`model` flags to use instead of the built-in profile's (BUILTIN below)",
    )
    ap.add_argument("--misses", action="store_true", help="print every point beyond 1.10")
    args = ap.parse_args()
    picks: dict[tuple[str, str, int, int], str] = {}

    def pick(t: str, coll: str, n: int, size: int) -> str:
        key = (t, coll, n, size)
        if key not in picks:
            default = BUILTIN_TCP if t == "tcp" else BUILTIN
            base = args.builtin.split() if args.builtin else default
            flags = base + args.all.split() + (args.thread.split() if t == "thread" else [])
            cmd = [
                args.ferrocoll,
                "model",
                coll,
                "-n",
                str(n),
                "-b",
                str(size),
                "--json",
            ] + flags
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            picks[key] = json.loads(out.stdout)["choice"]
        return picks[key]

    good, total = collections.Counter(), collections.Counter()
    agree = points = 0
    for t in args.transports.split():
        for n in (2, 4):
            runs: dict[tuple[str, int], list[tuple[dict[str, float], tuple[str, float]]]] = (
                collections.defaultdict(list)
            )
            for path in sorted(glob.glob(os.path.join(args.dir, f"fresh-{t}-{n}-model-*.jsonl"))):
                forced: dict[tuple[str, int], dict[str, float]] = collections.defaultdict(dict)
                auto: dict[tuple[str, int], tuple[str, float]] = {}
                with open(path) as lines:
                    records = [json.loads(line) for line in lines]
                for r in records:
                    key = (r["coll"], r["bytes"])
                    if r["algo"] == "auto":
                        auto[key] = (r["ran"], r["median_us"])
                    else:
                        forced[key][r["algo"]] = r["median_us"]
                for key, times in forced.items():
                    runs[key].append((times, auto[key]))
            for (coll, size), rs in runs.items():
                fast = rs[0][1][0].endswith("-fast")
                choice = rs[0][1][0] if fast else pick(t, coll, n, size)
                agree += all(choice == a[0] for _, a in rs)
                ratios = sorted(
                    (a[1] if fast else times.get(choice, float("inf"))) / min(times.values())
                    for times, a in rs
                )
                mid = len(ratios) // 2
                regret = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
                points += 1
                if args.misses and regret > 1.10:
                    best = min(rs[0][0], key=rs[0][0].get)
                    print(f"  miss {t} n={n} {coll} {size}: {choice} at {regret:.2f}, fastest {best}")
                for label in ("all", f"{t} n={n}", coll):
                    good[label] += regret <= 1.10
                    total[label] += 1
    flags = " ".join(f for f in (args.all, args.thread and f"thread: {args.thread}") if f)
    print(
        f"model {flags or ('(--builtin ' + args.builtin + ')' if args.builtin else '(built in)')}: regret <= 1.10 at {good['all']}/{total['all']} sizes "
        f"({100 * good['all'] / max(total['all'], 1):.0f}%); "
        f"picks equal to what auto ran in every run: {agree}/{points}"
    )
    print("  " + "; ".join(f"{k} {good[k]}/{total[k]}" for k in sorted(total) if k != "all"))


if __name__ == "__main__":
    main()
