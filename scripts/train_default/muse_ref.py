"""Framework-free reference of the `muse` architecture (SPEC section 2) and its GGUF export.

Weights are a dict from GGUF tensor name to a float32 numpy array in row-major
(out, in) layout: numpy shape (out, in) is GGUF dims [in, out] (innermost first).
Used by the training pipeline (export + check) and by the CI test, which needs
numpy and gguf only.
"""
import json
import math

import numpy as np

# The shipped default model's geometry (also the trainer's).
DEFAULT_CONFIG = {
    "n_layer": 8,
    "d_model": 256,
    "d_ff": 768,
    "n_head": 4,
    "n_kv_head": 2,
    "head_dim": 64,
    "vocab_size": 4096,
    "context_length": 512,
    "sliding_window": 128,
    "full_attention_interval": 4,
    "rope_base": 10000.0,
    "norm_eps": 1e-5,
    "post_norm_eps": 1e-8,
    "logit_scale": 0.5,
    "softcap": 30.0,
}


def is_full_layer(cfg, i):
    """Layer i is a full-attention NoPE layer iff (i+1) % interval == 0."""
    return (i + 1) % cfg["full_attention_interval"] == 0


def tensor_shapes(cfg):
    """GGUF tensor names and their numpy shapes (out, in)."""
    d, f, v = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    hq = cfg["n_head"] * cfg["head_dim"]
    hk = cfg["n_kv_head"] * cfg["head_dim"]
    s = {"token_embd.weight": (v, d)}
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        s.update({
            p + "attn_norm.weight": (d,),
            p + "attn_q.weight": (hq, d),
            p + "attn_k.weight": (hk, d),
            p + "attn_v.weight": (hk, d),
            p + "attn_gate.weight": (hq, d),
            p + "attn_q_norm.weight": (cfg["head_dim"],),
            p + "attn_k_norm.weight": (cfg["head_dim"],),
            p + "attn_output.weight": (d, hq),
            p + "post_attention_norm.weight": (d,),
            p + "ffn_norm.weight": (d,),
            p + "ffn_gate.weight": (f, d),
            p + "ffn_up.weight": (f, d),
            p + "ffn_down.weight": (d, f),
            p + "post_ffw_norm.weight": (d,),
        })
    s["output_norm.weight"] = (d,)
    s["output.weight"] = (v, d)
    return s


def random_weights(cfg, seed=0, std=0.05):
    """Random weights with sane statistics (norm weights near 1)."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in tensor_shapes(cfg).items():
        if len(shape) == 1:
            w[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            w[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return w


def rmsnorm(x, w, eps):
    x = x.astype(np.float32)
    r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return r if w is None else r * w


def rope_interleaved(x, positions, base):
    """GPT-J rotation of pairs (x[2j], x[2j+1]) by theta_j = p * base^(-2j/dim). x: (T, H, D)."""
    dim = x.shape[-1]
    j = np.arange(dim // 2, dtype=np.float64)
    theta = positions[:, None].astype(np.float64) * base ** (-2.0 * j / dim)  # (T, D/2)
    c = np.cos(theta)[:, None, :].astype(np.float32)
    s = np.sin(theta)[:, None, :].astype(np.float32)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward(cfg, w, tokens):
    """Logits (T, vocab) of every position of one sequence starting at position 0."""
    tokens = np.asarray(tokens, dtype=np.int64)
    T = tokens.size
    H, KV, D = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    eps, peps = cfg["norm_eps"], cfg["post_norm_eps"]
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]
    window = causal & (pos[:, None] - pos[None, :] < cfg["sliding_window"])
    h = rmsnorm(w["token_embd.weight"][tokens], None, eps)
    for i in range(cfg["n_layer"]):
        p = f"blk.{i}."
        x = rmsnorm(h, w[p + "attn_norm.weight"], eps)
        q = (x @ w[p + "attn_q.weight"].T).reshape(T, H, D)
        k = (x @ w[p + "attn_k.weight"].T).reshape(T, KV, D)
        v = (x @ w[p + "attn_v.weight"].T).reshape(T, KV, D)
        g = x @ w[p + "attn_gate.weight"].T
        q = rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
        k = rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        full = is_full_layer(cfg, i)
        if not full:
            q = rope_interleaved(q, pos, cfg["rope_base"])
            k = rope_interleaved(k, pos, cfg["rope_base"])
        mask = causal if full else window
        attn = np.empty((T, H, D), dtype=np.float32)
        for hh in range(H):
            kvh = hh // (H // KV)
            s = (q[:, hh, :] @ k[:, kvh, :].T) / np.float32(math.sqrt(D))
            s = np.where(mask, s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            e = np.exp(s)
            attn[:, hh, :] = (e / e.sum(axis=-1, keepdims=True)) @ v[:, kvh, :]
        a = attn.reshape(T, H * D) * (1.0 / (1.0 + np.exp(-g)))
        h = h + rmsnorm(a @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], peps)
        x = rmsnorm(h, w[p + "ffn_norm.weight"], eps)
        gg = x @ w[p + "ffn_gate.weight"].T
        up = x @ w[p + "ffn_up.weight"].T
        act = gg / (1.0 + np.exp(-gg)) * up
        h = h + rmsnorm(act @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"], peps)
    x = rmsnorm(h, w["output_norm.weight"], eps)
    z = x @ w["output.weight"].T
    cap = np.float32(cfg["softcap"])
    return (cap * np.tanh(z * np.float32(cfg["logit_scale"]) / cap)).astype(np.float32)


def nmse(a, b):
    """Normalised mean squared error of a against reference b."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.sum((a - b) ** 2) / np.sum(b ** 2))


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def tokenizer_metadata(tokenizer_json):
    """(tokens, token_types, merges, bos, eos) from an HF byte-level BPE tokenizer.json."""
    t = json.load(open(tokenizer_json)) if isinstance(tokenizer_json, str) else tokenizer_json
    vocab = dict(t["model"]["vocab"])
    for a in t.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for s, i in vocab.items():
        tokens[i] = s
    assert all(s is not None for s in tokens), "token ids must be dense"
    special = {a["content"] for a in t.get("added_tokens", []) if a.get("special")}
    types = [3 if s in special else 1 for s in tokens]
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in t["model"]["merges"]]
    return tokens, types, merges, vocab["<|bos|>"], vocab["<|eos|>"]


