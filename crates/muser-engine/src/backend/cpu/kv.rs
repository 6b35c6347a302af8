//! The f16 KV cache and attention over it.
//!
//! Per layer, K and V are each one plane per KV head, `[n_head_kv][slots][head_dim]` f16: a
//! KV head's rows lie one after the other, so a decode task that reads one KV head's context
//! streams it from memory (with `[slot][n_head_kv * head_dim]` rows it read 128 bytes of every
//! 1 KB on llama-1b, and one thread reached 4.7 GB/s at depth 4,096). A sliding layer keeps a
//! ring of `slots` positions (position p in slot p % slots; the session makes `slots` at least
//! window + batch - 1 so a batch never overwrites a position an earlier row of the same batch
//! still sees); a full layer reserves its `slots` positions (the session's context) in
//! anonymous memory that the OS commits page by page as positions are stored.

use super::simd::{axpy_f16, dot_f16_f32};
use crate::backend::KvLayerSpec;
use crate::error::{EngineError, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Zeroed f16 values in anonymous memory, committed as they are first written.
struct Plane {
    map: memmap2::MmapMut,
    len: usize,
}

impl Plane {
    /// The values of `spec`'s positions, KV heads and head size.
    fn new(spec: &KvLayerSpec) -> Result<Plane> {
        let fail = |why: String| {
            EngineError::Invalid(format!(
                "KV cache: cannot reserve {} positions of {} KV heads of {} values: {why}",
                spec.slots, spec.n_head_kv, spec.head_dim
            ))
        };
        let len = (spec.n_head_kv.checked_mul(spec.slots))
            .and_then(|n| n.checked_mul(spec.head_dim))
            .filter(|n| n.checked_mul(std::mem::size_of::<f16>()).is_some())
            .ok_or_else(|| fail("the size overflows".into()))?;
        let bytes = len * std::mem::size_of::<f16>();
        let map = memmap2::MmapMut::map_anon(bytes.max(1))
            .map_err(|e| fail(format!("{bytes} bytes: {e}")))?;
        // Small pages: a KV head's plane is committed as its positions are written, not in
        // 2 MB steps per plane (where the OS gives huge pages to every large mapping).
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::NoHugePage);
        Ok(Plane { map, len })
    }
    // The map holds at least one byte (an empty map is refused), so the cast takes its values'
    // bytes only.
    fn get(&self) -> &[f16] {
        bytemuck::cast_slice(&self.map[..2 * self.len])
    }
    fn get_mut(&mut self) -> &mut [f16] {
        bytemuck::cast_slice_mut(&mut self.map[..2 * self.len])
    }
}

pub struct KvLayer {
    pub spec: KvLayerSpec,
    k: Plane,
    v: Plane,
    /// Full layers: positions stored so far (0..filled); rings: slots (every slot readable).
    filled: usize,
}

pub struct CpuKv {
    pub layers: Vec<KvLayer>,
}

impl CpuKv {
    pub fn new(specs: &[KvLayerSpec]) -> Result<CpuKv> {
        Ok(CpuKv {
            layers: specs
                .iter()
                .map(|&spec| KvLayer::new(spec))
                .collect::<Result<_>>()?,
        })
    }
}

impl KvLayer {
    /// An empty layer: `spec.slots` positions per KV head, all zero (reserved, not yet
    /// committed), or an error naming the bytes the OS would not reserve.
    pub fn new(spec: KvLayerSpec) -> Result<KvLayer> {
        Ok(KvLayer {
            spec,
            k: Plane::new(&spec)?,
            v: Plane::new(&spec)?,
            filled: if spec.is_ring() { spec.slots } else { 0 },
        })
    }

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

    /// Where KV head kh's row at position `pos` starts in `k()` and `v()`.
    pub fn at(&self, kh: usize, pos: usize) -> usize {
        (kh * self.spec.slots + self.slot(pos)) * self.spec.head_dim
    }

