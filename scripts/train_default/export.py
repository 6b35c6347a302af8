#!/usr/bin/env python3
"""Export the trained weights (train.py's weights_*.npz + report.json) to an F32 `muse` GGUF."""
import argparse
import glob
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from muse_ref import write_gguf  # noqa: E402


def load_run(run_dir):
    report = json.load(open(os.path.join(run_dir, "report.json")))
    w = {}
    for p in sorted(glob.glob(os.path.join(run_dir, "weights_*.npz"))):
        w.update({k: v.astype(np.float32) for k, v in np.load(p).items()})
    return report["config"], w, report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default=os.path.join(HERE, "work", "run"), help="train.py's --out")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "work", "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(HERE, "work", "muse-default-f32.gguf"))
    a = ap.parse_args()
    cfg, w, _ = load_run(a.run)
    write_gguf(a.out, cfg, w, a.tokenizer)
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes)")


if __name__ == "__main__":
    main()
