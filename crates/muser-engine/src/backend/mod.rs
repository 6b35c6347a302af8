//! The backend abstraction: the ops of the decode chain (SPEC section 3) at their natural
//! granularity, over buffers and weights the backend owns. The graph (`crate::graph`) is written
//! once against this trait and never knows which backend runs it.
//!
//! Buffers are row-major f32 matrices `[n_tokens, width]`: one row per token of the batch.
//! Positions of a batch are consecutive, starting at `pos0`; in a decode group (the `*_rows`
//! ops) row t is instead the next token of its own sequence, at position `pos[t]` of cache
//! `kvs[t]`.

pub mod cpu;
pub mod host;

pub use host::{HostBuf, HostMem};

use crate::config::RopeParams;
use crate::error::Result;
use crate::weights::TensorView;

/// The KV cache geometry of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayerSpec {
    /// Query heads that attend the layer (n_head / n_head_kv of them share a KV head).
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Sliding layers see positions p - window + 1 ..= p.
    pub window: Option<usize>,
    /// Positions held: a ring of `slots` for sliding layers (position p lives in slot
    /// p % slots), a plane growing up to `slots` positions for full layers.
    pub slots: usize,
}

impl KvLayerSpec {
    pub fn is_ring(&self) -> bool {
        self.window.is_some()
    }
    /// The slots a copy of positions 0..n takes (`Backend::kv_copy_prefix`, `kv_save`): a
    /// full layer's first n, a ring's all.
    pub fn prefix_slots(&self, n: usize) -> usize {
        if self.is_ring() {
            self.slots
        } else {
            n.min(self.slots)
        }
    }
}

/// A KV cache's entries of its first positions in host memory (`Backend::kv_save`): per
/// layer, its K and V values (f16 bits) of slots 0..len, slot by slot, each slot's KV heads in
/// order (`[len][n_head_kv * head_dim]`), whichever backend wrote them; any backend's `kv_load`
/// reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvHost {
    pub layers: Vec<[Vec<u16>; 2]>,
}

impl KvHost {
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|[k, v]| 2 * (k.len() + v.len()))
            .sum()
    }
}

/// The attention heads of a layer: `n_head` query heads of `head_dim` values, n_head /
/// n_head_kv of them sharing each of the `n_head_kv` KV heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// The residual branch's optional post-norm and the norm that follows the residual add.
pub struct NormArgs<'a, W> {
    pub weight: &'a W,
    pub eps: f32,
}

/// Decode steps by how they ran (`Backend::step_counts`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepCounts {
    /// Replayed from a recording of their shape.
    pub replayed: u64,
    /// Recorded (and run) on their shape's second step.
    pub recorded: u64,
    /// Issued op by op: the first step of a shape, or every step when recording is off.
    pub direct: u64,
}

pub trait Backend: Send + Sync + Sized {
    /// A weight (matrix `[rows, cols]` or vector `[cols]`) resident in the backend.
    type Weight: Send + Sync;
    /// An f32 activation buffer `[rows, cols]`.
    type Buf: Send;
    /// The KV cache of one sequence.
    type Kv: Send;
    /// A recorded decode step that can be replayed (CUDA: a graph); `()` for a backend that
    /// issues every op as it comes.
    type Recording: Send;

