#!/usr/bin/env python3
"""Data preparation for Muser's default model (issue 7).

Source: Debian's `fortunes` and `fortunes-min` packages (BSD-licensed fortune
cookie files, see README.md). The script downloads the .deb files itself with
`apt-get download` when they are missing, extracts them with `dpkg -x`, splits
every cookie file on its `%` lines into documents (one fortune = one document),
holds out 5% of the documents with a seeded shuffle, trains a byte-level BPE
(HF `tokenizers`, GPT-2 pre-tokenizer regex) on the training documents only,
and writes token streams  <|bos|> doc <|eos|> <|bos|> doc <|eos|> ...

Outputs (in --work, default scripts/train_default/work/):
  tokenizer.json      the HF tokenizer
  train.npy, val.npy  uint16 token streams
  val.txt             held-out documents joined by blank lines (for `muser perplexity`)
  stats.json          counts and the unigram baseline
"""
import argparse
import glob
import json
import math
import os
import random
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ["fortunes", "fortunes-min"]
# Files of pictures, not prose.
EXCLUDE = {"art", "ascii-art"}
SPECIALS = ["<|bos|>", "<|eos|>"]
SEED = 1234


def fetch_debs(data_dir):
    """Download and extract the Debian packages unless already extracted."""
    root = os.path.join(data_dir, "root")
    stamp = os.path.join(data_dir, "extracted.stamp")
    if os.path.exists(stamp):
        return root
    os.makedirs(data_dir, exist_ok=True)
    debs = glob.glob(os.path.join(data_dir, "*.deb"))
    have = {os.path.basename(d).split("_")[0] for d in debs}
    missing = [p for p in PACKAGES if p not in have]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=data_dir, check=True)
    for deb in sorted(glob.glob(os.path.join(data_dir, "*.deb"))):
        subprocess.run(["dpkg", "-x", deb, root], check=True)
    open(stamp, "w").write("\n".join(sorted(os.listdir(data_dir))) + "\n")
    return root


def cookie_files(root):
    d = os.path.join(root, "usr", "share", "games", "fortunes")
    out = []
    for p in sorted(glob.glob(os.path.join(d, "*"))):
        name = os.path.basename(p)
        if os.path.islink(p) or name.endswith(".dat") or "." in name or name in EXCLUDE:
            continue
        out.append(p)
    return out


def split_documents(text):
    """Fortune files separate documents by lines holding exactly '%'."""
    docs, cur = [], []
    for line in text.split("\n"):
        if line.strip() == "%":
            docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line.rstrip())
    docs.append("\n".join(cur))
    docs = [d.strip("\n") for d in docs]
    return [d for d in docs if d.strip()]


def load_documents(paths):
    docs = []
    for p in paths:
        raw = open(p, "rb").read()
        text = raw.decode("utf-8", errors="replace").replace("\r", "")
        docs.extend(split_documents(text))
    return docs


def split_train_val(docs, frac=0.05, seed=SEED):
    idx = list(range(len(docs)))
    random.Random(seed).shuffle(idx)
    n_val = max(1, int(round(len(docs) * frac)))
    val = set(idx[:n_val])
    train_docs = [d for i, d in enumerate(docs) if i not in val]
    val_docs = [d for i, d in enumerate(docs) if i in val]
    return train_docs, val_docs


def train_tokenizer(train_docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # ByteLevel with use_regex=True applies GPT-2's split pattern ("default" in GGUF).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer=trainer)
    return tok


def encode_stream(tok, docs):
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.append(bos)
        out.extend(enc.ids)
        out.append(eos)
    return np.asarray(out, dtype=np.uint16)


def unigram_baseline(train, val, vocab):
    """Cross-entropy (nats/token) of a add-one-smoothed unigram model on val."""
    counts = np.bincount(train.astype(np.int64), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val.astype(np.int64)].mean())


def prepare(work, data_dir=None, vocab_size=4096, docs=None, log=print):
    os.makedirs(work, exist_ok=True)
    if docs is None:
        root = fetch_debs(data_dir or os.path.join(HERE, "data"))
        docs = load_documents(cookie_files(root))
    train_docs, val_docs = split_train_val(docs)
    tok = train_tokenizer(train_docs, vocab_size)
    tok.save(os.path.join(work, "tokenizer.json"))
    train = encode_stream(tok, train_docs)
    val = encode_stream(tok, val_docs)
    np.save(os.path.join(work, "train.npy"), train)
    np.save(os.path.join(work, "val.npy"), val)
    with open(os.path.join(work, "val.txt"), "w") as f:
        f.write("\n\n".join(val_docs) + "\n")
    vocab = tok.get_vocab_size()
    ce = unigram_baseline(train, val, vocab)
    stats = {
        "documents": len(docs), "train_documents": len(train_docs), "val_documents": len(val_docs),
        "train_bytes": sum(len(d.encode()) for d in train_docs),
        "val_bytes": sum(len(d.encode()) for d in val_docs),
        "train_tokens": int(train.size), "val_tokens": int(val.size), "vocab_size": vocab,
        "unigram_val_nats": ce, "unigram_val_ppl": math.exp(ce), "seed": SEED,
    }
    json.dump(stats, open(os.path.join(work, "stats.json"), "w"), indent=1)
    log(json.dumps(stats))
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.path.join(HERE, "work"))
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    prepare(a.work, a.data, a.vocab)


if __name__ == "__main__":
    sys.exit(main())
