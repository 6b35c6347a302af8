"""The sampler against llama.cpp's: the same tokens, step after step, for the same seed,
parameters and logits (crates/muser-sample).

A few hundred random scenarios, over every sampler Muser has: logit biases (bans too), the
repetition, frequency and presence penalties, top-n-sigma, top-k, typical-p, top-p, min-p, XTC,
temperature (0 too) and dynamic temperature, min_keep, DRY, and mirostat 1.0 and 2.0 in their
own chain; vocabularies of 50 to 2000, some rows with -inf logits, 20 to 30 steps each, every pick
accepted into the penalties' window before the next. llama.cpp's side is
tests/python/llamacpp_sampler.cpp, compiled here against libllama (its public C API, the chain
common_sampler_init builds); Muser's is the example crates/muser-sample/examples/sample_io.rs. Both
read the same scenario lines and make the same rows from the line's seed.

The scenarios are drawn from a seed that changes every run (MUSER_SAMPLER_SEED sets it,
MUSER_SAMPLER_SCENARIOS their number); a failure names it and prints the first scenario whose
picks differ, a line that replays on its own: `echo LINE | sample_io` against
`echo LINE | llamacpp_sampler`.

The differences crates/muser-sample/src/steps.rs documents, all where llama.cpp's arithmetic or
order is undefined, are kept out of the scenarios by construction, not tolerated: typical-p never
meets a zero probability (no top-n-sigma, no -inf logit or ban, and logits spread too little to
underflow when it is on), XTC's threshold is above 0, and rows have distinct logits. A step where
a tie could still have decided the pick (equal logits made by a bias, a penalty or mirostat's
temperature; typical-p's equal distances, which distinct logits can have) is reported by the
harness, which stops the scenario there (` tie@S`): only the steps before it are compared, and
at most a tenth of the scenarios may stop (about 1 in 400 do).

DRY matches its breakers against a vocabulary's text: the shipped model's vocabulary
(models/muse-default.gguf), copied into a vocabulary-only GGUF that llama.cpp loads (its
architecture, muse, is unknown to llama.cpp). The harness loads it (--vocab) and writes every
token's text as llama.cpp's DRY sees it and the tokenizations the breakers need; sample_io builds
its `DryBreakers` from that file, so this compares DRY's breaker processing and its penalties,
not Muser's tokenizer. DRY scenarios start from a prefix of accepted tokens that repeats a
pattern (breaker tokens among them), so there are repeats to penalise.

Needs llama.cpp built from source: MUSER_GGML_SRC (its source directory) and LLAMA_CPP_BIN (the
directory of libllama.so), as scripts/test.sh exports them; skipped otherwise.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from libllama_harness import cargo_example, compile_harness, vocab_only_gguf

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("llamacpp_sampler.cpp")
MODEL = REPO / "models" / "muse-default.gguf"
# DRY's breakers: llama.cpp's defaults and longer ones that span tokens.
BREAKERS = ["\n", ":", '"', "*", "\n\n", "**", "User:", " the", "ing", ':-)', '..."', "\n  "]


@pytest.fixture(scope="session")
def llamacpp_sampler(tmp_path_factory) -> Path:
    """The harness, compiled against libllama."""
    # -ffp-contract=off: the harness's copy of typical-p's arithmetic rounds as libllama's does.
    return compile_harness(tmp_path_factory, HARNESS, "-ffp-contract=off")


@pytest.fixture(scope="session")
def sample_io() -> Path:
    """Builds the example once and returns its path."""
    return cargo_example("muser-sample", "sample_io")


@pytest.fixture(scope="session")
def dry_vocab(tmp_path_factory, llamacpp_sampler) -> dict:
    """The vocabulary for DRY: the GGUF llama.cpp loads, the file sample_io reads, the token texts
    and each breaker's tokenization."""
    tmp = tmp_path_factory.mktemp("vocab")
    model = tmp / "vocab.gguf"
    vocab_only_gguf(MODEL, model)
    run = lambda *args, stdin="": subprocess.run(  # noqa: E731
        [str(llamacpp_sampler), "--vocab", str(model), *args], input=stdin, capture_output=True, text=True,
        check=True).stdout.splitlines()
    pieces_lines = run("--pieces")
    pieces = [b"" if ln.split()[1] == "-" else bytes.fromhex(ln.split()[1]) for ln in pieces_lines]
    # Every proper suffix of every breaker (what DRY tokenizes), and each whole breaker.
    texts = sorted({b.encode()[i:] for b in BREAKERS for i in range(len(b.encode()))})
    tok_lines = run("--tokenize", stdin="".join(t.hex() + "\n" for t in texts))
    tokenized = {}
    for ln in tok_lines:
        parts = ln.split(" ")
        tokenized[bytes.fromhex(parts[1])] = [int(t) for t in parts[2].split(",") if t]
    path = tmp / "vocab.txt"
    path.write_text("".join(ln + "\n" for ln in pieces_lines + tok_lines))
    return {"model": model, "file": path, "pieces": pieces, "tokenized": tokenized}