    /// This layer's positions `0..n` (a ring: all its slots) become `src`'s, a layer of the
    /// same spec.
    pub fn copy_prefix(&mut self, src: &KvLayer, n: usize) {
        assert_eq!(
            self.spec, src.spec,
            "KV copy between layers of other shapes"
        );
        let (slots, hd) = (self.spec.slots, self.spec.head_dim);
        let len = self.spec.prefix_slots(n);
        for kh in 0..self.spec.n_head_kv {
            let at = kh * slots * hd;
            let r = at..at + len * hd;
            self.k.get_mut()[r.clone()].copy_from_slice(&src.k.get()[r.clone()]);
            self.v.get_mut()[r.clone()].copy_from_slice(&src.v.get()[r]);
        }
        if !self.spec.is_ring() {
            self.filled = self.filled.max(len);
        }
    }

    /// Positions `0..n` (a ring: all its slots) in host memory, K then V, each in the layout
    /// every backend's `kv_save` writes (`KvHost`): slot by slot, its KV heads in order.
    pub fn save(&self, n: usize) -> [Vec<u16>; 2] {
        let (slots, hd, heads) = (self.spec.slots, self.spec.head_dim, self.spec.n_head_kv);
        let len = self.spec.prefix_slots(n);
        let take = |plane: &[f16]| -> Vec<u16> {
            let mut out = Vec::with_capacity(heads * len * hd);
            for slot in 0..len {
                for kh in 0..heads {
                    let at = (kh * slots + slot) * hd;
                    out.extend_from_slice(bytemuck::cast_slice(&plane[at..at + hd]));
                }
            }
            out
        };
        [take(self.k.get()), take(self.v.get())]
    }

    /// The slots `save` (of any backend) wrote become this layer's (a layer of the same heads
    /// and, for a ring, slots).
    pub fn load(&mut self, host: &[Vec<u16>; 2]) {
        let (slots, hd, heads) = (self.spec.slots, self.spec.head_dim, self.spec.n_head_kv);
        let len = host[0].len() / (heads * hd).max(1);
        assert!(
            host[0].len() == heads * len * hd && host[1].len() == host[0].len() && len <= slots,
            "KV load of another layer's shape"
        );
        for (plane, values) in [(self.k.get_mut(), &host[0]), (self.v.get_mut(), &host[1])] {
            for (row, src) in values.chunks_exact(hd).enumerate() {
                let (slot, kh) = (row / heads, row % heads);
                let at = (kh * slots + slot) * hd;
                plane[at..at + hd].copy_from_slice(bytemuck::cast_slice(src));
            }
        }
        if !self.spec.is_ring() {
            self.filled = self.filled.max(len);
        }
    }

    /// Whether position `pos` can be read: stored (full layers) or in the ring.
    pub fn holds(&self, pos: usize) -> bool {
        self.slot(pos) < self.filled
    }

    /// Every K value: KV head kh's plane from kh * slots * head_dim (see `at`).
    pub fn k(&self) -> &[f16] {
        self.k.get()
    }
    /// Every V value, laid out as `k()`.
    pub fn v(&self) -> &[f16] {
        self.v.get()
    }

    /// Stores rows of k and v (`[n, n_head_kv * head_dim]`) at positions pos0..pos0+n.
    pub fn store(&mut self, k: &[f32], v: &[f32], pos0: usize) {
        let (w, hd) = (self.width(), self.spec.head_dim);
        let n = k.len() / w;
        assert!(
            self.spec.is_ring() || pos0 + n <= self.spec.slots,
            "KV store: positions {pos0}..{} past the layer's {} slots",
            pos0 + n,
            self.spec.slots
        );
        for t in 0..n {
            for kh in 0..self.spec.n_head_kv {
                let (at, src) = (self.at(kh, pos0 + t), t * w + kh * hd);
                self.k.get_mut()[at..at + hd].convert_from_f32_slice(&k[src..src + hd]);
                self.v.get_mut()[at..at + hd].convert_from_f32_slice(&v[src..src + hd]);
            }
        }
        if !self.spec.is_ring() {
            self.filled = self.filled.max(pos0 + n);
        }
    }