    /// Short name for tables ("CPU").
    fn name(&self) -> &'static str;
    /// Worker threads (CPU) or streams; 1 where it does not apply.
    fn threads(&self) -> usize;
    /// Runs `f` with the backend's execution context entered (the CPU enters its thread pool
    /// once per forward instead of once per op).
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Makes a tensor resident: a matrix for matmuls and embedding lookups, a vector for norms.
    /// Refuses a type the backend cannot compute with.
    fn weight(&self, t: &TensorView) -> Result<Self::Weight>;
    /// Every weight of the model is resident: the backend may drop what it kept for loading
    /// (staging buffers, the progress bar).
    fn weights_loaded(&self) {}
    fn buf(&self, rows: usize, cols: usize) -> Self::Buf;
    /// Copies host data `[rows * cols]` into `buf`.
    fn write(&self, buf: &mut Self::Buf, data: &[f32]);
    /// Host memory of `n` zeros for values read back from this backend at every step (a
    /// sequence's logits). By default a `Vec`; the CUDA backend may page-lock it, so that its
    /// reads land there by DMA with no staging copy.
    fn host_buf(&self, n: usize) -> HostBuf {
        HostBuf::zeros(n)
    }
    /// Copies `buf` to the host, `[rows * cols]`.
    fn read(&self, buf: &Self::Buf, out: &mut [f32]);
    /// Copies `buf` to the host in consecutive parts: `outs[0]` gets its first `outs[0].len()`
    /// values, `outs[1]` the next, and so on (the lengths add up to `rows * cols`): a decode
    /// group's logits straight into each sequence's buffer. By default through one `read`.
    fn read_parts(&self, buf: &Self::Buf, outs: &mut [&mut [f32]]) {
        let mut all = vec![0.0; outs.iter().map(|o| o.len()).sum()];
        self.read(buf, &mut all);
        copy_parts(&all, outs);
    }
    /// Copies rows `rows[k]` of `buf` (`[n_rows, cols]`; `rows` ascending, each below
    /// `n_rows`) into `outs[k]`, each `cols` values long: the rows of a decode group whose
    /// logits the host needs. By default through one `read` of the whole buffer.
    fn read_rows(&self, buf: &Self::Buf, n_rows: usize, rows: &[usize], outs: &mut [&mut [f32]]) {
        let cols = outs.first().map_or(0, |o| o.len());
        let mut all = vec![0.0; n_rows * cols];
        self.read(buf, &mut all);
        copy_rows(&all, rows, outs);
    }
    /// An empty KV cache of these layers, or an error naming the bytes it could not get.
    fn kv_cache(&self, layers: &[KvLayerSpec]) -> Result<Self::Kv>;
    /// `dst`'s cache entries of positions `0..n` become `src`'s (two caches of the same
    /// layers): a full layer's first n positions, a sliding layer's whole ring. The caller
    /// checks that `src` holds what those positions need.
    fn kv_copy_prefix(&self, src: &Self::Kv, dst: &mut Self::Kv, n: usize);
    /// `kv`'s entries of positions `0..n` (as `kv_copy_prefix` takes them) copied to host
    /// memory.
    fn kv_save(&self, kv: &Self::Kv, n: usize) -> KvHost;
    /// `kv`'s entries become those `host` holds (saved by `kv_save` from a cache of the same
    /// layers).
    fn kv_load(&self, host: &KvHost, kv: &mut Self::Kv);

