#!/usr/bin/env python3
"""Scores `auto` in an MoE schedule sweep: is its pick the fastest forced schedule?

Reads the JSON lines of `ferrocoll bench moe --schedule
direct,pairwise,two-level,rail,auto` (several runs appended), and prints per
(tokens, skew) point every schedule's layer time (dispatch, count exchange
included, + combine), auto's picks, the fastest forced schedule per phase,
and whether auto's pick is within 5 % of it; then the share of points where
it is, for the calls, the layers and the family (flat or hierarchical), and
the layers scored against each run's own forced schedules.

Each run's statistic per schedule is the median of its timed layers by
default (`--stat mean` for the mean): on the namespace cluster's shaped
links single layers stall for 5-50 ms now and then whatever the schedule
(plain Python sockets do too: bench/RESULTS.md, issue 18), and a few such
stalls in 40 layers move a mean by more than the schedules differ.

`--stat layer` takes instead the median over the timed layers of the
slowest rank's time of each layer: what a synchronous layer waits for, and
the statistic `auto` measures its candidates by (the slowest rank of each
call). The default, the slowest rank's own median, is the smaller of the
two where the slowest rank changes from layer to layer.

Usage: bench/moe_score.py RAW/sweep.json [--stat median|mean|layer]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

#: auto's pick counts as right within this of the fastest forced schedule.
TOL = 0.05
#: The schedules the sweep forces, in column order.
FORCED = ["direct", "pairwise", "two-level", "rail"]

Key = tuple[int, str, str]


def load(path: str) -> dict[Key, list[dict]]:
    """The sweep's JSON lines by (tokens, skew, requested schedule), one per run."""
    runs: dict[Key, list[dict]] = defaultdict(list)
    with open(path) as lines:
        for line in lines:
            if "{" in line:
                r = json.loads(line.split("] ", 1)[-1])
                runs[(r["tokens"], r["skew"], r["requested"])].append(r)
    return runs