def write_gguf(path, cfg, w, tokenizer_json, name="muse-default"):
    """Write an F32 GGUF of architecture `muse` with SPEC section 2's metadata and tensors."""
    import gguf

    tokens, types, merges, bos, eos = tokenizer_metadata(tokenizer_json)
    assert len(tokens) == cfg["vocab_size"], (len(tokens), cfg["vocab_size"])
    wr = gguf.GGUFWriter(path, "muse")
    wr.add_string("general.name", name)
    wr.add_uint32("general.file_type", 0)
    a = "muse."
    wr.add_uint32(a + "block_count", cfg["n_layer"])
    wr.add_uint32(a + "embedding_length", cfg["d_model"])
    wr.add_uint32(a + "feed_forward_length", cfg["d_ff"])
    wr.add_uint32(a + "attention.head_count", cfg["n_head"])
    wr.add_uint32(a + "attention.head_count_kv", cfg["n_kv_head"])
    wr.add_uint32(a + "attention.key_length", cfg["head_dim"])
    wr.add_uint32(a + "attention.value_length", cfg["head_dim"])
    wr.add_uint32(a + "vocab_size", cfg["vocab_size"])
    wr.add_uint32(a + "context_length", cfg["context_length"])
    wr.add_float32(a + "attention.layer_norm_rms_epsilon", cfg["norm_eps"])
    wr.add_float32(a + "attention.post_norm_rms_epsilon", cfg["post_norm_eps"])
    wr.add_uint32(a + "attention.sliding_window", cfg["sliding_window"])
    wr.add_uint32(a + "attention.full_attention_interval", cfg["full_attention_interval"])
    wr.add_float32(a + "rope.freq_base", cfg["rope_base"])
    wr.add_float32(a + "logit_scale", cfg["logit_scale"])
    wr.add_float32(a + "final_logit_softcapping", cfg["softcap"])
    wr.add_string("tokenizer.ggml.model", "gpt2")
    wr.add_string("tokenizer.ggml.pre", "default")
    wr.add_array("tokenizer.ggml.tokens", tokens)
    wr.add_array("tokenizer.ggml.token_type", types)
    wr.add_array("tokenizer.ggml.merges", merges)
    wr.add_uint32("tokenizer.ggml.bos_token_id", bos)
    wr.add_uint32("tokenizer.ggml.eos_token_id", eos)
    wr.add_bool("tokenizer.ggml.add_bos_token", True)
    wr.add_bool("tokenizer.ggml.add_eos_token", False)
    for tname, shape in tensor_shapes(cfg).items():
        arr = np.ascontiguousarray(w[tname], dtype=np.float32)
        assert arr.shape == shape, (tname, arr.shape, shape)
        wr.add_tensor(tname, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
