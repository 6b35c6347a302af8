"""PyTorch implementation of SPEC section 2's `muse` forward (training side).

Parameter names map one-to-one to GGUF tensor names (see `gguf_state`).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rmsnorm(x, w, eps):
    xf = x.float()
    r = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return r if w is None else r * w


def rope_interleaved(x, cos, sin):
    """x: (B, T, H, D); rotate pairs (x[2j], x[2j+1]); cos/sin: (T, D/2)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg, full):
        super().__init__()
        d, f, H, KV, D = cfg["d_model"], cfg["d_ff"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
        self.full = full
        self.cfg = cfg
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.attn_q = nn.Parameter(torch.empty(H * D, d))
        self.attn_k = nn.Parameter(torch.empty(KV * D, d))
        self.attn_v = nn.Parameter(torch.empty(KV * D, d))
        self.attn_gate = nn.Parameter(torch.empty(H * D, d))
        self.attn_q_norm = nn.Parameter(torch.ones(D))
        self.attn_k_norm = nn.Parameter(torch.ones(D))
        self.attn_output = nn.Parameter(torch.empty(d, H * D))
        self.post_attention_norm = nn.Parameter(torch.ones(d))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.ffn_gate = nn.Parameter(torch.empty(f, d))
        self.ffn_up = nn.Parameter(torch.empty(f, d))
        self.ffn_down = nn.Parameter(torch.empty(d, f))
        self.post_ffw_norm = nn.Parameter(torch.ones(d))
        for p in (self.attn_q, self.attn_k, self.attn_v, self.attn_gate, self.attn_output,
                  self.ffn_gate, self.ffn_up, self.ffn_down):
            nn.init.normal_(p, std=0.02)

    def forward(self, h, cos, sin, mask, dropout):
        c = self.cfg
        B, T, _ = h.shape
        H, KV, D = c["n_head"], c["n_kv_head"], c["head_dim"]
        eps, peps = c["norm_eps"], c["post_norm_eps"]
        x = rmsnorm(h, self.attn_norm, eps)
        q = F.linear(x, self.attn_q).view(B, T, H, D)
        k = F.linear(x, self.attn_k).view(B, T, KV, D)
        v = F.linear(x, self.attn_v).view(B, T, KV, D)
        g = F.linear(x, self.attn_gate)
        q = rmsnorm(q, self.attn_q_norm, eps)
        k = rmsnorm(k, self.attn_k_norm, eps)
        if not self.full:
            q = rope_interleaved(q, cos, sin)
            k = rope_interleaved(k, cos, sin)
        # query head h reads KV head h // (H // KV)
        k = k.repeat_interleave(H // KV, dim=2)
        v = v.repeat_interleave(H // KV, dim=2)
        dt = v.dtype if not torch.is_autocast_enabled() else torch.bfloat16
        q, k, v = (t.transpose(1, 2).to(dt) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(D))
        attn = attn.transpose(1, 2).reshape(B, T, H * D)
        a = attn * torch.sigmoid(g)
        o = F.dropout(F.linear(a, self.attn_output), dropout, self.training)
        h = h + rmsnorm(o, self.post_attention_norm, peps)
        x = rmsnorm(h, self.ffn_norm, eps)
        y = F.linear(F.silu(F.linear(x, self.ffn_gate)) * F.linear(x, self.ffn_up), self.ffn_down)
        y = F.dropout(y, dropout, self.training)
        return h + rmsnorm(y, self.post_ffw_norm, peps)


class Muse(nn.Module):
    def __init__(self, cfg, dropout=0.0):
        super().__init__()
        self.cfg = cfg
        self.dropout = dropout
        self.token_embd = nn.Parameter(torch.randn(cfg["vocab_size"], cfg["d_model"]) * 0.02)
        self.blocks = nn.ModuleList(
            Block(cfg, (i + 1) % cfg["full_attention_interval"] == 0) for i in range(cfg["n_layer"]))
        self.output_norm = nn.Parameter(torch.ones(cfg["d_model"]))
        self.output = nn.Parameter(torch.randn(cfg["vocab_size"], cfg["d_model"]) * 0.02)

    def rope_tables(self, T, device):
        D = self.cfg["head_dim"]
        j = torch.arange(D // 2, dtype=torch.float64, device=device)
        p = torch.arange(T, dtype=torch.float64, device=device)
        theta = p[:, None] * self.cfg["rope_base"] ** (-2.0 * j / D)
        return torch.cos(theta).float(), torch.sin(theta).float()

    def forward(self, tokens):
        c = self.cfg
        B, T = tokens.shape
        dev = tokens.device
        cos, sin = self.rope_tables(T, dev)
        i = torch.arange(T, device=dev)
        causal = i[None, :] <= i[:, None]
        window = causal & (i[:, None] - i[None, :] < c["sliding_window"])
        h = rmsnorm(self.token_embd[tokens], None, c["norm_eps"])
        h = F.dropout(h, self.dropout, self.training)
        for blk in self.blocks:
            h = blk(h, cos, sin, causal if blk.full else window, self.dropout)
        x = rmsnorm(h, self.output_norm, c["norm_eps"])
        z = F.linear(x, self.output).float()
        cap = c["softcap"]
        return cap * torch.tanh(z * c["logit_scale"] / cap)

    def gguf_state(self):
        """{GGUF tensor name: float32 numpy array (out, in)}."""
        out = {"token_embd.weight": self.token_embd, "output_norm.weight": self.output_norm,
               "output.weight": self.output}
        for i, b in enumerate(self.blocks):
            for n, p in b.named_parameters():
                out[f"blk.{i}.{n}.weight"] = p
        return {k: v.detach().float().cpu().numpy() for k, v in out.items()}

    def param_groups(self, wd):
        mats = [p for p in self.parameters() if p.dim() == 2]
        vecs = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": mats, "weight_decay": wd}, {"params": vecs, "weight_decay": 0.0}]
