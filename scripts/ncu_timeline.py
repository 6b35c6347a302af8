#!/usr/bin/env python3
"""One decode step, kernel by kernel, from Nsight Compute's raw CSV (device_bench.sh JOB=timeline).

ncu runs each kernel alone (no overlap with its neighbours), so the figures are each kernel's own
duration; the step's wall time minus their sum is what the gaps between kernels cost.
Usage: ncu_timeline.py ncu.csv [first-kernel-of-a-step]
"""
import csv
import sys
from collections import OrderedDict


def main() -> None:
    path = sys.argv[1]
    first = sys.argv[2] if len(sys.argv) > 2 else "embed_rows"
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    head = rows[0]
    name_i = head.index("Kernel Name")
    grid_i = head.index("Grid Size")
    block_i = head.index("Block Size")
    dur_i = head.index("gpu__time_duration.sum")
    data = []
    for r in rows[1:]:
        try:
            data.append((r[name_i], r[grid_i], r[block_i], float(r[dur_i].replace(",", ""))))
        except (ValueError, IndexError):
            continue  # the units row
    starts = [i for i, d in enumerate(data) if d[0].startswith(first)]
    if len(starts) < 2:
        print(f"fewer than two '{first}' launches in {len(data)} kernels")
        return
    step = data[starts[-2] : starts[-1]]
    unit = 1e-3  # ns -> us
    total = sum(d[3] for d in step) * unit
    print(f"one decode step: {len(step)} kernels, sum of their durations {total:.1f} us")
    agg = OrderedDict()
    for name, grid, block, ns in step:
        k = (name.split("(")[0], grid, block)
        n, t = agg.get(k, (0, 0.0))
        agg[k] = (n + 1, t + ns * unit)
    print(f"{'kernel':<28} {'grid':>16} {'block':>12} {'count':>6} {'total us':>10} {'mean us':>9} {'share':>6}")
    for (name, grid, block), (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<28} {grid:>16} {block:>12} {n:>6} {t:>10.1f} {t / n:>9.2f} {100 * t / total:>5.1f}%")


if __name__ == "__main__":
    main()
