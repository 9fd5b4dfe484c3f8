#!/usr/bin/env python3
"""Score rules for picking from a tuned table on kept regret runs, measuring nothing.

`bench/regret_tune.sh` with `REGRET_KEEP=DIR` keeps each launch's tuned table
(`tune-T-N.json`: every candidate's median, p10 and p90) and fresh runs of
every forced candidate (`fresh-T-N-*.jsonl`). For each rule this script picks
a candidate from the table at every measured point and scores the pick by the
forced candidates' times in the fresh runs: within 1.10 of the fastest, the
median over the runs (regret_tune.sh's "scored by the candidate's time").

Rules: `median` (least median: what `auto` takes), `mean3` (least mean of
p10, median and p90), `p90` (least p90) and `band1.05` (among the candidates
whose median is within 5 % of the least, the least p90). `mean3` did better
on six kept directories (725 -> 732 of 762) and not on a fresh one made to
test it (118 -> 117 of 127), so `auto` kept the median (bench/RESULTS.md,
issue 19, sixth session).

Usage: python3 bench/tune_rule.py DIR [DIR ...]
"""

from __future__ import annotations

import collections
import glob
import json
import os
import statistics
import sys
from typing import Callable

Times = list[dict[str, float | str]]
Rule = Callable[[Times], str]


def fresh_runs(d: str, transport: str, n: str) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Each (collective, bytes) of DIR's fresh runs: per run, every forced candidate's median."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(d, f"fresh-{transport}-{n}-*.jsonl"))):
        forced: dict[tuple[str, int], dict[str, float]] = collections.defaultdict(dict)
        with open(path) as lines:
            for line in lines:
                r = json.loads(line)
                if r["algo"] != "auto":
                    forced[(r["coll"], r["bytes"])][r["algo"]] = r["median_us"]
        for key, times in forced.items():
            runs[key].append(times)
    return runs


def least(field: Callable[[dict[str, float | str]], float]) -> Rule:
    """The rule that takes the candidate of least `field`."""
    return lambda ts: str(min(ts, key=field)["algo"])


def band(f: float) -> Rule:
    """The least p90 among the candidates whose median is within `f` of the least."""

    def rule(ts: Times) -> str:
        m = min(float(x["median_us"]) for x in ts)
        near = [x for x in ts if float(x["median_us"]) <= f * m]
        return str(min(near, key=lambda x: float(x["p90_us"]))["algo"])

    return rule


RULES: dict[str, Rule] = {
    "median": least(lambda x: float(x["median_us"])),
    "mean3": least(lambda x: float(x["p10_us"]) + float(x["median_us"]) + float(x["p90_us"])),
    "p90": least(lambda x: float(x["p90_us"])),
    "band1.05": band(1.05),
}


def main() -> None:
    """Prints each rule's score per directory and over all of them."""
    total: collections.Counter[tuple[str, str]] = collections.Counter()
    good: collections.Counter[tuple[str, str]] = collections.Counter()
    for d in sys.argv[1:]:
        for tune in sorted(glob.glob(os.path.join(d, "tune-*.json"))):
            transport, n = os.path.basename(tune)[len("tune-") : -len(".json")].split("-")
            fresh = fresh_runs(d, transport, n)
            with open(tune) as f:
                tables = json.load(f)["tables"]
            for table in tables:
                for point in table["points"]:
                    key = (point["coll"], point["bytes"])
                    if key not in fresh:
                        continue
                    for name, rule in RULES.items():
                        pick = rule(point["times"])
                        ratio = statistics.median(
                            run.get(pick, float("inf")) / min(run.values()) for run in fresh[key]
                        )
                        for where in (d, "all"):
                            total[(where, name)] += 1
                            good[(where, name)] += ratio <= 1.10
    for where, name in sorted(total):
        k = (where, name)
        print(f"{where:>24} {name:>9}: {good[k]}/{total[k]} within 1.10 ({100 * good[k] / total[k]:.1f}%)")


if __name__ == "__main__":
    main()
