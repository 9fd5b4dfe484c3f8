#!/usr/bin/env python3
"""How often a calibrated model picks well on its own calibration points, measuring nothing.

`ferrocoll calibrate` prints every point it measured with the fitted model's
prediction (`coll algo bytes measured_us predicted_us error`). For each
(collective, size) this script takes the algorithm of least predicted time and
counts the sizes where its measured time is within 1.10 of the fastest
measured one: in-sample, so only a comparison between model variants fitted
to the same kind of run, not a regret figure.

Usage: python3 bench/calibrate_picks.py CALIBRATE_OUTPUT...
"""

from __future__ import annotations

import collections
import sys


def score(path: str) -> tuple[int, int]:
    """(sizes picked within 1.10 of the best, sizes) for one calibrate output."""
    points: dict[tuple[str, int], dict[str, tuple[float, float]]] = collections.defaultdict(dict)
    with open(path) as lines:
        for line in lines:
            f = line.split()
            if len(f) == 6 and f[0] in ("allreduce", "allgather", "alltoall") and f[5].endswith("%"):
                points[(f[0], int(f[2]))][f[1]] = (float(f[3]), float(f[4]))
    good = 0
    for times in points.values():
        pick = min(times, key=lambda a: times[a][1])
        best = min(measured for measured, _ in times.values())
        good += times[pick][0] <= 1.10 * best
    return good, len(points)


def main() -> None:
    """Prints each file's score."""
    for path in sys.argv[1:]:
        good, total = score(path)
        print(f"{path}: the model's pick within 1.10 of the measured best at {good}/{total} sizes")


if __name__ == "__main__":
    main()
