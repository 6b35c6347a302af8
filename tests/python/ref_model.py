"""Independent numpy reference of the forward pass, for checking Muser's logits.

Reads a GGUF with gguf-python, dequantizes each weight with `gguf.quants.dequantize` (the
SPEC's oracle for the block formats) and computes the logits of every position of a token
sequence in float64 (or float32), with plain causal attention over the whole sequence: no KV
cache, no f16 rounding, no fused kernels. It shares no code with Muser.

Architectures (one decoder template, the switches set per architecture):
- `muse` (SPEC section 2): entry norm, sandwich norms (post norms with eps from
  `muse.attention.post_norm_rms_epsilon`), per-head QK norm, interleaved (GPT-J) RoPE on the
  sliding layers only, full-attention NoPE layers where (i + 1) % interval == 0, sliding window
  from `muse.attention.sliding_window`, sigmoid output gate `attn_gate`, logit scale then
  softcap.
- `llama`: pre-norm, no QK norm, RoPE on every layer in llama.cpp's NORM style, which pairs
  x[2i] with x[2i+1] (the converter permutes Q/K so this matches HF's rotate_half).
- `qwen3`: as llama plus per-head QK norm, with NEOX RoPE pairing x[i] with x[i + n_rot/2]
  (llama.cpp `llama_model_rope_type`: LLAMA -> NORM, QWEN3 -> NEOX).
Tied embeddings (no `output.weight`) reuse `token_embd.weight` as the LM head.

Weights are dequantized one layer at a time, so files too large to hold as float64 still run
(slowly). Usage: `python ref_model.py MODEL.gguf --tokens 1,2,3 --out ref.npy`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROPE_INTERLEAVED = "interleaved"  # pairs (x[2i], x[2i+1]): llama.cpp NORM, GPT-J
ROPE_NEOX = "neox"  # pairs (x[i], x[i + n_rot/2])


@dataclass
class Config:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    rope_style: str
    eps: float
    # muse switches (neutral values for the others)
    entry_norm: bool = False
    sandwich_norms: bool = False
    post_norm_eps: float = 1e-8
    qk_norm: bool = False
    output_gate: bool = False
    sliding_window: int = 0  # 0 = no sliding layers
    full_attention_interval: int = 0  # 0 = every layer uses RoPE and full attention
    logit_scale: float = 1.0
    softcap: float = 0.0  # 0 = off

    def is_full_layer(self, i: int) -> bool:
        """Muse: a full-attention NoPE layer; otherwise a sliding layer with RoPE."""
        return self.full_attention_interval > 0 and (i + 1) % self.full_attention_interval == 0

    def layer_uses_rope(self, i: int) -> bool:
        if self.full_attention_interval > 0:
            return not self.is_full_layer(i)
        return True

    def layer_window(self, i: int) -> int:
        """How many positions (including its own) a query sees; 0 = all earlier ones."""
        if self.sliding_window > 0 and not self.is_full_layer(i):
            return self.sliding_window
        return 0


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF metadata key {key} is missing")
        return default
    return f.contents()


def read_config(reader: GGUFReader) -> Config:
    arch = _field(reader, "general.architecture")
    if arch not in ("muse", "llama", "qwen3"):
        raise ValueError(f"architecture {arch!r} is not supported by the reference")
    a = arch
    n_embd = int(_field(reader, f"{a}.embedding_length"))
    n_head = int(_field(reader, f"{a}.attention.head_count"))
    head_dim = int(_field(reader, f"{a}.attention.key_length", n_embd // n_head))
    cfg = Config(
        arch=arch,
        n_layer=int(_field(reader, f"{a}.block_count")),
        n_embd=n_embd,
        n_ff=int(_field(reader, f"{a}.feed_forward_length")),
        n_head=n_head,
        n_head_kv=int(_field(reader, f"{a}.attention.head_count_kv", n_head)),
        head_dim=head_dim,
        n_rot=int(_field(reader, f"{a}.rope.dimension_count", head_dim)),
        rope_base=float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        rope_style=ROPE_NEOX if arch == "qwen3" else ROPE_INTERLEAVED,
        eps=float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
    )
    if arch == "qwen3":
        cfg.qk_norm = True
    if arch == "muse":
        cfg.entry_norm = True
        cfg.sandwich_norms = True
        cfg.post_norm_eps = float(_field(reader, "muse.attention.post_norm_rms_epsilon", 1e-8))
        cfg.qk_norm = True
        cfg.output_gate = True
        cfg.sliding_window = int(_field(reader, "muse.attention.sliding_window"))
        cfg.full_attention_interval = int(_field(reader, "muse.attention.full_attention_interval"))
        cfg.logit_scale = float(_field(reader, "muse.logit_scale", 1.0))
        cfg.softcap = float(_field(reader, "muse.final_logit_softcapping", 0.0))
    return cfg


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, style: str) -> np.ndarray:
    """Rotates the first n_rot dims of each head. x: (T, heads, head_dim)."""
    j = np.arange(n_rot // 2, dtype=np.float64)
    theta = positions.astype(np.float64)[:, None] * base ** (-2.0 * j / n_rot)  # (T, n_rot/2)
    cos = np.cos(theta)[:, None, :].astype(x.dtype)
    sin = np.sin(theta)[:, None, :].astype(x.dtype)
    out = x.copy()
    if style == ROPE_INTERLEAVED:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    elif style == ROPE_NEOX:
        h = n_rot // 2
        x0, x1 = x[..., :h], x[..., h:n_rot]
        out[..., :h] = x0 * cos - x1 * sin
        out[..., h:n_rot] = x0 * sin + x1 * cos
    else:
        raise ValueError(style)
    return out


def attention(q, k, v, window: int) -> np.ndarray:
    """Causal softmax attention with GQA. q: (T, H, D); k, v: (T, Hkv, D) -> (T, H*D).

    Query i sees keys j <= i, and with a window W only i - j < W."""
    T, H, D = q.shape
    group = H // k.shape[1]
    kk = np.repeat(k, group, axis=1)  # query head h reads KV head h // group
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, kk) / np.sqrt(D)  # (H, T, T)
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    visible = j <= i
    if window > 0:
        visible &= (i - j) < window
    scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", p, vv)
    return out.reshape(T, H * D)


class RefModel:
    """The reference model. `logits(tokens)` -> (T, vocab)."""

    def __init__(self, path: str, dtype=np.float64):
        self.reader = GGUFReader(path)
        self.cfg = read_config(self.reader)
        self.dtype = dtype
        self.tensors = {t.name: t for t in self.reader.tensors}

    def has(self, name: str) -> bool:
        return name in self.tensors

    def weight(self, name: str) -> np.ndarray:
        """The dequantized tensor shaped as numpy sees it: GGUF dims reversed, so a matrix of
        GGUF dims [n_in, n_out] is (n_out, n_in) and applies as W @ x."""
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"tensor {name} is missing")
        dims = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = dequantize(t.data, t.tensor_type)
        return np.asarray(w, dtype=self.dtype).reshape(dims)

    def embedding_rows(self, tokens: np.ndarray) -> np.ndarray:
        """Rows of token_embd for `tokens`, dequantizing only those rows."""
        t = self.tensors["token_embd.weight"]
        n_embd = int(t.shape[0])
        rows = dequantize(t.data[tokens], t.tensor_type)
        return np.asarray(rows, dtype=self.dtype).reshape(len(tokens), n_embd)

    def logits(self, tokens) -> np.ndarray:
        cfg = self.cfg
        x = self.hidden(tokens)
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        logits = x @ self.weight(head).T
        logits = logits * cfg.logit_scale
        if cfg.softcap > 0:
            logits = cfg.softcap * np.tanh(logits / cfg.softcap)
        return logits

    def hidden(self, tokens) -> np.ndarray:
        """Every position's last hidden state with the output norm applied (the LM head's
        input; a decoder model's token embeddings): (T, n_embd)."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        pos = np.arange(T)
        H, Hkv, D = cfg.n_head, cfg.n_head_kv, cfg.head_dim

        h = self.embedding_rows(tokens)  # (T, n_embd)
        if cfg.entry_norm:
            h = rmsnorm(h, None, cfg.eps)

        for il in range(cfg.n_layer):
            w = lambda n: self.weight(f"blk.{il}.{n}.weight")  # noqa: E731
            x = rmsnorm(h, w("attn_norm"), cfg.eps)
            q = (x @ w("attn_q").T).reshape(T, H, D)
            k = (x @ w("attn_k").T).reshape(T, Hkv, D)
            v = (x @ w("attn_v").T).reshape(T, Hkv, D)
            if cfg.qk_norm:
                q = rmsnorm(q, w("attn_q_norm"), cfg.eps)
                k = rmsnorm(k, w("attn_k_norm"), cfg.eps)
            if cfg.layer_uses_rope(il):
                q = rope(q, pos, cfg.n_rot, cfg.rope_base, cfg.rope_style)
                k = rope(k, pos, cfg.n_rot, cfg.rope_base, cfg.rope_style)
            a = attention(q, k, v, cfg.layer_window(il))  # (T, H*D)
            if cfg.output_gate:
                a = a * sigmoid(x @ w("attn_gate").T)
            a = a @ w("attn_output").T
            if cfg.sandwich_norms:
                a = rmsnorm(a, w("post_attention_norm"), cfg.post_norm_eps)
            h = h + a

            x = rmsnorm(h, w("ffn_norm"), cfg.eps)
            f = (silu(x @ w("ffn_gate").T) * (x @ w("ffn_up").T)) @ w("ffn_down").T
            if cfg.sandwich_norms:
                f = rmsnorm(f, w("post_ffw_norm"), cfg.post_norm_eps)
            h = h + f

        return rmsnorm(h, self.weight("output_norm.weight"), cfg.eps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help=".npy file for the (T, vocab) float32 logits")
    ap.add_argument("--f32", action="store_true", help="compute in float32 instead of float64")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",") if t]
    m = RefModel(args.model, np.float32 if args.f32 else np.float64)
    np.save(args.out, m.logits(tokens).astype(np.float32))


if __name__ == "__main__":
    main()
