"""`muser run` as a user runs it on the shipped model: greedy output is reproducible, a
`--logit-bias` forces or bans a token as llama.cpp's does, llama.cpp's other samplers (typical-p,
top-n-sigma, XTC, dynamic temperature, mirostat) take llama-cli's flags and draw reproducibly by
seed, generation stops cleanly when the context is full, a prompt file (`-f`) reads as llama-cli reads it, and out-of-range options are
clear errors. Then the CLI's edges: bad input to `run`, `bench`, `perplexity`, `logits` and
`quantize` is a clear error (never a panic, an abort, a hang or a wrong number), `quantize` never
destroys its input or leaves a truncated output, and a closed stdout is an error in every
command, not a panic."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MUSER = os.environ.get("MUSER_BIN", str(REPO / "target" / "release" / "muser"))
MODEL = str(REPO / "models" / "muse-default.gguf")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MUSER, "run", "-m", MODEL, "--threads", "2", *args],
                          capture_output=True, text=True, timeout=120)


def tokens(text: str) -> list[int]:
    r = subprocess.run([MUSER, "tokenize", "-m", MODEL, "-p", text], capture_output=True,
                       text=True, timeout=60, check=True)
    return [int(t) for t in r.stdout.split()]


PROMPT = "The sky is"


def greedy(*extra: str, n: int = 4) -> str:
    r = run("-p", PROMPT, "-n", str(n), "--temp", "0", *extra)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(PROMPT)
    return r.stdout[len(PROMPT):].rstrip("\n")


def test_logit_bias_forces_and_bans_tokens():
    base = greedy()
    assert base == greedy()  # greedy is reproducible
    # The prompt's own tokens, with BOS, then the greedy continuation's first token.
    first = tokens(PROMPT + base)[len(tokens(PROMPT))]
    banned = greedy("--logit-bias", f"{first}-inf")
    assert banned != base
    assert tokens(PROMPT + banned)[len(tokens(PROMPT))] != first
    # +100 on a token makes it every pick.
    forced = tokens(" moon")[-1]
    out = greedy("-l", f"{forced}+100", n=3)
    assert tokens(PROMPT + out)[len(tokens(PROMPT)):] == [forced] * 3


def test_a_full_context_stops_generation_cleanly():
    n_prompt = len(tokens(PROMPT))
    r = run("-p", PROMPT, "-n", "50", "--temp", "0", "--ctx-size", str(n_prompt + 3))
    assert r.returncode == 0, r.stderr
    assert f"the context of {n_prompt + 3} tokens is full" in r.stderr
    # The context holds the prompt and 3 decoded tokens; the 4th is written without decoding.
    assert "decode:  3 tokens" in r.stderr


def test_bad_options_are_named():
    for args, says in [
        (["--top-p", "7"], "--top-p 7 is out of range"),
        (["--min-p", "-0.5"], "--min-p -0.5 is out of range"),
        (["--repeat-penalty", "0"], "--repeat-penalty 0 is out of range"),
        (["--temp", "-1"], "--temp -1 is out of range"),
        (["-l", "12"], "expected TOKEN_ID+BIAS"),
        (["-l", "x+1"], "'x' is not a token id"),
        (["-l", "5+big"], "is not a bias"),
        (["-l", "999999+1"], "token 999999 is past the vocabulary"),
        (["--temp", "inf"], "--temp inf is out of range"),
        (["--temp", "nan"], "--temp NaN is out of range"),
        (["--top-p=-inf"], "--top-p -inf is out of range"),
        (["--min-p", "nan"], "--min-p NaN is out of range"),
        (["--repeat-penalty", "inf"], "--repeat-penalty inf is out of range"),
        (["--xtc-probability", "2"], "--xtc-probability 2 is out of range"),
        (["--xtc-threshold=-0.1"], "--xtc-threshold -0.1 is out of range"),
        (["--mirostat", "3"], "--mirostat must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got 3"),
        (["--mirostat", "-1"], "'--mirostat <MIROSTAT>'"),
        (["--typical", "nan"], "--typical must be a finite number, got NaN"),
        (["--top-nsigma", "inf"], "--top-nsigma must be a finite number, got inf"),
        (["--dynatemp-range", "x"], "'--dynatemp-range <DYNATEMP_RANGE>'"),
        (["--dynatemp-exp=-inf"], "--dynatemp-exp must be a finite number, got -inf"),
        (["--mirostat-lr", "nan"], "--mirostat-lr must be a finite number, got NaN"),
        (["--mirostat-ent", "inf"], "--mirostat-ent must be a finite number, got inf"),
        (["--dry-multiplier", "nan"], "--dry-multiplier"),
        (["--dry-penalty-last-n", "-1"], "'--dry-penalty-last-n <DRY_PENALTY_LAST_N>'"),
        (["--dry-allowed-length", "x"], "'--dry-allowed-length <DRY_ALLOWED_LENGTH>'"),
    ]:
        r = run("-p", "hi", "-n", "2", *args)
        assert r.returncode != 0, args
        assert says in r.stderr, (args, r.stderr)


def sampled(*extra: str, seed: str = "9") -> str:
    r = run("-p", PROMPT, "-n", "12", "--seed", seed, *extra)
    assert r.returncode == 0, (extra, r.stderr)
    return r.stdout[len(PROMPT):].rstrip("\n")


@pytest.mark.parametrize("flags", [
    ["--typical", "0.5"], ["--typical-p", "0.5"], ["--top-nsigma", "1.0"], ["--top-n-sigma", "1"],
    ["--xtc-probability", "0.5", "--xtc-threshold", "0.05"],
    ["--dynatemp-range", "0.5", "--dynatemp-exp", "1.5"],
    ["--mirostat", "1", "--mirostat-lr", "0.2", "--mirostat-ent", "4"], ["--mirostat", "2"],
    ["--dry-multiplier", "0.8", "--dry-base", "1.5", "--dry-allowed-length", "1",
     "--dry-penalty-last-n", "32", "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "."],
], ids=lambda f: " ".join(f))
def test_llama_cpp_sampler_flags_draw_reproducibly(flags):
    """llama-cli's flags for its other samplers: accepted, and a seed reproduces the text."""
    assert sampled(*flags) == sampled(*flags)


