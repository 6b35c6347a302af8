#!/usr/bin/env python3
"""Side-by-side comparison of Muser with llama.cpp on the same GGUF files (issue 3).

1. Logit agreement. For each model (by default the synthetic presets `llama-tiny` and
   `qwen3-tiny`, written with `muser synth`), llama.cpp's `llama-perplexity -c N
   --kl-divergence-base base.bin` tokenizes an English text, evaluates it in chunks of N
   tokens (the first token of each chunk replaced by BOS where the vocabulary asks for one)
   and stores the log-probabilities of the second half of every chunk (positions
   N/2 .. N-2). This script reads that file, checks that `muser tokenize` gives the same token
   ids, evaluates exactly the same chunks with `muser logits --tokens ...`, and computes the
   statistics of llama.cpp's `--kl-divergence` mode with llama.cpp as the reference P and
   Muser as Q: mean KL(P||Q), same top-1 rate, perplexities, RMS of Δp. Issue 3's target:
   mean KL < 0.01 and same top-1 >= 98%.

   As a check of this reader, the script also writes Muser's log-probabilities in the same
   format and lets llama-perplexity itself compute `--kl-divergence` against them (that is
   KL(Muser || llama.cpp), the reverse direction; both must be small).

2. CPU speed (--bench): `llama-bench` and `muser bench` on the same file (by default the
   `llama-1b` preset) with the same threads, alternated over several rounds, each run
   preceded by the 1-minute load average (other processes disturb timings on small
   machines). llama.cpp runs with each of its weight layouts (`--repack 0,1`, see
   --llama-repack) and its best row per test counts. Prints both tables and the ratios
   Muser/llama.cpp.

Usage:
    python3 scripts/compare_llamacpp.py --llama-bin DIR [--muser target/release/muser]
        [--text FILE] [--ctx 256] [--presets llama-tiny,qwen3-tiny] [--model FILE ...]
        [--bench [--bench-model FILE] [--bench-rounds 2] [-p 512] [-n 128] [-r 3]
                 [--llama-repack 0,1]]
        [--json results.json]

Exit status: 0 when every compared model meets the targets, 1 otherwise, 2 on a failure to
run (llama.cpp refusing a file, a Muser command failing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO / "scripts" / "llamacpp_compare" / "english.txt"
KL_MAX = 0.01
SAME_TOP_MIN = 0.98


class RunError(Exception):
    pass


def run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        raise RunError(f"{what} failed (exit {p.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return p


# ------------------------------------------------------------------------------------------
# llama-perplexity's --kl-divergence-base file (tools/perplexity/perplexity.cpp):
#   "_logits_" | u32 n_ctx | i32 n_vocab | i32 n_chunk | i32 tokens[n_chunk*n_ctx]
#   then per chunk, n_ctx-1-n_ctx/2 rows (positions n_ctx/2 .. n_ctx-2 of the chunk) of
#   nv = 2*((n_vocab+1)/2)+4 u16: f32 scale, f32 min_log_prob, u16 q[n_vocab] (+pad),
#   log p[i] = scale*q[i] + min_log_prob (values below max-16 are clamped to q = 0).


@dataclass
class BaseFile:
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # int32 [n_chunk*n_ctx]
    scale: np.ndarray  # f32 [n_chunk, n_pos]
    min_log_prob: np.ndarray  # f32 [n_chunk, n_pos]
    q: np.ndarray  # u16 [n_chunk, n_pos, n_vocab]

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def n_pos(self) -> int:
        return self.n_ctx - 1 - self.n_ctx // 2

    def log_probs(self, chunk: int) -> np.ndarray:
        """f32 [n_pos, n_vocab], computed in f32 as llama.cpp does."""
        return (self.scale[chunk][:, None] * self.q[chunk].astype(np.float32)
                + self.min_log_prob[chunk][:, None]).astype(np.float32)


def read_base(path: Path) -> BaseFile:
    raw = path.read_bytes()
    if raw[:8] != b"_logits_":
        raise RunError(f"{path}: not a llama-perplexity logits file (magic {raw[:8]!r})")
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<Iii", raw, 8)
    off = 20
    tokens = np.frombuffer(raw, dtype="<i4", count=n_chunk * n_ctx, offset=off).copy()
    off += 4 * n_chunk * n_ctx
    nv = 2 * ((n_vocab + 1) // 2) + 4
    n_pos = n_ctx - 1 - n_ctx // 2
    need = off + 2 * nv * n_pos * n_chunk
    if len(raw) != need:
        raise RunError(f"{path}: {len(raw)} bytes, expected {need} for n_ctx={n_ctx} "
                       f"n_vocab={n_vocab} n_chunk={n_chunk}")
    rows = np.frombuffer(raw, dtype="<u2", offset=off).reshape(n_chunk, n_pos, nv)
    head = rows[:, :, :4].copy().view("<f4")  # [n_chunk, n_pos, 2]
    return BaseFile(n_ctx, n_vocab, n_chunk, tokens, head[:, :, 0].copy(), head[:, :, 1].copy(),
                    rows[:, :, 4:4 + n_vocab])


def write_base_like(path: Path, base: BaseFile, logits_per_chunk: list[np.ndarray]) -> None:
    """Write Muser's logits (the scored rows of every chunk) in llama-perplexity's format,
    quantized exactly as perplexity.cpp's log_softmax(..., uint16_t*, ...) does."""
    nv = 2 * ((base.n_vocab + 1) // 2) + 4
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(struct.pack("<Iii", base.n_ctx, base.n_vocab, base.n_chunk))
        f.write(base.tokens.astype("<i4").tobytes())
        for lg in logits_per_chunk:
            lg = lg.astype(np.float32)
            mx = lg.max(axis=1)
            mn = np.maximum(lg.min(axis=1), mx - 16)
            lse = np.log(np.exp((lg - mx[:, None]).astype(np.float64)).sum(axis=1)).astype(np.float32)
            min_lp = (mn - mx - lse).astype(np.float32)
            scale = ((mx - mn) / np.float32(65535)).astype(np.float32)
            out = np.zeros((lg.shape[0], nv), dtype="<u2")
            inv = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
            qv = np.rint(inv[:, None] * (lg - mn[:, None]))
            qv = np.where(lg > mn[:, None], qv, 0)
            out[:, 4:4 + base.n_vocab] = np.clip(qv, 0, 65535).astype("<u2")
            hdr = np.stack([scale, min_lp], axis=1).astype("<f4").view("<u2")
            out[:, :4] = hdr
            f.write(out.tobytes())


# ------------------------------------------------------------------------------------------
# Statistics (llama.cpp's kl_divergence(): P = base, Q = ours)


@dataclass
class Stats:
    kld: list = field(default_factory=list)
    same_top: int = 0
    near_tie_mismatch: int = 0
    count: int = 0
    nll: list = field(default_factory=list)
    nll_base: list = field(default_factory=list)
    gap_p: list = field(default_factory=list)
    top1_p: list = field(default_factory=list)
    p_diff: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)

    def add(self, logp_base: np.ndarray, logits: np.ndarray, next_tok: np.ndarray, chunk: int,
            first: int, scale: np.ndarray) -> None:
        logits = logits.astype(np.float32)
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp((logits - mx).astype(np.float64)).sum(axis=1, keepdims=True))
        logq = (logits - mx - lse).astype(np.float64)
        lpb = logp_base.astype(np.float64)
        keep = lpb > -16.0
        kld = np.where(keep, np.exp(lpb) * (lpb - logq), 0.0).sum(axis=1)
        top_q = logits.argmax(axis=1)
        top_p = logp_base.argmax(axis=1)
        rows = np.arange(len(next_tok))
        nll = -logq[rows, next_tok]
        nll_b = -lpb[rows, next_tok]
        self.kld.extend(kld.tolist())
        srt = np.sort(lpb, axis=1)
        self.gap_p.extend((srt[:, -1] - srt[:, -2]).tolist())
        self.top1_p.extend(np.exp(srt[:, -1]).tolist())
        self.nll.extend(nll.tolist())
        self.nll_base.extend(nll_b.tolist())
        self.p_diff.extend((np.exp(-nll) - np.exp(-nll_b)).tolist())
        same = top_q == top_p
        self.same_top += int(same.sum())
        self.count += len(next_tok)
        for r in np.nonzero(~same)[0]:
            # margins in nats: how far apart the two candidates are under each model
            m_base = float(lpb[r, top_p[r]] - lpb[r, top_q[r]])
            m_ours = float(logq[r, top_q[r]] - logq[r, top_p[r]])
            if m_base <= 2 * float(scale[r]) + 1e-6:
                self.near_tie_mismatch += 1
            self.mismatches.append(dict(chunk=chunk, pos=first + int(r), llama_top=int(top_p[r]),
                                        muser_top=int(top_q[r]), margin_llama=m_base,
                                        margin_muser=m_ours))

    def summary(self) -> dict:
        k = np.array(self.kld)
        n = len(k)
        pd = np.array(self.p_diff)
        return dict(
            positions=n,
            mean_kld=float(k.mean()),
            mean_kld_unc=float(k.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
            median_kld=float(np.median(k)),
            p99_kld=float(np.percentile(k, 99)),
            max_kld=float(k.max()),
            same_top=self.same_top / n,
            same_top_count=self.same_top,
            near_tie_mismatches=self.near_tie_mismatch,
            ppl_muser=float(math.exp(np.mean(self.nll))),
            # from the stored 16-bit log-probs, clamped at max-16: biased low on these files
            ppl_llamacpp_stored=float(math.exp(np.mean(self.nll_base))),
            llamacpp_top2_gap_below_0p05=float((np.array(self.gap_p) < 0.05).mean()),
            llamacpp_top2_gap_median=float(np.median(self.gap_p)),
            llamacpp_top1_prob_p10_50_90=[float(x) for x in
                                          np.percentile(self.top1_p, [10, 50, 90])],
            rms_dp=float(math.sqrt(np.mean(pd ** 2))),
            max_dp=float(np.abs(pd).max()),
        )


# ------------------------------------------------------------------------------------------
# GGUF metadata (just the keys needed here)


def gguf_meta(path: Path) -> dict:
    try:
        from gguf import GGUFReader
    except ImportError:  # fall back on `muser inspect`'s text
        return {}
    r = GGUFReader(str(path))
    out = {}
    for key in ("general.architecture", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.add_bos_token"):
        f = r.fields.get(key)
        if f is None:
            continue
        v = f.parts[f.data[0]]
        out[key] = bytes(v).decode() if key == "general.architecture" else v.tolist()[0]
    return out


# ------------------------------------------------------------------------------------------


def llama_perplexity(cmd: list[str], want: str, log_path: Path, tries: int = 20):
    """Run llama-perplexity; its asynchronous logger sometimes loses the last lines at exit
    (seen here in 2 to 3 runs out of 10, with exit status 0: the output stops after the
    second-to-last chunk; on the tiny presets, whose --kl-divergence pass takes 0.1 s, in 4 out
    of 10, --log-file alike), so rerun (up to `tries` times) until `want` is printed."""
    for _ in range(tries):
        p = subprocess.run(cmd, capture_output=True, text=True)
        log = p.stdout + p.stderr
        log_path.write_text(log)
        if p.returncode != 0 or re.search(want, log):
            break
    return p, log


def parse_kld_log(log: str) -> dict:
    out = {}
    for key, pat in (("mean_kld", r"Mean\s+KLD:\s+(-?[0-9.e+-]+)"),
                     ("median_kld", r"Median\s+KLD:\s+(-?[0-9.e+-]+)"),
                     ("max_kld", r"Maximum\s+KLD:\s+(-?[0-9.e+-]+)"),
                     ("same_top", r"Same top p:\s+([0-9.]+)"),
                     ("rms_dp_percent", r"RMS Δp\s*:\s*([0-9.]+)")):
        mm = re.search(pat, log)
        out[key] = float(mm.group(1)) if mm else None
    if out["same_top"] is not None:
        out["same_top"] /= 100.0
    return out


def compare_logits(args, model: Path, workdir: Path, label: str) -> dict:
    bindir = Path(args.llama_bin)
    text_file = Path(args.text)
    res: dict = dict(model=label, file=str(model))
    base_path = workdir / f"{model.stem}.llamacpp-base.bin"
    cmd = [str(bindir / "llama-perplexity"), "-m", str(model), "-f", str(text_file),
           "-c", str(args.ctx), "-t", str(args.threads), "--kl-divergence-base", str(base_path)]
    if args.chunks:
        cmd += ["--chunks", str(args.chunks)]
    p, log = llama_perplexity(cmd, r"Final estimate", workdir / f"{model.stem}.llama-perplexity.log")
    if p.returncode != 0 or not base_path.exists() or base_path.stat().st_size <= 20:
        errs = [l for l in log.splitlines()
                if re.search(r"error|fail|unknown|missing|invalid|not supported|cannot|refus|"
                             r"exception|abort", l, re.I)]
        res.update(status="LLAMA_CPP_REFUSED", exit=p.returncode,
                   llama_cpp_says=errs[-15:] or log.strip().splitlines()[-15:])
        return res
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", log)
    res["llama_perplexity_final_ppl"] = float(m.group(1)) if m else None
    base = read_base(base_path)
    res.update(n_ctx=base.n_ctx, n_vocab=base.n_vocab, n_chunk=base.n_chunk)

    # --- tokenizer agreement (llama.cpp stores the first n_chunk*n_ctx tokens of the text)
    text = text_file.read_text(encoding="utf-8")
    if text.endswith("\n"):  # llama.cpp's -f drops one trailing newline
        text = text[:-1]
    tk = run([args.muser, "tokenize", "-m", str(model), "-p", text], "muser tokenize")
    ours = np.array([int(x) for x in tk.stdout.split()], dtype=np.int64)
    ref = base.tokens.astype(np.int64)
    n_cmp = min(len(ours), len(ref))
    diff = np.nonzero(ours[:n_cmp] != ref[:n_cmp])[0]
    tok = dict(muser_tokens=len(ours), llamacpp_tokens_stored=len(ref), compared=n_cmp,
               mismatches=int(len(diff)) + (len(ref) - n_cmp))
    if len(diff):
        i = int(diff[0])
        tok["first_mismatch"] = dict(index=i, muser=ours[max(0, i - 3):i + 5].tolist(),
                                     llamacpp=ref[max(0, i - 3):i + 5].tolist())
    res["tokenizer"] = tok

    # --- logits: the same chunks, BOS substituted as llama.cpp does
    meta = gguf_meta(model)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    res["add_bos"] = add_bos
    stats = Stats()
    ours_scored = []
    t0 = time.time()
    for c in range(base.n_chunk):
        seq = base.tokens[c * base.n_ctx:(c + 1) * base.n_ctx].astype(np.int64).copy()
        if add_bos:
            seq[0] = bos
        out = workdir / f"{model.stem}.chunk{c}.npy"
        run([args.muser, "logits", "-m", str(model), "--tokens", ",".join(map(str, seq)),
             "--out", str(out), "--threads", str(args.threads)], "muser logits")
        lg = np.load(out)
        out.unlink()
        if lg.shape != (base.n_ctx, base.n_vocab):
            raise RunError(f"muser logits gave shape {lg.shape}, expected "
                           f"({base.n_ctx}, {base.n_vocab})")
        if not np.isfinite(lg).all():
            raise RunError(f"muser logits: non-finite values in chunk {c}")
        scored = lg[base.first:base.n_ctx - 1]
        ours_scored.append(scored)
        next_tok = base.tokens[c * base.n_ctx + base.first + 1:(c + 1) * base.n_ctx].astype(np.int64)
        stats.add(base.log_probs(c), scored, next_tok, c, base.first, base.scale[c])
    res["muser_logits_seconds"] = round(time.time() - t0, 2)
    s = stats.summary()
    res["stats"] = s
    res["mismatches"] = stats.mismatches[:20]
    res["pass"] = bool(s["mean_kld"] < KL_MAX and s["same_top"] >= SAME_TOP_MIN
                       and tok["mismatches"] == 0)
    res["status"] = "PASS" if res["pass"] else "FAIL"

    # --- cross-check: llama-perplexity computes KL(ours || llama.cpp) from our file
    if args.crosscheck:
        ours_path = workdir / f"{model.stem}.muser-base.bin"
        write_base_like(ours_path, base, ours_scored)
        cmd = [str(bindir / "llama-perplexity"), "-m", str(model), "-c", str(args.ctx),
               "-t", str(args.threads), "--kl-divergence-base", str(ours_path), "--kl-divergence"]
        p, log = llama_perplexity(cmd, r"Same top p:", workdir / f"{model.stem}.llama-kld.log")
        res["llamacpp_crosscheck"] = dict(exit=p.returncode, **parse_kld_log(log))

    # --- noise floor: llama.cpp against itself, token by token (-ub 1: its decode kernels)
    # instead of the batched prefill that wrote the base file
    if args.calibrate:
        cmd = [str(bindir / "llama-perplexity"), "-m", str(model), "-c", str(args.ctx),
               "-b", str(args.ctx), "-ub", "1", "-t", str(args.threads),
               "--kl-divergence-base", str(base_path), "--kl-divergence"]
        p, log = llama_perplexity(cmd, r"Same top p:", workdir / f"{model.stem}.llama-self.log")
        res["llamacpp_self_ub1"] = dict(exit=p.returncode, **parse_kld_log(log))
    return res


def print_logit_result(r: dict) -> None:
    print(f"\n== {r['model']}  ({r['file']})")
    if r["status"] == "LLAMA_CPP_REFUSED":
        print(f"   llama.cpp REFUSED the file (exit {r['exit']}); it says:")
        for l in r["llama_cpp_says"]:
            print("     " + l)
        return
    t = r["tokenizer"]
    print(f"   chunks {r['n_chunk']} x n_ctx {r['n_ctx']}, vocab {r['n_vocab']}, add_bos {r['add_bos']}")
    print(f"   tokenizer: muser {t['muser_tokens']} tokens, llama.cpp stored {t['llamacpp_tokens_stored']}"
          f", mismatches in the common prefix: {t['mismatches']}"
          + (f"  first at {t['first_mismatch']}" if "first_mismatch" in t else ""))
    s = r["stats"]
    print(f"   positions scored        {s['positions']}")
    print(f"   mean KL(llama.cpp||muser) {s['mean_kld']:.6f} ± {s['mean_kld_unc']:.6f}"
          f"   (median {s['median_kld']:.6f}, 99% {s['p99_kld']:.6f}, max {s['max_kld']:.6f})"
          f"   target < {KL_MAX}")
    print(f"   same top-1              {100 * s['same_top']:.2f}% ({s['same_top_count']}/{s['positions']},"
          f" {s['near_tie_mismatches']} of the mismatches within llama.cpp's 16-bit storage step)"
          f"   target >= {100 * SAME_TOP_MIN:.0f}%")
    print(f"   PPL over the scored positions: muser {s['ppl_muser']:.4f}, llama-perplexity's final"
          f" estimate {r.get('llama_perplexity_final_ppl')}")
    print(f"   positions where llama.cpp's top-2 log-probs are < 0.05 nats apart: "
          f"{100 * s['llamacpp_top2_gap_below_0p05']:.1f}% (median gap "
          f"{s['llamacpp_top2_gap_median']:.2f}); its top-1 probability p10/p50/p90: "
          + "/".join(f"{x:.2f}" for x in s['llamacpp_top1_prob_p10_50_90']))
    print(f"   RMS Δp {100 * s['rms_dp']:.4f}%   max |Δp| {100 * s['max_dp']:.4f}%")
    for mm in r["mismatches"][:5]:
        print(f"     top-1 mismatch: {mm}")
    xc = r.get("llamacpp_crosscheck")
    if xc:
        print(f"   check of this reader: llama-perplexity --kl-divergence with Muser's logits as base"
              f" (reverse KL): mean KLD {xc['mean_kld']}, same top {xc['same_top']}")
    sc = r.get("llamacpp_self_ub1")
    if sc:
        print(f"   noise floor: llama.cpp token by token (-ub 1) against its own batched base:"
              f" mean KLD {sc['mean_kld']}, same top {sc['same_top']}")
    print(f"   => {r['status']}")


# ------------------------------------------------------------------------------------------
# Speed


def loadavg() -> float:
    return os.getloadavg()[0]


def cpu_busy_seconds() -> float:
    """CPU seconds (all cores) spent not idle since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user nice system irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for_quiet(max_load: float, max_wait: float) -> float:
    t0 = time.time()
    while loadavg() > max_load and time.time() - t0 < max_wait:
        time.sleep(5)
    return loadavg()


ROW = re.compile(r"^\|(.+)\|\s*$")


def parse_tables(text: str) -> dict[str, tuple[float, float, list[str]]]:
    """{test: (mean, sd, cells)} from a llama-bench style markdown table; where a test has
    several rows (llama-bench over a list of settings, e.g. `--repack 0,1`), the fastest."""
    out = {}
    for line in text.splitlines():
        m = ROW.match(line.strip())
        if not m:
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        for i, c in enumerate(cells):
            if re.fullmatch(r"(pp|tg)\d+", c) and i + 1 < len(cells):
                mm = re.match(r"([0-9.]+)\s*±\s*([0-9.]+)", cells[i + 1])
                if mm and (c not in out or float(mm.group(1)) > out[c][0]):
                    out[c] = (float(mm.group(1)), float(mm.group(2)), cells)
    return out


def bench(args, workdir: Path) -> dict:
    if args.bench_model:
        model = Path(args.bench_model)
    else:
        model = workdir / "llama-1b.gguf"
        if not model.exists():
            print(f"writing {model} (muser synth llama-1b) ...", flush=True)
            run([args.muser, "synth", "llama-1b", str(model)], "muser synth llama-1b")
    bindir = Path(args.llama_bin)
    rounds = []
    for rnd in range(args.bench_rounds):
        for engine in ("llama.cpp", "muser"):
            load = wait_for_quiet(args.max_load, args.max_wait)
            if engine == "llama.cpp":
                cmd = [str(bindir / "llama-bench"), "-m", str(model), "-t", str(args.threads),
                       "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", str(args.reps)]
                # Each weight layout llama.cpp offers, its best per test: on x86 its default
                # repacks Q4_K for a kernel that prefills at ~0.6x its tiled path (--repack 0)
                if args.llama_repack:
                    cmd += ["--repack", args.llama_repack]
            else:
                cmd = [args.muser, "bench", "-m", str(model), "--threads", str(args.threads),
                       "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", str(args.reps)]
            t0 = time.time()
            busy0, child0 = cpu_busy_seconds(), children_cpu_seconds()
            p = run(cmd, f"{engine} bench")
            wall = time.time() - t0
            # CPU time that other processes took while this benchmark ran, as a share of
            # all cores: the disturbance (the load average lags by a minute)
            others = (cpu_busy_seconds() - busy0) - (children_cpu_seconds() - child0)
            others_pct = 100 * max(0.0, others) / (wall * (os.cpu_count() or 1))
            text = p.stdout + "\n" + p.stderr
            load_after = loadavg()
            rows = parse_tables(p.stdout)
            rounds.append(dict(round=rnd, engine=engine, load_before=load, load_after=load_after,
                               seconds=round(wall, 1), others_cpu_percent=round(others_pct, 1),
                               results={k: (v[0], v[1]) for k, v in rows.items()},
                               table=[l for l in p.stdout.splitlines() if l.startswith("|")],
                               extra=[l for l in text.splitlines()
                                      if re.search(r"bandwidth|build:", l)]))
            print(f"round {rnd} {engine}: load {load:.2f} -> {load_after:.2f}, other processes"
                  f" {others_pct:.1f}% of the CPUs: "
                  + ", ".join(f"{k} {v[0]:.2f} ± {v[1]:.2f}" for k, v in rows.items()), flush=True)
    best = {}
    # per engine and test, the best mean over the quiet rounds (other processes below
    # --quiet-cpu percent of the CPUs), else over all rounds
    for r in rounds:
        for test, (mean, sd) in r["results"].items():
            key = (r["engine"], test)
            quiet = r["others_cpu_percent"] < args.quiet_cpu
            if (key not in best or (quiet, mean) > (best[key][4] < args.quiet_cpu, best[key][0])):
                best[key] = (mean, sd, r["round"], r["load_before"], r["others_cpu_percent"])
    ratios = {}
    for (engine, test), v in best.items():
        if engine == "muser" and ("llama.cpp", test) in best:
            ratios[test] = v[0] / best[("llama.cpp", test)][0]
    return dict(model=str(model), rounds=rounds,
                best={f"{e} {t}": v for (e, t), v in best.items()}, ratios=ratios)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True,
                    help="folder with llama-perplexity (and llama-bench for --bench)")
    ap.add_argument("--muser", default=str(REPO / "target" / "release" / "muser"))
    ap.add_argument("--text", default=str(DEFAULT_TEXT), help="English text to evaluate")
    ap.add_argument("--ctx", type=int, default=256, help="chunk length (llama-perplexity -c)")
    ap.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--presets", default="llama-tiny,qwen3-tiny",
                    help="comma-separated `muser synth` presets to compare ('' for none)")
    ap.add_argument("--seed", type=int, default=0, help="synth seed")
    ap.add_argument("--model", action="append", default=[], help="also compare this GGUF file")
    ap.add_argument("--no-crosscheck", dest="crosscheck", action="store_false",
                    help="skip llama-perplexity's own --kl-divergence on Muser's logits")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="skip llama.cpp token-by-token against its own batched logits")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    ap.add_argument("--bench", action="store_true", help="also run the speed comparison")
    ap.add_argument("--bench-only", action="store_true", help="only the speed comparison")
    ap.add_argument("--bench-model", help="GGUF for --bench (default: synth llama-1b)")
    ap.add_argument("--bench-rounds", type=int, default=2)
    ap.add_argument("--llama-repack", default="0,1",
                    help="llama-bench --repack settings to run, the best per test counts"
                         " ('' for llama-bench's default only)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--max-load", type=float, default=1.0,
                    help="before each benchmark run, wait until the 1-min load average is below this")
    ap.add_argument("--quiet-cpu", type=float, default=5.0,
                    help="a round counts as quiet when other processes used less than this %% "
                         "of the CPUs while it ran")
    ap.add_argument("--max-wait", type=float, default=300, help="... but at most this many seconds")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()

    if not Path(args.muser).exists():
        print(f"no muser binary at {args.muser} (cargo build --release -p muser-cli)", file=sys.stderr)
        return 2
    tmp = None
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="muser-vs-llamacpp-")
        workdir = Path(tmp.name)

    results: dict = dict(date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), logits=[])
    try:
        results["cpu"] = next((l.split(":", 1)[1].strip() for l in
                               run(["lscpu"], "lscpu").stdout.splitlines()
                               if l.startswith("Model name")), None)
    except (RunError, FileNotFoundError):
        results["cpu"] = None
    status = 0
    try:
        if not args.bench_only:
            models = []
            for preset in [p for p in args.presets.split(",") if p]:
                f = workdir / f"{preset}.gguf"
                run([args.muser, "synth", preset, str(f), "--seed", str(args.seed)],
                    f"muser synth {preset}")
                models.append((preset, f))
            models += [(Path(m).name, Path(m)) for m in args.model]
            for label, f in models:
                r = compare_logits(args, f, workdir, label)
                results["logits"].append(r)
                print_logit_result(r)
                if r["status"] == "LLAMA_CPP_REFUSED":
                    status = 2
                elif not r["pass"] and status == 0:
                    status = 1
        if args.bench or args.bench_only:
            b = bench(args, workdir)
            results["bench"] = b
            print("\nspeed (best round per engine and test):")
            for k, v in sorted(b["best"].items()):
                print(f"   {k:>18}: {v[0]:9.2f} ± {v[1]:.2f} t/s  (round {v[2]}, load {v[3]:.2f},"
                      f" others {v[4]:.1f}% CPU)")
            for t, v in b["ratios"].items():
                print(f"   {t}: muser / llama.cpp = {v:.3f}")
    except RunError as e:
        print(f"\nERROR: {e}", file=sys.stderr)
        results["error"] = str(e)
        status = 2
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if tmp is not None:
        tmp.cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
