#!/usr/bin/env python3
"""Check the exported default model with Muser itself (issue 7).

1. numpy reference forward of the exported weights == PyTorch's saved logits;
2. `muser logits` on the F32 GGUF agrees with PyTorch's logits (NMSE <= 2e-3);
3. `muser tokenize` agrees with the HF tokenizer on held-out text;
4. `muser quantize F32 -> models/muse-default.gguf` (<= 10 MB), and the quantized
   file's `muser perplexity` on the held-out text is within 3% of the F32 file's.
Writes a JSON summary (--summary). Needs a built `muser` (--muser, default
target/release/muser).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import muse_ref  # noqa: E402

NMSE_MAX = 2e-3
PPL_REL_MAX = 0.03
SIZE_MAX = 10 * 1000 * 1000


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout + r.stderr


def muser_logits(muser, model, tokens, threads=2):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.npy")
        sh([muser, "logits", "-m", model, "--tokens", ",".join(str(int(t)) for t in tokens),
            "--out", out, "-t", str(threads)])
        return np.load(out)


def muser_perplexity(muser, model, text_file, ctx=512, threads=2):
    """Final perplexity from `muser perplexity`'s output (its last 'PPL/estimate' number)."""
    out = sh([muser, "perplexity", "-m", model, "-f", text_file, "-c", str(ctx), "-t", str(threads)])
    m = re.findall(r"(?:Final estimate: PPL|final[^\n=]*?)\s*=\s*([0-9.]+)", out, flags=re.I)
    if not m:
        m = re.findall(r"PPL\s*[=:]\s*([0-9.]+)", out)
    if not m:
        raise RuntimeError("no perplexity in output:\n" + out)
    return float(m[-1]), out


def muser_token_ids(muser, model, text):
    """Token ids from `muser tokenize` (BOS included): its line of space-separated integers."""
    out = sh([muser, "tokenize", "-m", model, "-p", text])
    for line in out.splitlines():
        if re.fullmatch(r"\d+( \d+)*", line.strip()):
            return [int(x) for x in line.split()]
    raise RuntimeError("no token ids in `muser tokenize` output:\n" + out)


def check_logits_against(muser, gguf_path, cfg, w, tokens, ref_logits, log):
    """NMSEs of numpy-reference and muser logits against ref_logits."""
    res = {}
    if w is not None:
        res["numpy_vs_ref_nmse"] = muse_ref.nmse(muse_ref.forward(cfg, w, tokens), ref_logits)
        log(f"numpy reference vs reference logits: NMSE {res['numpy_vs_ref_nmse']:.3e}")
    z = muser_logits(muser, gguf_path, tokens)
    assert z.shape == ref_logits.shape, (z.shape, ref_logits.shape)
    res["muser_vs_ref_nmse"] = muse_ref.nmse(z, ref_logits)
    log(f"muser logits vs reference logits: NMSE {res['muser_vs_ref_nmse']:.3e} (max {NMSE_MAX})")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muser", default=os.path.join(ROOT, "target", "release", "muser"))
    ap.add_argument("--run", default=os.path.join(HERE, "work", "run"))
    ap.add_argument("--work", default=os.path.join(HERE, "work"))
    ap.add_argument("--f32", default=os.path.join(HERE, "work", "muse-default-f32.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "muse-default.gguf"))
    ap.add_argument("--types", default="Q4_K_M,Q6_K,Q8_0",
                    help="quantization types to try in order; the first that passes is kept")
    ap.add_argument("--summary", default=os.path.join(HERE, "work", "check.json"))
    a = ap.parse_args()
    from export import load_run

    cfg, w, report = load_run(a.run)
    if not os.path.exists(a.f32):
        muse_ref.write_gguf(a.f32, cfg, w, os.path.join(a.work, "tokenizer.json"))
    summary = {"report": {k: report[k] for k in ("val_ppl", "unigram_val_ppl", "n_params", "chosen")}}
    ok = True
    tokens = np.load(os.path.join(a.run, "ref_tokens.npy"))
    ref = np.load(os.path.join(a.run, "ref_logits.npy"))
    summary.update(check_logits_against(a.muser, a.f32, cfg, w, tokens, ref, print))
    ok &= summary["muser_vs_ref_nmse"] <= NMSE_MAX

    # Tokenizer agreement on held-out text.
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.work, "tokenizer.json"))
    text = open(os.path.join(a.work, "val.txt")).read()
    docs = text.split("\n\n")[:50]
    if "tokenize" in sh([a.muser, "--help"]):
        mismatch = 0
        for d in docs:
            want = [0] + tok.encode(d, add_special_tokens=False).ids
            got = muser_token_ids(a.muser, a.f32, d)
            mismatch += got != want
        summary["tokenizer_mismatched_docs"] = f"{mismatch}/{len(docs)}"
        print(f"tokenizer: {mismatch} of {len(docs)} held-out documents tokenized differently")
        ok &= mismatch == 0
    else:
        summary["tokenizer_mismatched_docs"] = "skipped: this muser has no tokenize command"
        print(summary["tokenizer_mismatched_docs"])

    # Unigram baseline on the same text and positions as `muser perplexity -c 512`
    # (BOS + the file's tokens, chunks of 512, the last 255 of each chunk scored),
    # with add-one smoothed counts of the training stream.
    ids = np.asarray([0] + tok.encode(text, add_special_tokens=False).ids)
    counts = np.bincount(np.load(os.path.join(a.work, "train.npy")).astype(np.int64),
                         minlength=cfg["vocab_size"]) + 1.0
    logp = np.log(counts / counts.sum())
    scored = [ids[c * 512 + 257: (c + 1) * 512] for c in range(len(ids) // 512)]
    summary["unigram_ppl_same_positions"] = float(np.exp(-logp[np.concatenate(scored)].mean()))
    print(f"unigram baseline on the same positions: {summary['unigram_ppl_same_positions']:.1f}")
    ppl_f32, out = muser_perplexity(a.muser, a.f32, os.path.join(a.work, "val.txt"))
    summary["ppl_f32"] = ppl_f32
    print(f"F32 perplexity on held-out text: {ppl_f32:.3f}")
    summary["quant"] = {}
    kept = None
    for ty in a.types.split(","):
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        q = a.out + f".{ty}.tmp"
        sh([a.muser, "quantize", a.f32, q, ty])
        size = os.path.getsize(q)
        ppl_q, _ = muser_perplexity(a.muser, q, os.path.join(a.work, "val.txt"))
        rel = ppl_q / ppl_f32 - 1
        passed = size <= SIZE_MAX and abs(rel) <= PPL_REL_MAX
        summary["quant"][ty] = {"bytes": size, "ppl": ppl_q, "rel": rel, "pass": passed}
        print(f"{ty}: {size} bytes, perplexity {ppl_q:.3f} ({rel * 100:+.2f}% vs F32) "
              f"{'PASS' if passed else 'FAIL'}")
        if passed and kept is None:
            kept = ty
            os.makedirs(os.path.dirname(a.out), exist_ok=True)
            os.replace(q, a.out)
        else:
            os.remove(q)
    summary["kept"] = kept
    ok &= kept is not None
    if kept:
        zq = muser_logits(a.muser, a.out, tokens)
        summary["quant_vs_ref_nmse"] = muse_ref.nmse(zq, ref)
        print(f"kept {kept} as {a.out}; its logits vs PyTorch's: NMSE {summary['quant_vs_ref_nmse']:.3e}")
    summary["pass"] = bool(ok)
    json.dump(summary, open(a.summary, "w"), indent=1)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