def test_greedy_with_xtc_leaves_the_argmax():
    # XTC at probability 1 removes every candidate at or above the threshold but the least
    # likely of them: greedy is then no longer greedy (the model's top pick at this prompt is
    # well above 0.05 and so is another's, at some step of 8).
    base = greedy(n=8)
    assert greedy("--xtc-probability", "1", "--xtc-threshold", "0.05", n=8) != base
    # With the threshold past 0.5 XTC is off.
    assert greedy("--xtc-probability", "1", "--xtc-threshold", "0.6", n=8) == base


def test_dry_breaks_a_greedy_loop():
    # The greedy continuation of this prompt loops ("year-year-year-..."); DRY steers it out,
    # with the default breakers, with its own, or with none.
    r = subprocess.run([MUSER, "run", "-m", MODEL, "--threads", "2", "-p", "Once upon a time",
                        "-n", "60", "--temp", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("year-") >= 4, r.stdout

    def dry(*extra: str) -> str:
        r = run("-p", "Once upon a time", "-n", "60", "--temp", "0", "--dry-multiplier", "2",
                *extra)
        assert r.returncode == 0, r.stderr
        return r.stdout

    text = dry()
    assert text != r.stdout and text.count("year-") < r.stdout.count("year-"), text
    assert dry("--dry-base", "0.5") == text  # below 1: the default, as llama-cli ignores it
    assert dry("--dry-sequence-breaker", "none").count("year-") < r.stdout.count("year-")


def test_prompt_from_a_file(tmp_path):
    # A prompt file as an editor saves it (ending in a newline, which is dropped, as llama-cli
    # drops it) gives what the same text given with -p gives; inner newlines are kept.
    text = "The sky is\nblue and the sea is"
    f = tmp_path / "prompt.txt"
    f.write_text(text + "\n")
    from_file = run("-f", str(f), "-n", "6", "--temp", "0")
    inline = run("-p", text, "-n", "6", "--temp", "0")
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == inline.stdout and from_file.stdout.startswith(text)
    assert f"prompt:  {len(tokens(text))} tokens" in from_file.stderr

    missing = run("-f", str(tmp_path / "nope.txt"))
    assert missing.returncode != 0 and "nope.txt" in missing.stderr
    both = run("-f", str(f), "-p", "hi")
    assert both.returncode != 0 and "cannot be used with" in both.stderr
    neither = run("-n", "2")
    assert neither.returncode != 0 and "--prompt" in neither.stderr


def muser(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([MUSER, *args], capture_output=True, text=True, timeout=timeout, **kw)


def assert_clean_error(r: subprocess.CompletedProcess, says: str) -> None:
    """Exit status 1 with `error: ...` naming the problem: no panic, abort or signal."""
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "panicked" not in r.stderr and "memory allocation" not in r.stderr, r.stderr
    assert says in r.stderr, (says, r.stderr[-2000:])


def n_vocab() -> int:
    r = muser("inspect", MODEL, "--max-array", "0")
    line = next(l for l in r.stdout.splitlines() if "tokenizer.ggml.tokens =" in l)
    return int(line.split("[String; ")[1].split("]")[0])


def test_run_stops_when_no_token_can_be_sampled():
    # Every token banned: no pick is possible, whatever the sampling path (greedy on the whole
    # row, top-k, the full chain); `run` must not print token 0 (<|bos|>) or a banned token.
    ban_all = [a for i in range(n_vocab()) for a in ("-l", f"{i}-inf")]
    for extra in (["--temp", "0"], ["--temp", "0.8"], ["--temp", "0.8", "--top-k", "0"]):
        r = run("-p", PROMPT, "-n", "4", *extra, *ban_all)
        assert_clean_error(r, "no token can be sampled")
        assert r.stdout == PROMPT, (extra, r.stdout)
    # All but one banned: that one every time.
    keep = tokens(" moon")[-1]
    some = [a for i in range(n_vocab()) if i != keep for a in ("-l", f"{i}-inf")]
    r = run("-p", PROMPT, "-n", "3", "--temp", "0.8", *some)
    assert r.returncode == 0, r.stderr
    assert tokens(r.stdout.rstrip("\n"))[len(tokens(PROMPT)):] == [keep] * 3


def test_a_prompt_that_does_not_fit_prints_nothing():
    n = len(tokens("a b c d e f g h"))
    r = run("-p", "a b c d e f g h", "-n", "2", "-c", "3")
    assert_clean_error(r, f"the prompt's {n} tokens do not fit the context of 3 tokens")
    assert r.stdout == ""


def test_a_prompt_past_the_training_context_is_warned_about(tmp_path):
    r = muser("inspect", MODEL)
    n_train = int(next(l for l in r.stdout.splitlines() if ".context_length =" in l).split()[-1])
    f = tmp_path / "long.txt"
    f.write_text("word " * (n_train + 50))
    n = len(tokens(f.read_text().rstrip("\n")))
    assert n > n_train
    r = run("-f", str(f), "-n", "2", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert f"warning: the prompt's {n} tokens are more than the model's training context of {n_train}" in r.stderr
    # A prompt inside the training context gets no warning.
    r = run("-p", PROMPT, "-n", "2", "--temp", "0")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_bench_refuses_what_it_cannot_hold():
    u64_max = str(2**64 - 1)
    for args, says in [
        (["-d", "100000000000"], "a context of 100000000512 tokens needs"),
        (["-p", "100000000000", "-n", "0"], "a context of 100000000000 tokens needs"),
        (["-p", "0", "-n", "100000000000"], "a context of 100000000000 tokens needs"),
        (["-p", "1", "-n", "0", "-d", u64_max], "the context (depth + tokens) overflows"),
        (["-p", "0", "-n", "1", "-d", u64_max], "the context (depth + tokens) overflows"),
        (["-p", "0", "-n", "4", "-s", "100000000"], "100000000 streams of 11 tokens of context"),
        (["-p", "0", "-n", "4", "-s", "2,0"], "a stream count must be at least 1"),
        (["-r", "0"], "at least 1 repetition"),
    ]:
        r = muser("bench", "-m", MODEL, "--backend", "cpu", "-t", "2", *args, timeout=60)
        assert_clean_error(r, says)
        assert "| model |" not in r.stdout, args


def test_perplexity_and_logits_refuse_bad_counts(tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("the sky is blue and the sea is green. " * 40)
    r = muser("perplexity", "-m", MODEL, "-f", str(f), "-c", str(2**64 - 1))
    assert_clean_error(r, f"you need at least {2 * (2**64 - 1)} tokens")
    r = muser("perplexity", "-m", MODEL, "-f", str(f), "-c", "16", "--chunks", "0")
    assert_clean_error(r, "--chunks: at least 1 chunk")
    r = muser("perplexity", "-m", MODEL, "-f", str(f), "-c", "16", "--chunks", "2")
    assert r.returncode == 0 and "[2]" in r.stdout and "[3]" not in r.stdout, r.stderr
    out = str(tmp_path / "l.npy")
    for bad, item in [("1,,2", 2), ("1,2,", 3), (",1", 1)]:
        r = muser("logits", "-m", MODEL, "--tokens", bad, "-o", out)
        assert_clean_error(r, f"item {item} is empty")
    r = muser("logits", "-m", MODEL, "--tokens", "1, 2", "-o", out)
    assert r.returncode == 0, r.stderr
    assert np.load(out).shape[0] == 2


def write_f32_gguf(path: Path, bad: dict[str, tuple[int, float]] | None = None) -> None:
    """A small GGUF of F32 weights (two matrices and a norm); `bad` puts a value at a flat index
    of a tensor."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    for name, shape in [("blk.0.attn_q.weight", (8, 256)), ("blk.0.attn_norm.weight", (256,)),
                        ("blk.0.ffn_up.weight", (4, 512))]:
        a = rng.standard_normal(shape).astype(np.float32)
        if bad and name in bad:
            i, v = bad[name]
            a.reshape(-1)[i] = v
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_quantize_never_writes_over_its_input(tmp_path):
    src = tmp_path / "in.gguf"
    write_f32_gguf(src)
    before = src.read_bytes()
    (tmp_path / "link.gguf").symlink_to("in.gguf")
    os.link(src, tmp_path / "hard.gguf")
    for out in ["in.gguf", "./in.gguf", str(src), "link.gguf", "hard.gguf"]:
        r = muser("quantize", "in.gguf", out, "Q8_0", cwd=tmp_path)
        assert_clean_error(r, "is the input file")
        assert src.read_bytes() == before, out
    # Through the symlink as the input, too.
    r = muser("quantize", "link.gguf", "in.gguf", "Q8_0", cwd=tmp_path)
    assert_clean_error(r, "is the input file")
    assert src.read_bytes() == before
    # Another file is written (and a symlink output keeps pointing at its file).
    (tmp_path / "out.gguf").write_bytes(b"old")
    (tmp_path / "out_link.gguf").symlink_to("out.gguf")
    r = muser("quantize", "in.gguf", "out_link.gguf", "Q8_0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out_link.gguf").is_symlink()
    r = muser("inspect", str(tmp_path / "out.gguf"))
    assert r.returncode == 0 and "Q8_0" in r.stdout, r.stderr
    # The replaced file keeps its permissions.
    (tmp_path / "out.gguf").chmod(0o640)
    r = muser("quantize", "in.gguf", "out.gguf", "Q4_K", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.gguf").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hard.gguf", "in.gguf", "link.gguf", "out.gguf", "out_link.gguf"]


def test_quantize_refuses_non_finite_weights_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "out.gguf"
    for name, (i, v), shown in [("blk.0.attn_q.weight", (300, np.nan), "NaN"),
                                ("blk.0.ffn_up.weight", (1029, np.inf), "inf"),
                                ("blk.0.attn_norm.weight", (7, -np.inf), "-inf")]:
        src = tmp_path / "bad.gguf"
        write_f32_gguf(src, {name: (i, v)})
        out.write_bytes(b"an earlier output")
        for ty in ["Q8_0", "Q4_K"]:
            r = muser("quantize", str(src), str(out), ty)
            assert_clean_error(r, f"tensor {name}: value {shown} at index {i}")
            assert out.read_bytes() == b"an earlier output"
            assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "out.gguf"]


def closed_stdout_run(*args: str) -> subprocess.CompletedProcess:
    """Runs muser with a stdout pipe whose reading end is already closed (`| head -c 0`)."""
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        return subprocess.run([MUSER, *args], stdout=w_fd, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(w_fd)


def test_a_closed_stdout_is_an_error_in_every_command(tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("the sky is blue and the sea is green. " * 40)
    for args in [
        ["synth", "--list"],
        ["tokenize", "-m", MODEL, "-p", "the sky is blue " * 50, "-v"],
        ["tokenize", "-m", MODEL, "-p", "the sky"],
        ["inspect", MODEL],
        ["bench", "-m", MODEL, "--backend", "cpu", "-t", "2", "-p", "8", "-n", "4", "-r", "1"],
        ["run", "-m", MODEL, "--backend", "cpu", "-p", PROMPT, "-n", "4"],
        ["perplexity", "-m", MODEL, "--backend", "cpu", "-f", str(f), "-c", "16", "--chunks", "2"],
    ]:
        r = closed_stdout_run(*args)
        assert_clean_error(r, "Broken pipe")


def write_embd_gguf(path, tied: bool, scale: float = 1.0):
    """An F32 llama with one layer and a token embedding, and an output matrix unless `tied`."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(9)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    names = [("token_embd.weight", (64, 256)), ("blk.0.attn_q.weight", (8, 256))]
    if not tied:
        names.append(("output.weight", (64, 256)))
    for name, shape in names:
        w.add_tensor(name, (scale * rng.standard_normal(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensor_types(path) -> dict:
    gguf = pytest.importorskip("gguf")
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def test_quantize_gives_a_tied_embedding_the_output_type(tmp_path):
    """As llama.cpp's quantizer: with no output.weight the token embedding is the output
    matrix too, and takes the output's type (Q6_K); with one, it keeps the base type."""
    for tied in [True, False]:
        src, out = tmp_path / f"in{tied}.gguf", tmp_path / f"out{tied}.gguf"
        write_embd_gguf(src, tied)
        for ty in ["Q4_K_M", "Q4_K", "Q5_K"]:
            r = muser("quantize", str(src), str(out), ty)
            assert r.returncode == 0, r.stderr
            types = tensor_types(out)
            base = "Q5_K" if ty == "Q5_K" else "Q4_K"
            assert types["token_embd.weight"] == ("Q6_K" if tied else base), (ty, types)
            assert types.get("output.weight", "Q6_K") == "Q6_K", (ty, types)
            assert types["blk.0.attn_q.weight"] == base, (ty, types)


def test_quantize_refuses_weights_the_type_cannot_hold(tmp_path):
    """Finite weights past what the type holds (an f16 scale overflows) are refused, and no
    output is left."""
    src, out = tmp_path / "big.gguf", tmp_path / "out.gguf"
    write_embd_gguf(src, tied=False, scale=1e30)
    for ty in ["Q8_0", "Q4_K"]:
        r = muser("quantize", str(src), str(out), ty)
        assert_clean_error(r, "reads back as")
        assert not out.exists()
