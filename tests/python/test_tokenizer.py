"""Muser's tokenizer against HF `tokenizers` on byte-level BPE vocabularies trained here.

A ~2000-token byte-level BPE is trained with HF `tokenizers` on the docstrings of a few stdlib
modules (plus some non-ASCII text), written into a tensor-less GGUF with gguf-python's
GGUFWriter (tokenizer.ggml.model "gpt2"), and `muser tokenize` must give HF's ids on many
strings: ASCII, unicode, digits, whitespace runs, contractions, random mixes. Each
`tokenizer.ggml.pre` checked (default, llama-bpe, qwen2, and a name for several more of the
pattern sets llama.cpp maps names to) is compared with the matching HF pre-tokenizer, so our
regexes are compared with HF's own regex engine. A name llama.cpp does not know is refused.

The binary is $MUSER_BIN (or target/release/muser, target/debug/muser) when it has the
`tokenize` subcommand; otherwise the same command built as the example
`cargo build -p muser-tokenizer --example tokenize`.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")
from gguf import GGUFWriter  # noqa: E402
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 2000
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The pre-tokenizer patterns as the models' tokenizer.json files state them.
PATTERN_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PATTERN_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


PATTERN_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PATTERN_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PATTERN_DEEPSEEK3 = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def split_then_bytes(*patterns: str) -> "pre_tokenizers.PreTokenizer":
    """HF's pre-tokenizer for a list of patterns: each splits ("isolated"), then bytes."""
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns]
    return pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                      use_regex=False)])


# llama.cpp `tokenizer.ggml.pre` names beyond the three above, each with the pre-tokenizer its
# models' tokenizer.json states and HF's ignore_merges setting.
OTHER_PRE = {
    "deepseek-r1-qwen": (lambda: split_then_bytes(PATTERN_QWEN2), False),
    "smaug-bpe": (lambda: split_then_bytes(PATTERN_LLAMA3), False),
    "tekken": (lambda: split_then_bytes(PATTERN_TEKKEN), True),
    "gpt-4o": (lambda: split_then_bytes(PATTERN_GPT4O), False),
    "deepseek-v3": (lambda: split_then_bytes(r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
                                             PATTERN_DEEPSEEK3), False),
    "smollm": (lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]), False),
}


def muser_command() -> list[str]:
    candidates = [os.environ.get("MUSER_BIN")] + [
        str(REPO / "target" / p / "muser") for p in ("release", "debug")
    ]
    for c in candidates:
        if c and Path(c).exists():
            probe = subprocess.run([c, "tokenize", "--help"], capture_output=True)
            if probe.returncode == 0:
                return [c, "tokenize"]
    subprocess.run(
        ["cargo", "build", "-q", "-p", "muser-tokenizer", "--example", "tokenize"], cwd=REPO, check=True
    )
    return [str(REPO / "target" / "debug" / "examples" / "tokenize")]


def corpus() -> list[str]:
    import collections
    import email
    import email.message
    import email.parser
    import json as json_module
    import textwrap

    texts = []
    for mod in (email, email.message, email.parser, json_module, collections, textwrap):
        texts.append(inspect.getdoc(mod) or "")
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    texts += [
        "Naïve café résumé — déjà vu; Straße, Ærø, ﬁne.",
        "日本語のテキストです。中文文本也在这里。한국어 문장입니다.",
        "Emoji 🎉🦀👍🏽 and numbers 1234567890, 3.14159, 2024-01-01.",
        "It's they're we've I'm you'll he'd IT'S THEY'RE",
    ] * 20
    return texts


def make_hf(kind: str) -> "tokenizers.Tokenizer":
    if kind in OTHER_PRE:
        make_pre, ignore_merges = OTHER_PRE[kind]
        return train_hf(models.BPE(ignore_merges=ignore_merges), make_pre())
    if kind == "default":
        model = models.BPE()
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        model = models.BPE(ignore_merges=(kind == "llama-bpe"))
        pattern = PATTERN_LLAMA3 if kind == "llama-bpe" else PATTERN_QWEN2
        pre = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return train_hf(model, pre)