    /// out[t] = embedding row tokens[t] (dequantized).
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf);
    /// out = rmsnorm(x, w, eps) per row; `w` None means weight ones.
    fn rmsnorm(&self, x: &Self::Buf, w: Option<&Self::Weight>, eps: f32, out: &mut Self::Buf);
    /// In place, per `head_dim`-wide head of every row: x_h = rmsnorm(x_h, w, eps).
    fn rmsnorm_heads(&self, x: &mut Self::Buf, w: &Self::Weight, head_dim: usize, eps: f32);
    /// outs[i] = x W_i^T for several weights sharing one input (quantized once).
    /// x: [n, cols], W_i: [rows_i, cols], outs[i]: [n, rows_i].
    fn matmul(&self, x: &Self::Buf, outs: &mut [(&Self::Weight, &mut Self::Buf)]);
    /// out = silu(x Wg^T) * (x Wu^T); x: [n, n_embd], out: [n, n_ff].
    fn ffn_gate_up_silu(
        &self,
        x: &Self::Buf,
        gate: &Self::Weight,
        up: &Self::Weight,
        out: &mut Self::Buf,
    );
    /// Copies rows `src_row .. src_row + n` of `src` into rows `dst_row .. dst_row + n` of
    /// `dst` (buffers of the same width).
    fn copy_rows(
        &self,
        src: &Self::Buf,
        src_row: usize,
        dst: &mut Self::Buf,
        dst_row: usize,
        n: usize,
    );
    /// Prefill chunks of fewer rows than this give every row the bits it gets in a chunk of any
    /// other such size (their matmuls compute each column as it is computed alone), so prompts
    /// of fewer tokens may share one forward pass (`Session::prefill_runs`) and keep the bits
    /// of their own prefill. Default: any size.
    fn exact_prefill_rows(&self) -> usize {
        usize::MAX
    }
    /// Whether a position's cache entries (and the logits after it) get the same bits whether
    /// the position came in a prefill chunk or in a decode step, so a scheduler may reuse a
    /// cache that decode steps extended as a later prompt's prefix. Default: they do.
    fn prefill_matches_decode(&self) -> bool {
        true
    }
    /// Runs `f` with every row's results independent of the pass it is in: its matmuls compute
    /// each column as it is computed alone whatever the number of columns, and its prefill
    /// attention each row by a plan of its own position (a pass of several prompts, or of a
    /// prompt cut into parts by a scheduler). Default: they always do.
    fn exact_columns<R>(&self, f: impl FnOnce() -> R) -> R {
        f()
    }
    /// Rotates every `head_dim`-wide head of row t at position pos0 + t, in place.
    fn rope(&self, x: &mut Self::Buf, head_dim: usize, rope: &RopeParams, pos0: usize);
    /// Stores k and v rows (positions pos0..pos0+n) into `layer` of the cache.
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, pos0: usize);
    /// out[t] = softmax(q_h . K^T * scale) V for each query head h over the positions row t
    /// (at pos0 + t) sees; query head h reads KV head h / (n_head / n_head_kv).
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        pos0: usize,
        scale: f32,
        out: &mut Self::Buf,
    );
    /// a *= sigmoid(g), elementwise.
    fn sigmoid_gate(&self, a: &mut Self::Buf, g: &Self::Buf);
    /// The residual tail: h += post ? rmsnorm(x, post) : x; out = rmsnorm(h, next).
    fn residual_norm(
        &self,
        h: &mut Self::Buf,
        x: &Self::Buf,
        post: Option<NormArgs<'_, Self::Weight>>,
        next: NormArgs<'_, Self::Weight>,
        out: &mut Self::Buf,
    );
    /// out = logits of rows first_row.. of x: c * tanh(x W^T * scale / c) with a softcap c,
    /// x W^T * scale without. out: [n - first_row, n_vocab].
    fn lm_head(
        &self,
        x: &Self::Buf,
        first_row: usize,
        w: &Self::Weight,
        scale: f32,
        softcap: Option<f32>,
        out: &mut Self::Buf,
    );

    /// Runs one decode step: `f` issues the step's ops (the graph over `Rows::Group`: row t is
    /// `tokens[t]` of sequence t at position `pos[t]` of cache `kvs[t]`). A backend may upload
    /// these per-step inputs to device tables first, record what `f` issues into `rec`, and on
    /// later steps of the same shape replay the recording instead of calling `f`; every op of a
    /// decode group reads its per-step values (tokens, positions, caches) from those tables,
    /// never from values baked into a launch. The default just calls `f`.
    fn decode_step(
        &self,
        rec: &mut Option<Self::Recording>,
        tokens: &[u32],
        kvs: &mut [&mut Self::Kv],
        pos: &[usize],
        f: impl FnOnce(&mut [&mut Self::Kv]),
    ) {
        let _ = (rec, tokens, pos);
        f(kvs)
    }

    /// Whether the host reads the logits of the decode steps that follow back (`read`, as
    /// `DecodeGroup::decode` does) or only reduces them where they are (`argmax`, `top_k`). A
    /// backend may then overlap the read with the LM head; no value depends on it.
    fn will_read_logits(&self, read: bool) {
        let _ = read;
    }

    /// How the decode steps of `decode_step` ran so far: replayed from a recording, recorded,
    /// or issued op by op. All zero for a backend that records nothing.
    fn step_counts(&self) -> StepCounts {
        StepCounts::default()
    }

    /// out[t] = the index of the largest value of row t of `x` (`[out.len(), cols]`), the first
    /// on ties. The default reads `x` back; a backend may compute it in place and read back one
    /// index per row.
    fn argmax(&self, x: &Self::Buf, cols: usize, out: &mut [u32]) {
        let mut host = vec![0f32; out.len() * cols];
        self.read(x, &mut host);
        for (o, row) in out.iter_mut().zip(host.chunks_exact(cols.max(1))) {
            *o = argmax_first(row);
        }
    }

    /// out[t] = the `k` best-ranked (id, logit) of row t of `x` (`[out.len(), cols]`): the
    /// highest logit first, the lower id first on ties, NaN never (`muser_sample::top_k_logits`),
    /// for a sampler whose pick depends only on them (`Sampler::top_k_of`). The default reads
    /// `x` back; a backend may compute them in place and read back k pairs per row.
    fn top_k(&self, x: &Self::Buf, cols: usize, k: usize, out: &mut [Vec<(u32, f32)>]) {
        host_top_k(self, x, cols, k, out)
    }
    /// The largest `k` that `top_k` computes in place (larger ones: read the logits).
    fn top_k_max(&self) -> usize {
        usize::MAX
    }

    // Decode groups: row t is one token of sequence t, at position pos[t] of the cache kvs[t].
    // The defaults run the one-sequence ops row by row through host copies (correct, slow);
    // a backend overrides them to run all rows in one launch. Whatever the group, each row's
    // result must be the one it gets alone (batch invariance): no reduction across rows.

    /// Rotates every `head_dim`-wide head of row t (`width` values) at position pos[t].
    fn rope_rows(
        &self,
        x: &mut Self::Buf,
        width: usize,
        head_dim: usize,
        rope: &RopeParams,
        pos: &[usize],
    ) {
        let mut rows = split_rows(self, x, pos.len(), width);
        for (r, &p) in rows.iter_mut().zip(pos) {
            self.rope(r, head_dim, rope, p);
        }
        join_rows(self, &rows, width, x);
    }

    /// Stores row t of k and v (`width` values each) at position pos[t] of `layer` in kvs[t].
    fn kv_store_rows(
        &self,
        kvs: &mut [&mut Self::Kv],
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        width: usize,
        pos: &[usize],
    ) {
        let ks = split_rows(self, k, pos.len(), width);
        let vs = split_rows(self, v, pos.len(), width);
        for (((kv, k), v), &p) in kvs.iter_mut().zip(&ks).zip(&vs).zip(pos) {
            self.kv_store(kv, layer, k, v, p);
        }
    }

    /// The attention prologue of a decode group, in place: per row t, the QK norm (`norms`:
    /// q's and k's weights and eps) of every head of q and k, RoPE at pos[t] (when `rope` is
    /// given), then k and v stored at pos[t] of `layer` in kvs[t]. The default runs
    /// `rmsnorm_heads`, `rope_rows` and `kv_store_rows`; a backend may fuse them, with the same
    /// arithmetic.
    #[allow(clippy::too_many_arguments)]
    fn qkv_rows(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        norms: Option<(&Self::Weight, &Self::Weight, f32)>,
        heads: Heads,
        rope: Option<&RopeParams>,
        kvs: &mut [&mut Self::Kv],
        layer: usize,
        pos: &[usize],
    ) {
        let hd = heads.head_dim;
        if let Some((qn, kn, eps)) = norms {
            self.rmsnorm_heads(q, qn, hd, eps);
            self.rmsnorm_heads(k, kn, hd, eps);
        }
        let (qw, kvw) = (heads.n_head * hd, heads.n_head_kv * hd);
        if let Some(rope) = rope {
            self.rope_rows(q, qw, hd, rope, pos);
            self.rope_rows(k, kvw, hd, rope, pos);
        }
        self.kv_store_rows(kvs, layer, k, v, kvw, pos);
    }

    /// out[t] = attention of row t of q (`width` values) over kvs[t] at position pos[t], as
    /// `attention` computes it for a one-row batch, times sigmoid(gate[t]) elementwise when a
    /// gate is given (as `sigmoid_gate` computes it).
    #[allow(clippy::too_many_arguments)]
    fn attention_rows(
        &self,
        q: &Self::Buf,
        width: usize,
        kvs: &[&mut Self::Kv],
        layer: usize,
        pos: &[usize],
        scale: f32,
        gate: Option<&Self::Buf>,
        out: &mut Self::Buf,
    ) {
        let qs = split_rows(self, q, pos.len(), width);
        let outs: Vec<Self::Buf> = qs
            .iter()
            .zip(kvs)
            .zip(pos)
            .map(|((q, kv), &p)| {
                let mut o = self.buf(1, width);
                self.attention(q, kv, layer, p, scale, &mut o);
                o
            })
            .collect();
        join_rows(self, &outs, width, out);
        if let Some(g) = gate {
            self.sigmoid_gate(out, g);
        }
    }
}