    /// Attention of every query head of every row of q (`[n, n_head * head_dim]`, row t at
    /// position pos0 + t) over the positions it sees; writes out (same shape as q).
    pub fn attend(&self, q: &[f32], n_head: usize, pos0: usize, scale: f32, out: &mut [f32]) {
        let hd = self.spec.head_dim;
        let n_kv = self.spec.n_head_kv;
        let fast = super::attn::available(hd);
        if q.len() / (n_head * hd) >= super::attn::MIN_ROWS && fast {
            // Bit for bit the per-head path below, laid out for throughput.
            return super::attn::attend(self, q, n_head, pos0, scale, out);
        }
        if fast && n_head.is_multiple_of(n_kv) {
            // A decode step (or a short chunk): per (row, KV head) the decode groups' kernel
            // over the f16 cache, the bits of `attend_head` per head.
            let g = n_head / n_kv;
            out.par_chunks_mut(g * hd).enumerate().for_each(|(i, res)| {
                let (t, kh) = (i / n_kv, i % n_kv);
                let qs = &q[i * g * hd..(i + 1) * g * hd];
                super::attn::attend_kv_head(self, qs, kh, pos0 + t, scale, res);
            });
            return;
        }
        if n_head.is_multiple_of(n_kv) {
            // One task per (row, KV head): `attend_group`, the bits of `attend_head` per head.
            let g = n_head / n_kv;
            out.par_chunks_mut(g * hd).enumerate().for_each(|(i, res)| {
                let (t, kh) = (i / n_kv, i % n_kv);
                let qs = &q[i * g * hd..(i + 1) * g * hd];
                self.attend_group(qs, kh, pos0 + t, scale, res);
            });
            return;
        }
        out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
            let (t, h) = (i / n_head, i % n_head);
            self.attend_head(&q[i * hd..(i + 1) * hd], h, n_head, pos0 + t, scale, o);
        });
    }

    /// The G query heads of KV head `kh` (qs: `[G, head_dim]`) at position p over the positions
    /// they see, written to res (`[G, head_dim]`): per head exactly `attend_head`'s arithmetic
    /// (the same dot per position, softmax, and multiply-adds in position order), so the same
    /// bits, with each K and V row read once for the G heads instead of once per head. The
    /// prefill path of CPUs without the batched kernels of `attn.rs` (AVX-512): llama-1b pp512
    /// on a 2-core Zen 3, alternated with the per-head tasks, 58.26 / 54.50 -> 73.48 / 61.89
    /// tokens/s (a shared machine). Decode groups keep the per-head tasks: at depth 4096 one run
    /// gave 7.44 tokens/s against 9.57 / 7.65 (too noisy to choose; not switched).
    pub fn attend_group(&self, qs: &[f32], kh: usize, p: usize, scale: f32, res: &mut [f32]) {
        let hd = self.spec.head_dim;
        let g = qs.len() / hd;
        assert_eq!(res.len(), g * hd, "attend_group: {g} heads of {hd}");
        let lo = self
            .spec
            .window
            .map_or(0, |win| (p + 1).saturating_sub(win));
        let len = p + 1 - lo;
        let row = |j: usize| self.at(kh, j);
        let (kc, vc) = (self.k(), self.v());
        let mut scores = vec![0f32; g * len];
        for (jj, j) in (lo..=p).enumerate() {
            let k = &kc[row(j)..row(j) + hd];
            for (h, q) in qs.chunks_exact(hd).enumerate() {
                scores[h * len + jj] = dot_f16_f32(k, q) * scale;
            }
        }
        for s in scores.chunks_exact_mut(len) {
            super::softmax::softmax(s);
        }
        res.fill(0.0);
        for (jj, j) in (lo..=p).enumerate() {
            let v = &vc[row(j)..row(j) + hd];
            for (h, o) in res.chunks_exact_mut(hd).enumerate() {
                axpy_f16(o, scores[h * len + jj], v);
            }
        }
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
        let kh = h / (n_head / self.spec.n_head_kv);
        let (kc, vc) = (self.k(), self.v());
        let lo = self
            .spec
            .window
            .map_or(0, |win| (p + 1).saturating_sub(win));
        let mut scores: Vec<f32> = (lo..=p)
            .map(|j| {
                let s = self.at(kh, j);
                dot_f16_f32(&kc[s..s + hd], qh) * scale
            })
            .collect();
        super::softmax::softmax(&mut scores);
        o.fill(0.0);
        for (j, &wj) in (lo..=p).zip(&scores) {
            let s = self.at(kh, j);
            axpy_f16(o, wj, &vc[s..s + hd]);
        }
    }
}
