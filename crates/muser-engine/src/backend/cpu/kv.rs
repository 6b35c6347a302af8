//! The f16 KV cache and attention over it.
//!
//! Per layer, K and V are `[slot, n_head_kv * head_dim]` f16. A sliding layer keeps a ring of
//! `slots` positions (position p in slot p % slots; the session makes `slots` at least
//! window + batch - 1 so a batch never overwrites a position an earlier row of the same batch
//! still sees); a full layer keeps a plane that grows with the sequence.

use super::simd::{axpy_f16, dot_f16_f32};
use crate::backend::KvLayerSpec;
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

pub struct KvLayer {
    pub spec: KvLayerSpec,
    pub k: Vec<f16>, // (slots or positions so far, n_head_kv * head_dim)
    pub v: Vec<f16>, // (slots or positions so far, n_head_kv * head_dim)
}

pub struct CpuKv {
    pub layers: Vec<KvLayer>,
}

impl CpuKv {
    pub fn new(specs: &[KvLayerSpec]) -> CpuKv {
        let layers = specs
            .iter()
            .map(|&spec| {
                let n = if spec.is_ring() {
                    spec.slots * spec.n_head_kv * spec.head_dim
                } else {
                    0
                };
                KvLayer {
                    spec,
                    k: vec![f16::ZERO; n],
                    v: vec![f16::ZERO; n],
                }
            })
            .collect();
        CpuKv { layers }
    }
}

impl KvLayer {
    fn width(&self) -> usize {
        self.spec.n_head_kv * self.spec.head_dim
    }
    pub(crate) fn slot(&self, pos: usize) -> usize {
        if self.spec.is_ring() {
            pos % self.spec.slots
        } else {
            pos
        }
    }

    /// Stores rows of k and v (`[n, width]`) at positions pos0..pos0+n.
    pub fn store(&mut self, k: &[f32], v: &[f32], pos0: usize) {
        let w = self.width();
        let n = k.len() / w;
        if !self.spec.is_ring() {
            self.k.resize((pos0 + n) * w, f16::ZERO);
            self.v.resize((pos0 + n) * w, f16::ZERO);
        }
        for t in 0..n {
            let s = self.slot(pos0 + t);
            self.k[s * w..(s + 1) * w].convert_from_f32_slice(&k[t * w..(t + 1) * w]);
            self.v[s * w..(s + 1) * w].convert_from_f32_slice(&v[t * w..(t + 1) * w]);
        }
    }

    /// Attention of every query head of every row of q (`[n, n_head * head_dim]`, row t at
    /// position pos0 + t) over the positions it sees; writes out (same shape as q).
    pub fn attend(&self, q: &[f32], n_head: usize, pos0: usize, scale: f32, out: &mut [f32]) {
        let hd = self.spec.head_dim;
        if q.len() / (n_head * hd) >= super::attn::MIN_ROWS && super::attn::available(hd) {
            // Bit for bit the per-head path below, laid out for throughput.
            return super::attn::attend(self, q, n_head, pos0, scale, out);
        }
        out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
            let (t, h) = (i / n_head, i % n_head);
            self.attend_head(&q[i * hd..(i + 1) * hd], h, n_head, pos0 + t, scale, o);
        });
    }

    /// One query head `h` (of `n_head`) at position p over the positions it sees: the whole
    /// computation of one (row, head), in a fixed order, so a row's result is the same whatever
    /// batch or decode group it is part of.
    pub fn attend_head(
        &self,
        qh: &[f32],
        h: usize,
        n_head: usize,
        p: usize,
        scale: f32,
        o: &mut [f32],
    ) {
        let hd = self.spec.head_dim;
        let w = self.width();
        let kh = h / (n_head / self.spec.n_head_kv);
        let lo = self
            .spec
            .window
            .map_or(0, |win| (p + 1).saturating_sub(win));
        let mut scores: Vec<f32> = (lo..=p)
            .map(|j| {
                let s = self.slot(j) * w + kh * hd;
                dot_f16_f32(&self.k[s..s + hd], qh) * scale
            })
            .collect();
        super::softmax::softmax(&mut scores);
        o.fill(0.0);
        for (j, &wj) in (lo..=p).zip(&scores) {
            let s = self.slot(j) * w + kh * hd;
            axpy_f16(o, wj, &self.v[s..s + hd]);
        }
    }
}
