"""scripts/ncu_timeline.py (device_bench.sh JOB=timeline) on a CSV shaped like ncu's raw page:
thousands commas in the durations, a units row, and the last complete step picked out."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import ncu_timeline  # noqa: E402


def _csv(launches):
    head = '"ID","Process ID","Kernel Name","Context","Block Size","Grid Size","gpu__time_duration.sum"'
    units = '"","","","","","","ns"'
    rows = [
        f'"{i}","7","{name}(int, float*)","1","{block}","{grid}","{ns:,}"'
        for i, (name, grid, block, ns) in enumerate(launches)
    ]
    return ["==PROF== Connected to process 7\n", head + "\n", units + "\n"] + [r + "\n" for r in rows]


def test_the_last_complete_step_is_summed_per_kernel_and_grid():
    rng = random.Random(5)
    launches = [("read_bandwidth", "(528, 1, 1)", "(256, 1, 1)", 930_000)]
    steps = []
    for _ in range(4):
        step = [("embed_rows", "(26, 1, 1)", "(256, 1, 1)", rng.randint(2_000, 3_000))]
        for _layer in range(3):
            step.append(("quantize_q8_k", "(7, 1, 1)", "(128, 1, 1)", rng.randint(1_900, 2_400)))
            step.append(("mvk_1", "(528, 1, 1)", "(128, 1, 1)", rng.randint(15_000, 19_000)))
            step.append(("mvk_1", "(416, 1, 1)", "(128, 1, 1)", rng.randint(9_000, 1_300_000)))
        steps.append(step)
        launches += step
    launches.append(("embed_rows", "(26, 1, 1)", "(256, 1, 1)", 2_500))  # a last step cut short

    kernels = ncu_timeline.read_kernels(_csv(launches))
    assert len(kernels) == len(launches)
    assert kernels[3][3] == float(launches[3][3])  # "1,234" read as 1234
    step = ncu_timeline.last_step(kernels)
    assert [k[3] for k in step] == [float(l[3]) for l in steps[-1]]

    agg = dict(ncu_timeline.aggregate(step))
    want = {}
    for name, grid, block, ns in steps[-1]:
        n, t = want.get((name, grid, block), (0, 0.0))
        want[(name, grid, block)] = (n + 1, t + ns * 1e-3)
    assert agg.keys() == want.keys()
    for key, (n, t) in want.items():
        assert agg[key][0] == n and abs(agg[key][1] - t) < 1e-6
    totals = [t for _, (_, t) in ncu_timeline.aggregate(step)]
    assert totals == sorted(totals, reverse=True)


def test_fewer_than_two_steps_is_reported_not_guessed():
    kernels = ncu_timeline.read_kernels(_csv([("embed_rows", "(1, 1, 1)", "(1, 1, 1)", 1_000)]))
    assert ncu_timeline.last_step(kernels) is None
    assert ncu_timeline.read_kernels(["no csv here\n"]) == []
