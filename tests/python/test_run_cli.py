"""`muser run` as a user runs it on the shipped model: greedy output is reproducible, a
`--logit-bias` forces or bans a token as llama.cpp's does, generation stops cleanly when the
context is full, a prompt file (`-f`) reads as llama-cli reads it, and out-of-range options are
clear errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
    ]:
        r = run("-p", "hi", "-n", "2", *args)
        assert r.returncode != 0, args
        assert says in r.stderr, (args, r.stderr)


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