/// `Backend::top_k` through the host: `x` read back, `muser_sample::top_k_logits` per row.
pub fn host_top_k<B: Backend>(
    be: &B,
    x: &B::Buf,
    cols: usize,
    k: usize,
    out: &mut [Vec<(u32, f32)>],
) {
    let mut host = vec![0f32; out.len() * cols];
    be.read(x, &mut host);
    for (o, row) in out.iter_mut().zip(host.chunks_exact(cols.max(1))) {
        *o = muser_sample::top_k_logits(row, k)
            .into_iter()
            .map(|c| (c.id, c.logit))
            .collect();
    }
}

/// The index of the largest value (the first on ties; NaN never wins).
pub fn argmax_first(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || (row[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// The n rows of `buf` (`[n, width]`) as n one-row buffers (through the host).
fn split_rows<B: Backend>(be: &B, buf: &B::Buf, n: usize, width: usize) -> Vec<B::Buf> {
    let mut host = vec![0f32; n * width];
    be.read(buf, &mut host);
    host.chunks_exact(width)
        .map(|row| {
            let mut b = be.buf(1, width);
            be.write(&mut b, row);
            b
        })
        .collect()
}

/// Writes one-row buffers into the rows of `out` (`[rows.len(), width]`, through the host).
fn join_rows<B: Backend>(be: &B, rows: &[B::Buf], width: usize, out: &mut B::Buf) {
    let mut host = vec![0f32; rows.len() * width];
    for (r, dst) in rows.iter().zip(host.chunks_exact_mut(width)) {
        be.read(r, dst);
    }
    be.write(out, &host);
}

/// A progress bar over `total_bytes` of weights, labelled `what` (drawn on a terminal only),
/// for a backend to advance while it makes weights resident.
pub fn weights_progress(what: &str, total_bytes: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total_bytes);
    pb.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}})"
        ))
        .expect("valid template"),
    );
    pb
}

