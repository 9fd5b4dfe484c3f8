#!/usr/bin/env python3
"""Two outputs of bench/compare.sh side by side: ferrocoll's busbw and its ratio to the peer, per size.

Usage: python3 bench/compare_two.py BEFORE.txt AFTER.txt
Prints, for each table of compare.sh, the busbw of both runs, after/before, and both runs'
ratio to the peer of the same run (the number compare.sh judges), then both runs' targets.
"""

import sys


def tables(path: str) -> dict[str, dict[int, tuple[float, float]]]:
    """Per table title: bytes -> (ferrocoll busbw GB/s, busbw ratio to the peer)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    title = None
    for line in open(path):
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = {}
        elif title and line.strip() and line.startswith("  ") and line.split()[0].isdigit():
            f = line.split()
            if len(f) >= 9:
                out[title][int(f[0])] = (float(f[4]), float(f[7]))
    return {t: rows for t, rows in out.items() if rows}


def targets(path: str) -> list[str]:
    """The verdict lines of a run."""
    lines = open(path).read().split("## Targets", 1)
    return [x.strip() for x in lines[1].splitlines() if x.strip()] if len(lines) == 2 else []


before, after = tables(sys.argv[1]), tables(sys.argv[2])
for title in before:
    if title not in after:
        continue
    print(f"\n### {title}")
    print("| bytes | before GB/s | after GB/s | after/before | before x peer | after x peer |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in sorted(set(before[title]) & set(after[title])):
        (bb, br), (ab, ar) = before[title][b], after[title][b]
        ratio = ab / bb if bb > 0 else float("nan")
        print(f"| {b} | {bb:.2f} | {ab:.2f} | {ratio:.2f} | {br:.2f} | {ar:.2f} |")
for name, path in (("before", sys.argv[1]), ("after", sys.argv[2])):
    print(f"\n{name}:")
    for t in targets(path):
        print(f"  {t}")