def family(schedule: str) -> str:
    """Flat (one all-to-all-v) or hierarchical (through the hosts)."""
    return "flat" if schedule in ("direct", "pairwise") else "hier"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "sweep",
        help="the sweep's JSON lines (bench/moe.sh keeps them as RAW/sweep.json)",
    )
    ap.add_argument(
        "--stat",
        choices=("median", "mean", "layer"),
        default="median",
        help="each run's per-schedule statistic of the timed layers (default median)",
    )
    args = ap.parse_args()
    field = {"median": "{}_median_us", "mean": "{}_us", "layer": "{}_layer_median_us"}[
        args.stat
    ]
    runs = load(args.sweep)
    points = sorted({(t, s) for t, s, _ in runs})

    def mean(t: int, s: str, q: str, phase: str) -> float:
        """The mean over the runs of each run's statistic."""
        return statistics.mean(r[field.format(phase)] for r in runs[(t, s, q)])

    def layer_of(t: int, s: str, q: str) -> float:
        return mean(t, s, q, "dispatch") + mean(t, s, q, "combine")

    reps = len(runs[next(iter(runs))])
    print(
        f"# mean over {reps} runs of each schedule's {args.stat} us: dispatch (count exchange"
        f" included) + combine; auto: what it ran (dispatch/combine) and its own time; ok: auto's"
        f" pick is within {TOL:.0%} of the fastest forced schedule (dispatch, combine, the layer)"
    )
    print(
        f"{'tokens':>6} {'skew':>9} "
        + " ".join(f"{q:>10}" for q in FORCED)
        + f" {'auto':>10} {'auto ran':>19} {'fastest':>19} {'ok':>3} {'wrong':>5}"
    )
    # auto's pick may differ from run to run (it measures its candidates on
    # the run's first calls): every run's pick is scored against the runs'
    # mean of each forced schedule.
    right = {"dispatch": 0, "combine": 0, "layer": 0}
    strict = {"dispatch": 0, "combine": 0}
    fam_ok = 0
    noise = []
    for t, s in points:
        times = {
            ph: {q: mean(t, s, q, ph) for q in FORCED} for ph in ("dispatch", "combine")
        }
        fastest = [
            min(times[ph], key=lambda q: times[ph][q]) for ph in ("dispatch", "combine")
        ]
        layer = {q: layer_of(t, s, q) for q in FORCED}
        best_family = {
            f: min(v for q, v in layer.items() if family(q) == f)
            for f in ("flat", "hier")
        }
        oks, ran = [], []
        for auto in runs[(t, s, "auto")]:
            picks = {"dispatch": auto["schedule"], "combine": auto["combine_schedule"]}
            ok = ""
            for phase, best in zip(("dispatch", "combine"), fastest):
                strict[phase] += picks[phase] == best
                good = times[phase][picks[phase]] <= (1 + TOL) * times[phase][best]
                right[phase] += good
                ok += "y" if good else "n"
            picked = (
                times["dispatch"][picks["dispatch"]]
                + times["combine"][picks["combine"]]
            )
            good = picked <= (1 + TOL) * min(layer.values())
            right["layer"] += good
            ok += "y" if good else "n"
            fam_ok += all(
                best_family[f] <= (1 + TOL) * min(best_family.values())
                for f in {family(picks["dispatch"]), family(picks["combine"])}
            )
            if picks["dispatch"] == picks["combine"]:
                own = auto[field.format("dispatch")] + auto[field.format("combine")]
                noise.append(
                    abs(own - layer[picks["dispatch"]]) / layer[picks["dispatch"]]
                )
            oks.append(ok)
            ran.append(picks["dispatch"] + "/" + picks["combine"])
        wrong = sum(
            int(r["wrong"] or 0) for k, v in runs.items() if k[:2] == (t, s) for r in v
        )
        shown = ran[0] if len(set(ran)) == 1 else "varied"
        print(
            f"{t:>6} {s:>9} "
            + " ".join(f"{layer[q]:>10.1f}" for q in FORCED)
            + f" {layer_of(t, s, 'auto'):>10.1f}"
            f" {shown:>19} {'/'.join(fastest):>19}"
            f" {','.join(oks):>3} {wrong:>5}"
        )
        if shown == "varied":
            print(f"#   auto's picks by run: {', '.join(ran)}")
    n = len(points)
    picks_n = sum(len(runs[(t, s, "auto")]) for t, s in points)
    calls = 100 * (right["dispatch"] + right["combine"]) / (2 * picks_n)
    print(
        f"# auto's pick within {TOL:.0%} of the fastest, every run's pick scored: dispatch"
        f" {right['dispatch']}/{picks_n}, combine {right['combine']}/{picks_n} ({calls:.0f} % of the"
        f" calls), layer {right['layer']}/{picks_n} ({100 * right['layer'] / picks_n:.0f} %); the"
        f" fastest itself: {strict['dispatch'] + strict['combine']}/{2 * picks_n} calls"
    )
    # The flat-or-hierarchical question: the faster family by layer time (its
    # best member), a tie within TOL counting either way.
    print(
        f"# flat or hierarchical: auto's family the faster (or within {TOL:.0%}) in"
        f" {fam_ok}/{picks_n} ({100 * fam_ok / picks_n:.0f} %)"
    )
    # The ceiling of a selection that measured each schedule as long as a
    # whole run does: each run's own fastest forced layer, scored like auto.
    ceiling = 0
    for t, s in points:
        layer = {q: layer_of(t, s, q) for q in FORCED}
        for i in range(reps):
            one = {q: runs[(t, s, q)][i] for q in FORCED}
            own = min(
                FORCED,
                key=lambda q: (
                    one[q][field.format("dispatch")] + one[q][field.format("combine")]
                ),
            )
            ceiling += layer[own] <= (1 + TOL) * min(layer.values())
    print(
        f"# each run's own fastest schedule (every forced layer of the run measured) within"
        f" {TOL:.0%} of the runs' fastest: {ceiling}/{n * reps}"
    )
    # The same question asked of each run alone: auto's pick against the
    # forced schedules of its own run, whose layers interleave with auto's
    # (the same minutes of the machine), rather than against the runs' mean.
    in_run = 0
    for t, s in points:
        for i, auto in enumerate(runs[(t, s, "auto")]):
            one = {
                q: {
                    ph: runs[(t, s, q)][i][field.format(ph)]
                    for ph in ("dispatch", "combine")
                }
                for q in FORCED
            }
            picked = (
                one[auto["schedule"]]["dispatch"]
                + one[auto["combine_schedule"]]["combine"]
            )
            best = min(v["dispatch"] + v["combine"] for v in one.values())
            in_run += picked <= (1 + TOL) * best
    print(
        f"# auto's pick against its own run's forced schedules (layers interleaved with auto's):"
        f" layer within {TOL:.0%} in {in_run}/{picks_n} ({100 * in_run / picks_n:.0f} %)"
    )
    own_ok = sum(
        layer_of(t, s, "auto") <= (1 + TOL) * min(layer_of(t, s, q) for q in FORCED)
        for t, s in points
    )
    print(
        f"# auto's own layer time within {TOL:.0%} of the fastest forced schedule's: {own_ok}/{n}"
        f" ({100 * own_ok / n:.0f} %)"
    )
    print(
        f"# noise: auto's own time against the forced run of the same schedule, median"
        f" {100 * statistics.median(noise):.1f} %, max {100 * max(noise):.1f} %"
    )


if __name__ == "__main__":
    main()