def dry_keys(rng: random.Random, n: int, typical: bool, vocab: dict) -> dict:
    """DRY's parameters, breakers and a prefix history that repeats, for a row of n tokens."""
    on = lambda chance: rng.random() < chance  # noqa: E731
    breakers = rng.sample(BREAKERS, rng.randint(1, 5)) if on(0.85) else []
    # With typical-p on, penalties small enough that the logits stay within its range.
    d = {
        "dry_multiplier": round(rng.uniform(0.05, 0.5 if typical else 3.0), 3),
        "dry_base": 1.0 if on(0.1) else (round(rng.uniform(0.9, 1.1 if typical else 3.0), 3)),
        "dry_allowed_length": rng.choice([0, 1, 2, 2, 3, 4]),
        "dry_penalty_last_n": rng.choice([1, 4, 16] if typical else [1, 4, 16, 64, 64, 300]),
    }
    if breakers:
        d["dry_breakers"] = ",".join(b.encode().hex() for b in breakers)
    # Breaker tokens: those whose text holds or starts a breaker, and the breakers' tokenizations.
    marks = [b.encode() for b in breakers]
    special = [i for i, p in enumerate(vocab["pieces"][:n]) if any(m[:1] in p for m in marks)]
    seqs = [[t for t in vocab["tokenized"][m] if t < n] for m in marks]
    pool = rng.sample(range(n), min(n, rng.randint(2, 12))) + rng.sample(special, min(len(special), 4))
    pattern = [rng.choice(pool) for _ in range(rng.randint(1, 8))]
    prefix: list[int] = []
    for _ in range(rng.randint(0, 40)):
        r = rng.random()
        prefix += pattern if r < 0.6 else rng.choice(seqs) if r < 0.7 and seqs else [rng.choice(pool)]
    if prefix:
        d["prefix"] = ",".join(map(str, prefix[-rng.randint(1, 200):]))
    # Biases that make the picks follow the pattern (and the breakers), for DRY to break.
    if on(0.8):
        loop = set(pattern + [t for q in seqs for t in q])
        d["loop_bias"] = ",".join(f"{t}:{round(rng.uniform(1.0, 3.0 if typical else 12.0), 3)}" for t in loop)
    return d


def scenario(rng: random.Random, vocab: dict) -> dict:
    """One random scenario: the rows to make and every parameter of the chain."""
    on = lambda chance: rng.random() < chance  # noqa: E731
    n = int(math.exp(rng.uniform(math.log(50), math.log(2000))))
    mirostat = rng.choices([0, 1, 2], [0.7, 0.15, 0.15])[0]
    # Typical-p's entropy turns NaN in llama.cpp on a zero probability: with it on, no -inf
    # logit (no row of them, no ban, no top-n-sigma mask) and a spread that cannot underflow
    # expf: logits within about 70 of each other (the row's +-16 at scale 8, a repeat penalty of
    # 0.8 to 1.5, at most 30 counts of a frequency penalty of 0.5, presence 1, biases of +-5).
    typical = mirostat == 0 and on(0.35)
    s = {
        "row_seed": rng.randrange(2**32),
        "n_vocab": n,
        "scale": round(math.exp(rng.uniform(math.log(0.1), math.log(8.0))), 3),
        "steps": rng.randint(20, 30),
        "neg_inf": 0.0 if typical or not on(0.25) else round(rng.uniform(0.05, 0.6), 3),
        "temperature": 0.0 if on(0.2) else round(rng.uniform(0.1, 2.0), 3),
        "top_k": 0 if on(0.3) else int(math.exp(rng.uniform(0, math.log(n + 10)))),
        "top_p": 1.0 if on(0.4) else round(rng.uniform(0.1, 0.999), 3),
        "min_p": 0.0 if on(0.4) else round(rng.uniform(0.001, 0.5), 4),
        "typical_p": round(rng.uniform(0.05, 0.99), 3) if typical else 1.0,
        "top_n_sigma": round(rng.uniform(0.2, 3.0), 3) if not typical and on(0.4) else -1.0,
        "xtc_probability": 0.0 if on(0.5) else round(rng.uniform(0.05, 1.0), 3),
        # Above 0 (at 0 llama.cpp counts a zero probability as above it); above 0.5 is off.
        "xtc_threshold": round(rng.uniform(0.01, 0.6), 3),
        "dynatemp_range": 0.0 if on(0.6) else round(rng.uniform(0.05, 2.0), 3),
        "dynatemp_exponent": round(rng.uniform(0.0, 3.0), 3),
        "mirostat": mirostat,
        "mirostat_tau": round(rng.uniform(0.5, 10.0), 3),
        "mirostat_eta": round(rng.uniform(0.01, 1.0), 3),
        "min_keep": 0 if on(0.5) else rng.randint(1, 20),
        "repeat_last_n": rng.choice([0, 1, 8, 64]),
        "repeat_penalty": 1.0 if on(0.4) else round(rng.uniform(0.8, 1.5), 3),
        "frequency_penalty": 0.0 if on(0.6) else round(rng.uniform(0.0, 0.5), 3),
        "presence_penalty": 0.0 if on(0.6) else round(rng.uniform(0.0, 1.0), 3),
        # LLAMA_DEFAULT_SEED (2^32 - 1) means a random seed to llama.cpp.
        "seed": rng.randrange(2**32 - 1),
    }
    if on(0.3):
        # A few biases, sometimes on an id past the row (ignored) and, without typical-p, bans.
        bias = []
        for _ in range(rng.randint(1, 5)):
            b = float("-inf") if not typical and on(0.3) else round(rng.uniform(-5.0, 5.0), 3)
            bias.append(f"{rng.randrange(n + 5)}:{b}")
        s["logit_bias"] = ",".join(bias)
    if on(0.4):
        s.update(dry_keys(rng, n, typical, vocab))
        loop = s.pop("loop_bias", None)
        if loop:
            s["logit_bias"] = s["logit_bias"] + "," + loop if "logit_bias" in s else loop
    return s


