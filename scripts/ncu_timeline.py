#!/usr/bin/env python3
"""One decode step, kernel by kernel, from Nsight Compute's raw CSV (device_bench.sh JOB=timeline).

ncu runs each kernel alone (no overlap with its neighbours), so the figures are each kernel's own
duration; the step's wall time minus their sum is what the gaps between kernels cost (negative:
what the programmatic launches hide).
Usage: ncu_timeline.py ncu.csv [first-kernel-of-a-step]
"""
from __future__ import annotations

import csv
import sys
from collections import OrderedDict


def read_kernels(lines) -> list[tuple[str, str, str, float]]:
    """(kernel, grid, block, duration in ns) per profiled launch, in launch order. ncu's raw page
    has a header row, a units row, then one row per launch; numbers may carry thousands commas."""
    rows = list(csv.reader(l for l in lines if l.startswith('"')))
    if not rows:
        return []
    head = rows[0]
    name_i, grid_i = head.index("Kernel Name"), head.index("Grid Size")
    block_i, dur_i = head.index("Block Size"), head.index("gpu__time_duration.sum")
    out = []
    for r in rows[1:]:
        try:
            out.append((r[name_i].split("(")[0], r[grid_i], r[block_i], float(r[dur_i].replace(",", ""))))
        except (ValueError, IndexError):
            continue  # the units row
    return out


def last_step(kernels, first: str = "embed_rows"):
    """The launches of the last complete step: from the second-to-last launch of `first` up to
    the last one (the final step may be cut short); None with fewer than two."""
    starts = [i for i, k in enumerate(kernels) if k[0] == first]
    if len(starts) < 2:
        return None
    return kernels[starts[-2] : starts[-1]]


def aggregate(step):
    """(kernel, grid, block) -> (launches, total us), largest total first."""
    agg: OrderedDict = OrderedDict()
    for name, grid, block, ns in step:
        n, t = agg.get((name, grid, block), (0, 0.0))
        agg[(name, grid, block)] = (n + 1, t + ns * 1e-3)
    return sorted(agg.items(), key=lambda kv: -kv[1][1])


def main() -> None:
    with open(sys.argv[1], newline="") as f:
        kernels = read_kernels(f)
    first = sys.argv[2] if len(sys.argv) > 2 else "embed_rows"
    step = last_step(kernels, first)
    if step is None:
        print(f"fewer than two '{first}' launches in {len(kernels)} kernels")
        return
    total = sum(k[3] for k in step) * 1e-3
    print(f"one decode step: {len(step)} kernels, sum of their durations {total:.1f} us")
    print(f"{'kernel':<28} {'grid':>16} {'block':>12} {'count':>6} {'total us':>10} {'mean us':>9} {'share':>6}")
    for (name, grid, block), (n, t) in aggregate(step):
        print(f"{name:<28} {grid:>16} {block:>12} {n:>6} {t:>10.1f} {t / n:>9.2f} {100 * t / total:>5.1f}%")


if __name__ == "__main__":
    main()