/// Copies `src` into `outs` in order (`read_parts`): `outs[0]` its first `outs[0].len()` values,
/// and so on; the lengths must add up to `src.len()`.
pub fn copy_parts(src: &[f32], outs: &mut [&mut [f32]]) {
    assert_eq!(
        outs.iter().map(|o| o.len()).sum::<usize>(),
        src.len(),
        "read_parts: the parts do not cover the buffer"
    );
    let mut at = 0;
    for o in outs.iter_mut() {
        o.copy_from_slice(&src[at..at + o.len()]);
        at += o.len();
    }
}

/// Panics unless a `copy_rows` of `n` rows from row `src_row` of a `src` (rows, cols) buffer to
/// row `dst_row` of a `dst` one stays inside both and their widths agree.
pub fn check_copy_rows(
    src: (usize, usize),
    src_row: usize,
    dst: (usize, usize),
    dst_row: usize,
    n: usize,
) {
    assert_eq!(src.1, dst.1, "copy_rows: widths {} and {}", src.1, dst.1);
    assert!(
        src_row + n <= src.0 && dst_row + n <= dst.0,
        "copy_rows: rows {src_row}+{n} of {} into {dst_row}+{n} of {}",
        src.0,
        dst.0
    );
}

/// Panics unless `read_rows`' arguments agree: one output per row, rows ascending and below
/// `n_rows`.
pub fn check_read_rows(n_rows: usize, rows: &[usize], outs: &[&mut [f32]]) {
    assert_eq!(
        rows.len(),
        outs.len(),
        "read_rows: {} rows into {} outputs",
        rows.len(),
        outs.len()
    );
    assert!(
        rows.windows(2).all(|w| w[0] < w[1]) && rows.last().is_none_or(|&r| r < n_rows),
        "read_rows: rows {rows:?} of {n_rows}"
    );
}