def line(s: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in s.items())


def features(s: dict) -> list[str]:
    """The samplers a scenario turns on, for the coverage count."""
    if s["mirostat"]:
        on = [f"mirostat{s['mirostat']}"]
    else:
        on = [name for name, active in [
            ("penalties", s["repeat_last_n"] > 0 and (s["repeat_penalty"] != 1 or s["frequency_penalty"] > 0
                                                      or s["presence_penalty"] > 0)),
            ("top_n_sigma", s["top_n_sigma"] > 0), ("top_k", s["top_k"] > 0), ("typical_p", s["typical_p"] < 1),
            ("top_p", s["top_p"] < 1), ("min_p", s["min_p"] > 0),
            ("xtc", s["xtc_probability"] > 0 and s["xtc_threshold"] <= 0.5),
            ("dynatemp", s["dynatemp_range"] > 0), ("greedy", s["temperature"] == 0 and s["dynatemp_range"] == 0),
            ("min_keep", s["min_keep"] > 0),
            ("dry", s.get("dry_multiplier", 0) != 0 and s["dry_base"] >= 1 and s["dry_penalty_last_n"] > 0),
            ("dry_breakers", "dry_breakers" in s and s["dry_multiplier"] != 0),
        ] if active]
    if "logit_bias" in s:
        on.append("ban" if "-inf" in s["logit_bias"] else "logit_bias")
    if s["neg_inf"] > 0:
        on.append("-inf rows")
    return on


def run_lines(exe: Path, lines: list[str], args: list[str]) -> list[str]:
    r = subprocess.run([str(exe), *args], input="\n".join(lines) + "\n", capture_output=True, text=True)
    assert r.returncode == 0, f"{exe.name} failed: {r.stderr}"
    out = r.stdout.splitlines()
    assert len(out) == len(lines), f"{exe.name} answered {len(out)} lines to {len(lines)}"
    return out


def test_picks_match_llama_cpp(llamacpp_sampler, sample_io, dry_vocab):
    seed = int(os.environ.get("MUSER_SAMPLER_SEED", time.time_ns() % 2**32))
    count = int(os.environ.get("MUSER_SAMPLER_SCENARIOS", 400))
    print(f"scenario seed {seed} (MUSER_SAMPLER_SEED={seed} replays this run)")
    rng = random.Random(seed)
    scenarios = [scenario(rng, dry_vocab) for _ in range(count)]
    lines = [line(s) for s in scenarios]
    theirs = run_lines(llamacpp_sampler, lines, ["--vocab", str(dry_vocab["model"])])
    ours = run_lines(sample_io, lines, ["--vocab", str(dry_vocab["file"])])

    compared, tied = 0, 0
    for i, (text, want_text, got_text) in enumerate(zip(lines, theirs, ours)):
        want_picks, _, tie = want_text.partition(" tie@")
        want = want_picks.split(",") if want_picks else []
        got = got_text.split(",")
        if tie:
            tied += 1
            got = got[: int(tie)]
        assert got == want, (
            f"scenario {i} of seed {seed}: the picks differ from step "
            f"{next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))}\n"
            f"  scenario: {text}\n  llama.cpp: {want_text}\n  muser:     {got_text}"
        )
        compared += len(want)

    coverage = {}
    for s in scenarios:
        for f in features(s):
            coverage[f] = coverage.get(f, 0) + 1
    print(f"{count} scenarios, {compared} picks compared, {tied} stopped at a tie; coverage {coverage}")
    # The tie check must not quietly stand in for the comparison.
    assert tied <= count // 10, f"{tied} of {count} scenarios stopped at a tie (seed {seed})"
    want_features = ["mirostat1", "mirostat2", "penalties", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p",
                     "xtc", "dynatemp", "greedy", "min_keep", "logit_bias", "ban", "-inf rows", "dry",
                     "dry_breakers"]
    missing = [f for f in want_features if coverage.get(f, 0) < count // 50]
    assert not missing, f"too few scenarios with {missing}: {coverage} (seed {seed})"
