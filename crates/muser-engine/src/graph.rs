//! The forward pass of the decoder template over any `Backend`: embedding, the layer chain of
//! SPEC section 3 with each architecture's switches, the LM head. A batch of n tokens at
//! consecutive positions runs the same graph as a single decode token (n = 1), and so do a
//! decode group (one token of each of n sequences) and several prompts in one pass: only RoPE,
//! the KV store and attention see which sequence and position a row belongs to.
//!
//! This module never knows which backend runs it.

use crate::backend::{Backend, Heads, NormArgs};
use crate::config::ModelConfig;
use crate::weights::ModelWeights;

/// Activation buffers for a batch of `n` tokens.
pub struct Scratch<B: Backend> {
    pub n: usize,
    h: B::Buf,         // (n, n_embd) residual stream
    x: B::Buf,         // (n, n_embd) normed input of the next matmul
    q: B::Buf,         // (n, n_head*head_dim)
    k: B::Buf,         // (n, n_head_kv*head_dim)
    v: B::Buf,         // (n, n_head_kv*head_dim)
    g: Option<B::Buf>, // (n, n_head*head_dim) output gate
    att: B::Buf,       // (n, n_head*head_dim)
    o: B::Buf,         // (n, n_embd) branch output
    ff: B::Buf,        // (n, n_ff)
    /// (n_out, n_vocab)
    pub logits: B::Buf,
    pub n_out: usize,
}

impl<B: Backend> Scratch<B> {
    /// Buffers for `n` tokens with logits for the last `n_out` of them.
    pub fn new(be: &B, c: &ModelConfig, n: usize, n_out: usize) -> Scratch<B> {
        Scratch {
            n,
            h: be.buf(n, c.n_embd),
            x: be.buf(n, c.n_embd),
            q: be.buf(n, c.q_width()),
            k: be.buf(n, c.kv_width()),
            v: be.buf(n, c.kv_width()),
            g: c.arch.attn_gate.then(|| be.buf(n, c.q_width())),
            att: be.buf(n, c.q_width()),
            o: be.buf(n, c.n_embd),
            ff: be.buf(n, c.n_ff),
            logits: be.buf(n_out, c.n_vocab),
            n_out,
        }
    }

    /// After a forward pass: every row's last hidden state with the output norm applied (the
    /// LM head's input), `(n, n_embd)`: what a decoder model gives as token embeddings.
    pub fn hidden(&self) -> &B::Buf {
        &self.x
    }
}

/// Which sequence and position each row of a forward pass belongs to.
pub enum Rows<'a, 'k, Kv> {
    /// Consecutive tokens of one sequence: row t at position pos0 + t of `kv`.
    Run { kv: &'a mut Kv, pos0: usize },
    /// A decode group: row t is the next token of sequence t, at position pos[t] of kvs[t].
    Group {
        kvs: &'a mut [&'k mut Kv],
        pos: &'a [usize],
    },
    /// Several sequences' prompts in one pass: run r is `lens[r]` consecutive rows (the runs in
    /// order), tokens of `kvs[r]` from position `pos0[r]`. RoPE, the KV store and attention run
    /// on a copy of each run's rows exactly as in that run's own pass (`Run`); the logits are
    /// those of each run's last row.
    Runs {
        kvs: &'a mut [&'k mut Kv],
        pos0: &'a [usize],
        lens: &'a [usize],
    },
}

/// One run's rows of q, k, v (and the gate) and its attention output (`Rows::Runs`).
struct RunBufs<Buf> {
    q: Buf,
    k: Buf,
    v: Buf,
    g: Option<Buf>,
    att: Buf,
}

/// Runs `tokens` (at positions pos0..) through the model, storing their K/V in `kv` and the
/// logits of the last `s.n_out` tokens in `s.logits`. Token ids and context room are checked by
/// the caller.
pub fn forward<B: Backend>(
    be: &B,
    c: &ModelConfig,
    w: &ModelWeights<B::Weight>,
    s: &mut Scratch<B>,
    kv: &mut B::Kv,
    tokens: &[u32],
    pos0: usize,
) {
    forward_rows(be, c, w, s, Rows::Run { kv, pos0 }, tokens)
}