/// `outs[k]` = row `rows[k]` of `src` (rows as long as `outs[k]`): `read_rows`.
pub fn copy_rows(src: &[f32], rows: &[usize], outs: &mut [&mut [f32]]) {
    check_read_rows(usize::MAX, rows, outs);
    for (&r, o) in rows.iter().zip(outs.iter_mut()) {
        let w = o.len();
        assert!(
            (r + 1) * w <= src.len(),
            "read_rows: row {r} of {w} values past a buffer of {}",
            src.len()
        );
        o.copy_from_slice(&src[r * w..(r + 1) * w]);
    }
}

#[cfg(test)]
mod tests {
    use super::{argmax_first, copy_parts, copy_rows};

    #[test]
    fn argmax_first_takes_the_first_maximum_and_never_nan() {
        let mut rng = 0x9e37_79b9u32;
        let mut row: Vec<f32> = (0..300)
            .map(|_| {
                rng = rng.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (rng >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        row[17] = max + 1.0;
        row[230] = max + 1.0;
        assert_eq!(argmax_first(&row), 17);
        row[0] = f32::NAN;
        row[5] = f32::NAN;
        assert_eq!(argmax_first(&row), 17);
        let all_nan = vec![f32::NAN; 4];
        assert_eq!(argmax_first(&all_nan), 0);
        assert_eq!(
            argmax_first(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]),
            1
        );
    }

    #[test]
    fn copy_rows_takes_the_named_rows() {
        let src: Vec<f32> = (0..40).map(|i| (i as f32 * 0.61).cos() - 0.2).collect();
        let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
        copy_rows(&src, &[1, 4], &mut [&mut a, &mut b]);
        assert_eq!(a, src[8..16]);
        assert_eq!(b, src[32..40]);
    }

    #[test]
    #[should_panic(expected = "past a buffer")]
    fn copy_rows_refuses_a_row_past_the_buffer() {
        let src = vec![1.0f32; 10];
        let mut a = vec![0.0; 4];
        copy_rows(&src, &[2], &mut [&mut a]);
    }

    #[test]
    fn copy_parts_fills_each_part_in_order() {
        let src: Vec<f32> = (0..23).map(|i| (i as f32 * 0.37).sin() + 1.5).collect();
        let (mut a, mut b, mut c) = (vec![0.0; 5], vec![0.0; 0], vec![0.0; 18]);
        copy_parts(&src, &mut [&mut a, &mut b, &mut c]);
        let joined: Vec<f32> = a.iter().chain(&b).chain(&c).copied().collect();
        assert_eq!(joined, src);
    }

    #[test]
    #[should_panic(expected = "do not cover")]
    fn copy_parts_refuses_parts_that_do_not_cover_the_buffer() {
        let src = vec![1.0f32; 10];
        let mut a = vec![0.0; 4];
        copy_parts(&src, &mut [&mut a]);
    }
}
