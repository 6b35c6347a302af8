"""scripts/compare_llamacpp.py's reading of llama-bench / muser bench tables (no llama.cpp
needed): a test run over several settings (llama-bench `--repack 0,1`) counts with its
fastest row."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import compare_llamacpp as cl  # noqa: E402


def test_parse_tables_keeps_the_fastest_row_of_a_test_run_over_several_settings():
    rnd = random.Random(7)
    for _ in range(20):
        speeds = {t: [round(rnd.uniform(10, 900), 2) for _ in range(rnd.randint(1, 3))]
                  for t in ("pp512", "tg128")}
        rows = []
        for test, vals in speeds.items():
            for k, v in enumerate(vals):
                rows.append(f"| llama 1B Q4_K | 581.26 MiB | 1.01 B | CPU | 2 | {k} | {test} | "
                            f"{v:.2f} ± {rnd.uniform(0, 5):.2f} |")
        rnd.shuffle(rows)
        head = ["| model | size | params | backend | threads | repack | test | t/s |",
                "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
        got = cl.parse_tables("\n".join(head + rows))
        assert set(got) == set(speeds)
        for test, vals in speeds.items():
            assert got[test][0] == pytest.approx(max(vals))