/// One decode step of a group: row t is `tokens[t]` of sequence t at position `pos[t]` of
/// `kvs[t]` (a single sequence's decode is a group of one). Goes through
/// `Backend::decode_step`, so a backend may replay a recording of an earlier step of the same
/// shape (`rec`, kept by the caller with `s`) instead of issuing the ops again.
#[allow(clippy::too_many_arguments)]
pub fn decode_step<B: Backend>(
    be: &B,
    c: &ModelConfig,
    w: &ModelWeights<B::Weight>,
    s: &mut Scratch<B>,
    rec: &mut Option<B::Recording>,
    kvs: &mut [&mut B::Kv],
    pos: &[usize],
    tokens: &[u32],
) {
    be.decode_step(rec, tokens, kvs, pos, |kvs| {
        forward_rows(be, c, w, s, Rows::Group { kvs, pos }, tokens)
    })
}

/// As `forward`, with each row's sequence and position given by `rows`.
pub fn forward_rows<B: Backend>(
    be: &B,
    c: &ModelConfig,
    w: &ModelWeights<B::Weight>,
    s: &mut Scratch<B>,
    mut rows: Rows<'_, '_, B::Kv>,
    tokens: &[u32],
) {
    debug_assert_eq!(tokens.len(), s.n);
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let eps = c.rms_eps;
    let mut run_bufs: Vec<RunBufs<B::Buf>> = match &rows {
        Rows::Runs { lens, .. } => lens
            .iter()
            .map(|&n| RunBufs {
                q: be.buf(n, c.q_width()),
                k: be.buf(n, c.kv_width()),
                v: be.buf(n, c.kv_width()),
                g: c.arch.attn_gate.then(|| be.buf(n, c.q_width())),
                att: be.buf(n, c.q_width()),
            })
            .collect(),
        _ => Vec::new(),
    };

    // Embedding (row 1), entry norm (row 2), first attention norm.
    if c.arch.entry_norm {
        be.embed(&w.token_embd, tokens, &mut s.x);
        be.rmsnorm(&s.x, None, eps, &mut s.h);
    } else {
        be.embed(&w.token_embd, tokens, &mut s.h);
    }
    be.rmsnorm(&s.h, Some(&w.layers[0].attn_norm), eps, &mut s.x);

    for (il, (lw, kind)) in w.layers.iter().zip(&c.layers).enumerate() {
        // Q/K/V(/gate) share one input.
        match (&lw.wgate, &mut s.g) {
            (Some(wg), Some(g)) => be.matmul(
                &s.x,
                &mut [
                    (&lw.wq, &mut s.q),
                    (&lw.wk, &mut s.k),
                    (&lw.wv, &mut s.v),
                    (wg, g),
                ],
            ),
            _ => be.matmul(
                &s.x,
                &mut [(&lw.wq, &mut s.q), (&lw.wk, &mut s.k), (&lw.wv, &mut s.v)],
            ),
        }
        // One sequence's rows at positions pos0..: RoPE, the KV store and attention.
        let run = |q: &mut B::Buf,
                   k: &mut B::Buf,
                   v: &B::Buf,
                   g: Option<&B::Buf>,
                   att: &mut B::Buf,
                   kv: &mut B::Kv,
                   pos0: usize| {
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                be.rmsnorm_heads(q, qn, c.head_dim, eps);
                be.rmsnorm_heads(k, kn, c.head_dim, eps);
            }
            if kind.rope {
                be.rope(q, c.head_dim, &c.rope, pos0);
                be.rope(k, c.head_dim, &c.rope, pos0);
            }
            be.kv_store(kv, il, k, v, pos0);
            be.attention(q, kv, il, pos0, scale, att);
            if let Some(g) = g {
                be.sigmoid_gate(att, g);
            }
        };
        match &mut rows {
            Rows::Run { kv, pos0 } => {
                run(
                    &mut s.q,
                    &mut s.k,
                    &s.v,
                    s.g.as_ref(),
                    &mut s.att,
                    kv,
                    *pos0,
                );
            }
            Rows::Runs { kvs, pos0, lens } => {
                let mut a = 0;
                for (((kv, &p0), &n), rb) in kvs
                    .iter_mut()
                    .zip(pos0.iter())
                    .zip(lens.iter())
                    .zip(&mut run_bufs)
                {
                    be.copy_rows(&s.q, a, &mut rb.q, 0, n);
                    be.copy_rows(&s.k, a, &mut rb.k, 0, n);
                    be.copy_rows(&s.v, a, &mut rb.v, 0, n);
                    if let (Some(g), Some(rg)) = (&s.g, &mut rb.g) {
                        be.copy_rows(g, a, rg, 0, n);
                    }
                    run(
                        &mut rb.q,
                        &mut rb.k,
                        &rb.v,
                        rb.g.as_ref(),
                        &mut rb.att,
                        kv,
                        p0,
                    );
                    be.copy_rows(&rb.att, 0, &mut s.att, a, n);
                    a += n;
                }
            }
            Rows::Group { kvs, pos } => {
                let norms = match (&lw.q_norm, &lw.k_norm) {
                    (Some(qn), Some(kn)) => Some((qn, kn, eps)),
                    _ => None,
                };
                let heads = Heads {
                    n_head: c.n_head,
                    n_head_kv: c.n_head_kv,
                    head_dim: c.head_dim,
                };
                let rope = kind.rope.then_some(&c.rope);
                be.qkv_rows(&mut s.q, &mut s.k, &s.v, norms, heads, rope, kvs, il, pos);
                be.attention_rows(
                    &s.q,
                    c.q_width(),
                    kvs,
                    il,
                    pos,
                    scale,
                    s.g.as_ref(),
                    &mut s.att,
                );
            }
        }
        be.matmul(&s.att, &mut [(&lw.wo, &mut s.o)]);
        let post = lw.post_attn_norm.as_ref().map(|weight| NormArgs {
            weight,
            eps: c.post_norm_eps,
        });
        be.residual_norm(
            &mut s.h,
            &s.o,
            post,
            NormArgs {
                weight: &lw.ffn_norm,
                eps,
            },
            &mut s.x,
        );

        be.ffn_gate_up_silu(&s.x, &lw.ffn_gate, &lw.ffn_up, &mut s.ff);
        be.matmul(&s.ff, &mut [(&lw.ffn_down, &mut s.o)]);
        let post = lw.post_ffn_norm.as_ref().map(|weight| NormArgs {
            weight,
            eps: c.post_norm_eps,
        });
        let next = w
            .layers
            .get(il + 1)
            .map_or(&w.output_norm, |l| &l.attn_norm);
        be.residual_norm(
            &mut s.h,
            &s.o,
            post,
            NormArgs { weight: next, eps },
            &mut s.x,
        );
    }

    if s.n_out == 0 {
        return;
    }
    let out_w = w.output.as_ref().unwrap_or(&w.token_embd);
    if let Rows::Runs { lens, .. } = &rows {
        // Each run's last row, gathered.
        debug_assert_eq!(s.n_out, lens.len());
        let mut last = be.buf(lens.len(), c.n_embd);
        let mut a = 0;
        for (r, &n) in lens.iter().enumerate() {
            a += n;
            be.copy_rows(&s.x, a - 1, &mut last, r, 1);
        }
        be.lm_head(&last, 0, out_w, c.logit_scale, c.softcap, &mut s.logits);
        return;
    }
    be.lm_head(
        &s.x,
        s.n - s.n_out,
        out_w,
        c.logit_scale,
        c.softcap,
        &mut s.logits,
    );
}
