#!/usr/bin/env python3
"""Shape of a model's next-token distributions over a text: how clear the favourite is.

`muser logits` evaluates the English text of this folder (its first --tokens tokens, BOS
first where the model asks for it); for every position from --skip on this prints the
quantiles of the top-1 probability, of the gap between the two best log-probabilities (in
nats), the share of positions whose gap is below 0.05 and 0.1 nats (where 8-bit activation
rounding can swap the top two), and how many distinct tokens are top-1 (a model stuck on one
token would show few).

Used to tune and check the LM head of `muser synth` (crates/muser-synth, `Init::Head`):
    python3 scripts/llamacpp_compare/logit_stats.py --model m.gguf [--muser target/release/muser]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def logit_stats(logits: np.ndarray) -> dict:
    """Statistics of rows of logits [n_pos, n_vocab]."""
    lg = logits.astype(np.float64)
    mx = lg.max(axis=1, keepdims=True)
    logp = lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))
    srt = np.sort(logp, axis=1)
    p1 = np.exp(srt[:, -1])
    gap = srt[:, -1] - srt[:, -2]
    q = lambda v: [round(float(x), 3) for x in np.percentile(v, [10, 25, 50, 75, 90])]  # noqa: E731
    return dict(
        positions=len(lg),
        top1_prob_p10_25_50_75_90=q(p1),
        top2_gap_nats_p10_25_50_75_90=q(gap),
        gap_below_0p05=float((gap < 0.05).mean()),
        gap_below_0p1=float((gap < 0.1).mean()),
        distinct_top1=int(len(np.unique(lg.argmax(axis=1)))),
        logit_std_median=float(np.median(lg.std(axis=1))),
    )


def model_logits(muser: str, model: Path, n_tokens: int, threads: int) -> np.ndarray:
    text = (HERE / "english.txt").read_text(encoding="utf-8")
    tk = subprocess.run([muser, "tokenize", "-m", str(model), "-p", text], check=True,
                        capture_output=True, text=True)
    ids = [int(x) for x in tk.stdout.split()][:n_tokens]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        subprocess.run([muser, "logits", "-m", str(model), "--tokens", ",".join(map(str, ids)),
                        "--out", str(out), "--threads", str(threads)], check=True,
                       capture_output=True, text=True)
        return np.load(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--muser", default=str(REPO / "target" / "release" / "muser"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--skip", type=int, default=16, help="leave out the first positions")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    lg = model_logits(args.muser, Path(args.model), args.tokens, args.threads)
    print(json.dumps(logit_stats(lg[args.skip:]), indent=1))


if __name__ == "__main__":
    main()
