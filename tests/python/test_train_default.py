"""The default model's pipeline (issue 7, scripts/train_default/) on a tiny slice, in CI.

Training needs PyTorch, which CI does not have (PyPI's wheel is CUDA-enabled and huge), so
the CI path is numpy-only: the training script's PyTorch forward is mirrored by a
framework-free numpy forward (scripts/train_default/muse_ref.py), and what CI checks is
everything after training, end to end:
- data prep on a small synthetic %-separated corpus: document split, seeded 5% held-out
  split by document, a byte-level BPE trained on the training split, <bos> doc <eos> streams;
- export of a tiny randomly initialised `muse` model (every feature: sliding and full
  layers, a window shorter than the text, GQA, QK norm, gate, sandwich norms, logit scale
  and softcap) plus the trained tokenizer to GGUF, with every metadata key of SPEC section 2;
- `muser logits` on that GGUF agrees with the numpy forward (NMSE <= 2e-3), on token ids and
  on text tokenized by Muser (so the exported tokenizer agrees with the HF one too), and the
  check is sharp enough to tell a missing window, RoPE or full layer apart;
- the shipped models/muse-default.gguf has the geometry, metadata and size issue 7 asks for.
Where PyTorch is installed, the PyTorch model is also checked against the numpy forward.

The binary is $MUSER_BIN, else target/release/muser (`cargo build --release -p muser-cli`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "train_default"
sys.path.insert(0, str(SCRIPTS))

import muse_ref  # noqa: E402
import prepare  # noqa: E402

TINY = dict(muse_ref.DEFAULT_CONFIG, n_layer=4, d_model=64, d_ff=128, n_head=2, n_kv_head=1,
            head_dim=32, sliding_window=8, context_length=128)

WORDS = ("the a cat dog computer program user system time once upon there was old man woman "
         "who said never always bug feature write read code happy sad night day long short "
         "little big wise fool question answer life world love work").split()


def synthetic_docs(n=400, seed=7):
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        lines = []
        for _ in range(int(rng.integers(1, 4))):
            words = rng.choice(WORDS, size=int(rng.integers(4, 12)))
            lines.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ","]))
        if i % 5 == 0:
            lines.append("\t\t-- Mark Twain")
        docs.append("\n".join(lines))
    return docs


def muser_bin() -> Path:
    b = Path(os.environ.get("MUSER_BIN", REPO / "target" / "release" / "muser"))
    if not b.exists():
        pytest.fail(f"{b} not found: run `cargo build --release -p muser-cli` or set MUSER_BIN")
    return b


def muser_logits(model: Path, out: Path, tokens=None, prompt=None) -> np.ndarray:
    cmd = [str(muser_bin()), "logits", "-m", str(model), "--out", str(out), "-t", "2"]
    cmd += ["--tokens", ",".join(map(str, tokens))] if tokens is not None else ["-p", prompt]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out)


def test_split_documents_on_percent_lines():
    text = "First one.\n\t-- A\n%\nSecond\nline two\n%\n\n%\nThird %not a separator\n%\n"
    assert prepare.split_documents(text) == [
        "First one.\n\t-- A", "Second\nline two", "Third %not a separator"]


def test_holdout_is_seeded_five_percent_by_document():
    docs = [f"doc {i}" for i in range(1000)]
    tr, va = prepare.split_train_val(docs)
    assert len(va) == 50 and len(tr) == 950
    assert set(tr).isdisjoint(va) and set(tr) | set(va) == set(docs)
    assert prepare.split_train_val(docs) == (tr, va)  # same seed, same split
    assert prepare.split_train_val(docs, seed=1)[1] != va


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    pytest.importorskip("tokenizers")
    work = tmp_path_factory.mktemp("work")
    stats = prepare.prepare(str(work), docs=synthetic_docs(), vocab_size=320, log=lambda s: None)
    return work, stats


def test_prepare_tiny_slice(prepared):
    work, stats = prepared
    from tokenizers import Tokenizer

    assert stats["val_documents"] == 20 and stats["train_documents"] == 380
    tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    assert tok.get_vocab_size() == stats["vocab_size"] == 320
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    for name in ("train.npy", "val.npy"):
        s = np.load(work / name)
        assert s.dtype == np.uint16 and s[0] == bos and s[-1] == eos
        assert (s == bos).sum() == (s == eos).sum()
    val_docs = (work / "val.txt").read_text().rstrip("\n").split("\n\n")
    assert len(val_docs) == 20
    # the held-out stream is exactly the held-out documents, framed
    v = np.load(work / "val.npy").tolist()
    want = []
    for d in val_docs:
        want += [bos] + tok.encode(d, add_special_tokens=False).ids + [eos]
    assert v == want
    # byte-level BPE round-trips text exactly, and learned merges
    assert tok.decode(tok.encode(val_docs[0]).ids) == val_docs[0]
    assert len(tok.encode("the computer program").ids) < len("the computer program")
    assert stats["unigram_val_ppl"] > 1


@pytest.fixture(scope="module")
def tiny_gguf(prepared, tmp_path_factory):
    work, stats = prepared
    cfg = dict(TINY, vocab_size=stats["vocab_size"])
    w = muse_ref.random_weights(cfg, seed=3)
    w["output.weight"] *= 30.0  # logits of tens, so the softcap (30) bends them
    path = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    muse_ref.write_gguf(str(path), cfg, w, str(work / "tokenizer.json"), name="tiny")
    return path, cfg, w, work


def test_gguf_metadata_and_tensors(tiny_gguf):
    import gguf

    path, cfg, w, work = tiny_gguf
    r = gguf.GGUFReader(str(path))
    f = {k: v for k, v in r.fields.items()}

    def val(key):
        return f[key].contents()

    assert val("general.architecture") == "muse"
    ints = {"block_count": "n_layer", "embedding_length": "d_model", "feed_forward_length": "d_ff",
            "attention.head_count": "n_head", "attention.head_count_kv": "n_kv_head",
            "attention.key_length": "head_dim", "attention.value_length": "head_dim",
            "vocab_size": "vocab_size", "context_length": "context_length",
            "attention.sliding_window": "sliding_window",
            "attention.full_attention_interval": "full_attention_interval"}
    for k, c in ints.items():
        assert val("muse." + k) == cfg[c], k
    floats = {"attention.layer_norm_rms_epsilon": "norm_eps",
              "attention.post_norm_rms_epsilon": "post_norm_eps", "rope.freq_base": "rope_base",
              "logit_scale": "logit_scale", "final_logit_softcapping": "softcap"}
    for k, c in floats.items():
        assert val("muse." + k) == pytest.approx(cfg[c], rel=1e-6), k
    assert val("tokenizer.ggml.model") == "gpt2" and val("tokenizer.ggml.pre") == "default"
    tokens = val("tokenizer.ggml.tokens")
    assert len(tokens) == cfg["vocab_size"] and tokens[:2] == ["<|bos|>", "<|eos|>"]
    assert "Ġ" in tokens  # byte-level unicode form of the space byte
    types = val("tokenizer.ggml.token_type")
    assert types[:2] == [3, 3] and set(types[2:]) == {1}
    merges = val("tokenizer.ggml.merges")
    assert len(merges) == cfg["vocab_size"] - 258 and all(len(m.split(" ")) == 2 for m in merges)
    assert val("tokenizer.ggml.bos_token_id") == 0 and val("tokenizer.ggml.eos_token_id") == 1
    assert val("tokenizer.ggml.add_bos_token") is True
    names = {t.name: t for t in r.tensors}
    assert set(names) == set(muse_ref.tensor_shapes(cfg))
    for n, shape in muse_ref.tensor_shapes(cfg).items():
        assert list(names[n].shape) == list(reversed(shape)), n  # GGUF dims innermost first
        assert np.array_equal(np.asarray(names[n].data).reshape(shape), w[n]), n


def test_muser_logits_match_reference_forward(tiny_gguf, tmp_path):
    path, cfg, w, work = tiny_gguf
    toks = np.load(work / "val.npy")[:40].astype(np.int64)
    assert toks.size > 4 * cfg["sliding_window"]
    ref = muse_ref.forward(cfg, w, toks)
    got = muser_logits(path, tmp_path / "l.npy", tokens=toks.tolist())
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    err = muse_ref.nmse(got, ref)
    assert err <= 2e-3, err
    # The check is sharp: each feature changes the logits far beyond the tolerance.
    for change in (dict(sliding_window=10_000), dict(full_attention_interval=10_000),
                   dict(rope_base=500_000.0), dict(logit_scale=1.0), dict(softcap=5.0)):
        other = muse_ref.forward(dict(cfg, **change), w, toks)
        assert muse_ref.nmse(other, ref) > 50 * max(err, 1e-5), change


def test_muser_tokenizes_like_the_trainer(tiny_gguf, tmp_path):
    from tokenizers import Tokenizer

    path, cfg, w, work = tiny_gguf
    tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    text = (work / "val.txt").read_text().split("\n\n")[0] + "\nOnce upon a time, 42 cats!"
    ids = [0] + tok.encode(text, add_special_tokens=False).ids  # add_bos_token = true
    assert len(ids) <= cfg["context_length"]
    ref = muse_ref.forward(cfg, w, ids)
    got = muser_logits(path, tmp_path / "p.npy", prompt=text)
    assert got.shape == ref.shape, "Muser's tokenization differs from the HF tokenizer's"
    assert muse_ref.nmse(got, ref) <= 2e-3


def test_check_script_helpers(tiny_gguf, tmp_path):
    import check

    path, cfg, w, work = tiny_gguf
    toks = np.load(work / "val.npy")[:24]
    ref = muse_ref.forward(cfg, w, toks)
    res = check.check_logits_against(str(muser_bin()), str(path), cfg, w, toks, ref, lambda s: None)
    assert res["numpy_vs_ref_nmse"] == 0.0 and res["muser_vs_ref_nmse"] <= 2e-3
    ppl, _ = check.muser_perplexity(str(muser_bin()), str(path), str(work / "val.txt"), ctx=32)
    assert np.isfinite(ppl) and ppl > 1.0


def test_torch_model_matches_reference_forward():
    torch = pytest.importorskip("torch")
    from model_torch import Muse

    torch.manual_seed(0)
    cfg = dict(TINY, vocab_size=300)
    m = Muse(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights
        for n, p in m.named_parameters():
            if p.dim() == 1:
                p.mul_(1 + 0.1 * torch.randn_like(p))
    toks = np.random.default_rng(0).integers(0, 300, size=40)
    with torch.no_grad():
        z = m(torch.from_numpy(toks)[None])[0].numpy()
    assert muse_ref.nmse(muse_ref.forward(cfg, m.gguf_state(), toks), z) < 1e-8


def test_shipped_default_model():
    import gguf

    path = REPO / "models" / "muse-default.gguf"
    assert path.exists()
    assert path.stat().st_size <= 10 * 1000 * 1000
    r = gguf.GGUFReader(str(path))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert f["general.architecture"] == "muse"
    cfg = muse_ref.DEFAULT_CONFIG
    assert f["muse.block_count"] == cfg["n_layer"] and f["muse.embedding_length"] == cfg["d_model"]
    assert f["muse.attention.sliding_window"] < f["muse.context_length"]
    n = f["muse.block_count"]
    full = [i for i in range(n) if (i + 1) % f["muse.attention.full_attention_interval"] == 0]
    assert 0 < len(full) < n  # both kinds of layer
    assert f["muse.attention.head_count_kv"] < f["muse.attention.head_count"]  # GQA
    assert f["muse.logit_scale"] != 1.0 and f["muse.final_logit_softcapping"] > 0
    names = {t.name: t for t in r.tensors}
    assert set(names) == set(muse_ref.tensor_shapes(cfg))
    for t in r.tensors:
        if t.name.endswith("norm.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        else:
            assert t.tensor_type.name in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"), (t.name, t.tensor_type)