def train_hf(model, pre) -> "tokenizers.Tokenizer":
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIALS,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_gguf(tok: "tokenizers.Tokenizer", pre: str, path: Path) -> None:
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|endoftext|>"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sample_strings() -> list[str]:
    fixed = [
        "Hello world",
        "hello, world!",
        "The JSON decoder parses a str instance containing a JSON document.",
        "   leading spaces",
        "trailing spaces   ",
        "tabs\tand\nnewlines\r\n\n\n  mixed  \t ",
        "many     spaces    between",
        "digits 1 12 123 1234 12345 123456 3.14159 1,000,000",
        "it's don't they're we've I'm you'll he'd IT'S DON'T WE'VE",
        "'s 're 'll 'x '",
        "Naïve café résumé — déjà vu",
        "日本語のテキスト 中文 한국어",
        "emoji 🎉🦀 👍🏽 mixed🎉text",
        "symbols !!! ??? ... --- === +++ @#$%^&*()[]{}<>|\\/~`",
        "email.message.Message.get_payload(decode=True)",
        "\u00a0nbsp\u2028line\u3000ideographic space",
        "x",
        " ",
        "\n",
        "",
    ]
    rng = random.Random(1234)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        "   \n\t",
        ".,;:!?'\"()-_/",
        "éèàüößçñ",
        "日本語中文한국어",
        "🎉🦀👍",
    ]
    rand = []
    for _ in range(150):
        s = ""
        for _ in range(rng.randint(1, 20)):
            pool = rng.choice(pools)
            s += "".join(rng.choice(pool) for _ in range(rng.randint(1, 6)))
        rand.append(s)
    long = "\n\n".join(corpus()[:40])[:10000]  # a 10 KB prompt
    return fixed + rand + [long]


@pytest.fixture(scope="module")
def muser() -> list[str]:
    return muser_command()


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2", *OTHER_PRE])
def test_ids_match_hf(pre: str, muser: list[str], tmp_path: Path) -> None:
    hf = make_hf(pre)
    assert hf.get_vocab_size() == VOCAB_SIZE
    path = tmp_path / f"tok-{pre}.gguf"
    write_gguf(hf, pre, path)
    mismatches = []
    for s in sample_strings():
        want = hf.encode(s, add_special_tokens=False).ids
        out = subprocess.run(
            muser + ["-m", str(path), "-p", s, "--no-add-special"], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        got = [int(x) for x in out.stdout.split()]
        if got != want:
            mismatches.append((s, want, got))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]}"


def test_special_tokens_match_hf(muser: list[str], tmp_path: Path) -> None:
    hf = make_hf("qwen2")
    path = tmp_path / "tok.gguf"
    write_gguf(hf, "qwen2", path)
    s = "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n"
    want = hf.encode(s, add_special_tokens=False).ids
    run = lambda *extra: subprocess.run(  # noqa: E731
        muser + ["-m", str(path), "-p", s, "--no-add-special", *extra], capture_output=True, text=True, check=True
    )
    assert [int(x) for x in run("--parse-special").stdout.split()] == want
    # Without --parse-special the control tokens are plain text.
    plain = [int(x) for x in run().stdout.split()]
    assert hf.token_to_id("<|im_start|>") not in plain
    assert hf.decode(plain, skip_special_tokens=False) == s


def test_verbose_and_bad_file(muser: list[str], tmp_path: Path) -> None:
    hf = make_hf("default")
    path = tmp_path / "tok.gguf"
    write_gguf(hf, "default", path)
    out = subprocess.run(muser + ["-m", str(path), "-p", "héllo", "-v"], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith(f"{len(hf.encode('héllo').ids)} tokens")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    out = subprocess.run(muser + ["-m", str(bad), "-p", "x"], capture_output=True, text=True)
    assert out.returncode != 0 and "panicked" not in out.stderr


def test_unknown_pre_tokenizer_is_refused(muser: list[str], tmp_path: Path) -> None:
    """A `tokenizer.ggml.pre` llama.cpp does not know is refused at load, naming it, rather
    than tokenized with GPT-2's pattern (which would give the model ids it never saw)."""
    hf = make_hf("qwen2")
    path = tmp_path / "tok.gguf"
    write_gguf(hf, "totally-unknown", path)
    out = subprocess.run(muser + ["-m", str(path), "-p", "IT'S 2024"], capture_output=True, text=True)
    assert out.returncode != 0 and "panicked" not in out.stderr
    assert '"totally-unknown"' in out.stderr and "tokenizer.ggml.pre" in out.stderr, out.stderr
