//! The CPU backend: weights are zero-copy views of the mapped file, activations are f32
//! `Vec`s, the KV cache is f16, work runs on the backend's own rayon pool (entered once per
//! forward through `Backend::run`).

/// The shape check of every tile kernel's entry point: the CPU runs it, `blocks` weight blocks
/// are `rows` rows of the panel's `nb`, and the output's row stride `ld` holds `rows`.
#[cfg(target_arch = "x86_64")]
fn check_tile_shapes(
    what: &str,
    available: bool,
    blocks: usize,
    rows: usize,
    nb: usize,
    ld: usize,
) {
    assert!(available, "{what} needs AVX-512 VNNI");
    assert_eq!(
        blocks,
        rows * nb,
        "{what}: {blocks} blocks for {rows} rows of {nb}"
    );
    assert!(ld >= rows, "{what}: row stride {ld} < {rows} rows");
}

/// The tiles of a panel of `n` activation columns of `nb` blocks in groups of `c` columns:
/// `tile(group, block)` for every group and block, group-major, built on the current rayon pool
/// (one task per tile).
#[cfg(target_arch = "x86_64")]
fn panel_tiles<T: Send>(
    n: usize,
    nb: usize,
    c: usize,
    tile: impl Fn(usize, usize) -> T + Sync + Send,
) -> Vec<T> {
    use rayon::prelude::*;
    (0..n.div_ceil(c) * nb)
        .into_par_iter()
        .map(|i| tile(i / nb, i % nb))
        .collect()
}

/// The public K-quant entry points of a tile module (`tile.rs`, `tile4.rs`): `gemm_q4_k` ..
/// (checked, into a dense output) and `gemm_q4_k_into` .. (into a strided one), each calling the
/// module's `gemm_checked` and `gemm_into` with its panel type, and their shape check.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_entry_points {
    ($panel:ty, $prefix:literal) => {
        fn check_shapes<W>(what: &str, w: &[W], rows: usize, p: &$panel, ld: usize) {
            super::check_tile_shapes(what, available(), w.len(), rows, p.nb, ld)
        }

        /// out[t * rows + r] = dot(w[r], column t) for the panel's columns.
        pub fn gemm_q4_k(w: &[BlockQ4K], rows: usize, p: &$panel, out: &mut [f32]) {
            gemm_checked(concat!($prefix, "gemm_q4_k"), w, rows, p, out)
        }

        /// As `gemm_q4_k` for Q5_K.
        pub fn gemm_q5_k(w: &[BlockQ5K], rows: usize, p: &$panel, out: &mut [f32]) {
            gemm_checked(concat!($prefix, "gemm_q5_k"), w, rows, p, out)
        }

        /// As `gemm_q4_k` for Q6_K.
        pub fn gemm_q6_k(w: &[BlockQ6K], rows: usize, p: &$panel, out: &mut [f32]) {
            gemm_checked(concat!($prefix, "gemm_q6_k"), w, rows, p, out)
        }

        /// As `gemm_q4_k`, written to out[t * ld + r].
        ///
        /// # Safety
        /// `out` valid for writes at t * ld + r for t < p.n(), r < rows, unaliased meanwhile.
        pub unsafe fn gemm_q4_k_into(
            w: &[BlockQ4K],
            rows: usize,
            p: &$panel,
            out: *mut f32,
            ld: usize,
        ) {
            check_shapes(concat!($prefix, "gemm_q4_k"), w, rows, p, ld);
            gemm_into(w, rows, p, out, ld)
        }

        /// As `gemm_q4_k_into` for Q5_K.
        ///
        /// # Safety
        /// As `gemm_q4_k_into`.
        pub unsafe fn gemm_q5_k_into(
            w: &[BlockQ5K],
            rows: usize,
            p: &$panel,
            out: *mut f32,
            ld: usize,
        ) {
            check_shapes(concat!($prefix, "gemm_q5_k"), w, rows, p, ld);
            gemm_into(w, rows, p, out, ld)
        }

        /// As `gemm_q4_k_into` for Q6_K.
        ///
        /// # Safety
        /// As `gemm_q4_k_into`.
        pub unsafe fn gemm_q6_k_into(
            w: &[BlockQ6K],
            rows: usize,
            p: &$panel,
            out: *mut f32,
            ld: usize,
        ) {
            check_shapes(concat!($prefix, "gemm_q6_k"), w, rows, p, ld);
            gemm_into(w, rows, p, out, ld)
        }
    };
}

pub mod attn;
#[cfg(target_arch = "x86_64")]
pub mod gemm;
#[cfg(target_arch = "x86_64")]
mod k4;
pub mod kv;
pub mod matmul;
pub mod ops;
pub mod quant;
pub mod simd;
pub mod softmax;
#[cfg(target_arch = "x86_64")]
pub mod tile;
#[cfg(target_arch = "x86_64")]
pub mod tile4;
#[cfg(target_arch = "x86_64")]
pub mod tile_q8_0;
#[cfg(target_arch = "x86_64")]
pub mod x16;

use crate::backend::{Backend, KvHost, KvLayerSpec, NormArgs};
use crate::config::RopeParams;
use crate::error::{EngineError, Result};
use crate::weights::{TensorView, MATRIX_TYPES};
use kv::CpuKv;
use matmul::QuantizedInput;
use muser_gguf::GgmlType;
use muser_quant::simd::Kernels;
use rayon::prelude::*;

/// An f32 matrix `[rows, cols]`, row-major.
#[derive(Clone, Debug)]
pub struct CpuBuf {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuBuf {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A resident weight: a matrix view into the file, or a (small) vector dequantized to f32.
pub struct CpuWeight {
    pub view: TensorView,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// 1-D tensors (norm weights), dequantized.
    pub vector: Option<Vec<f32>>,
    /// A Q4_K, Q5_K or Q6_K matrix repacked for `x16` (CPUs with AVX2 or AVX-512 VNNI), which
    /// then serves every matmul over it; embedding rows are read from the file's bytes. Made at
    /// load, except for `token_embd.weight`: only if a matmul uses it (a tied LM head), so that
    /// an embedding table is not held twice.
    #[cfg(target_arch = "x86_64")]
    x16: std::sync::OnceLock<Option<x16::X16>>,
}

impl CpuWeight {
    fn vec(&self) -> &[f32] {
        self.vector.as_deref().expect("norm weight is a vector")
    }

    /// The `x16` repacking of a K-quant matrix, made on first use, when this CPU runs it.
    #[cfg(target_arch = "x86_64")]
    pub fn x16(&self) -> Option<&x16::X16> {
        self.x16
            .get_or_init(|| {
                if self.vector.is_some() || !matmul::x16_enabled(self.view.ty) {
                    return None;
                }
                let nb = self.cols / muser_quant::QK_K;
                x16::X16::new(self.view.ty, self.view.bytes(), self.rows, nb)
            })
            .as_ref()
    }
}

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    kernels: &'static Kernels,
    /// Shown while the weights load (`with_load_progress`).
    progress: std::sync::Mutex<Option<indicatif::ProgressBar>>,
}

/// The most worker threads a backend starts (ggml's limit too): more would only take the OS
/// seconds to start (100,000 took over a minute) and slow every step.
pub const MAX_THREADS: usize = 512;

impl CpuBackend {
    /// A backend with `threads` workers (None: one per core), 1 to `MAX_THREADS`.
    pub fn new(threads: Option<usize>) -> Result<CpuBackend> {
        let threads =
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if threads == 0 {
            return Err(EngineError::Invalid("threads must be at least 1".into()));
        }
        if threads > MAX_THREADS {
            return Err(EngineError::Invalid(format!(
                "threads must be at most {MAX_THREADS} (asked for {threads})"
            )));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("muser-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Invalid(format!("cannot start {threads} threads: {e}")))?;
        Ok(CpuBackend {
            pool,
            threads,
            kernels: Kernels::detect(),
            progress: std::sync::Mutex::new(None),
        })
    }

    /// Shows a progress bar (on a terminal) while `total_bytes` of weights load: the K-quant
    /// matrices are repacked then (`x16`), about 1 GB/s on 2 cores.
    pub fn with_load_progress(self, total_bytes: u64) -> CpuBackend {
        let pb = crate::backend::weights_progress("loading weights", total_bytes);
        *self.progress.lock().unwrap() = Some(pb);
        self
    }

    /// The ISA of the dot kernels in use ("avx512", "avx2", "scalar").
    pub fn isa(&self) -> &'static str {
        self.kernels.isa
    }

    fn quantize<'a>(
        &self,
        x: &'a [f32],
        n: usize,
        cols: usize,
        ws: &[&CpuWeight],
    ) -> QuantizedInput<'a> {
        let types: Vec<GgmlType> = ws.iter().map(|w| w.view.ty).collect();
        for w in ws {
            assert_eq!(
                w.cols, cols,
                "{}: input width {cols} != {}",
                w.view.name, w.cols
            );
        }
        QuantizedInput::new(x, n, cols, &types)
    }
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Buf = CpuBuf;
    type Kv = CpuKv;
    type Recording = ();

    fn name(&self) -> &'static str {
        "CPU"
    }
    fn threads(&self) -> usize {
        self.threads
    }
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn weight(&self, t: &TensorView) -> Result<CpuWeight> {
        let (cols, rows) = (t.cols(), t.rows());
        let bytes = t.bytes();
        let row_bytes = t.ty.row_bytes(cols as u64).ok_or_else(|| {
            EngineError::Invalid(format!(
                "tensor {}: row of {cols} values is not a whole number of {} blocks",
                t.name, t.ty
            ))
        })? as usize;
        if row_bytes * rows != bytes.len() {
            return Err(EngineError::Invalid(format!(
                "tensor {}: {} {:?} needs {} bytes, found {}",
                t.name,
                t.ty,
                t.dims,
                row_bytes * rows,
                bytes.len()
            )));
        }
        let progress = |n: usize| {
            if let Some(pb) = self.progress.lock().unwrap().as_ref() {
                pb.inc(n as u64);
            }
        };
        if t.dims.len() == 1 {
            let mut v = vec![0f32; cols];
            muser_quant::dequantize_row(t.ty, bytes, &mut v)?;
            progress(bytes.len());
            return Ok(CpuWeight {
                view: t.clone(),
                rows,
                cols,
                row_bytes,
                vector: Some(v),
                #[cfg(target_arch = "x86_64")]
                x16: std::sync::OnceLock::new(),
            });
        }
        if !MATRIX_TYPES.contains(&t.ty) {
            return Err(EngineError::TensorType {
                name: t.name.clone(),
                ty: t.ty,
                supported: "F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K",
            });
        }
        let align = if t.ty == GgmlType::F32 { 4 } else { 2 };
        if !(bytes.as_ptr() as usize).is_multiple_of(align) {
            return Err(EngineError::Invalid(format!(
                "tensor {}: data is not {align}-byte aligned",
                t.name
            )));
        }
        let w = CpuWeight {
            view: t.clone(),
            rows,
            cols,
            row_bytes,
            vector: None,
            #[cfg(target_arch = "x86_64")]
            x16: std::sync::OnceLock::new(),
        };
        // The repacking is all that matmuls read: the file's pages may leave memory (the
        // embedding table is repacked only if a matmul uses it, and keeps its pages).
        #[cfg(target_arch = "x86_64")]
        if t.name != "token_embd.weight" && w.x16().is_some() {
            t.release();
        }
        progress(bytes.len());
        Ok(w)
    }

    fn weights_loaded(&self) {
        if let Some(pb) = self.progress.lock().unwrap().take() {
            pb.finish_and_clear();
        }
    }

    fn buf(&self, rows: usize, cols: usize) -> CpuBuf {
        CpuBuf {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }
    fn write(&self, buf: &mut CpuBuf, data: &[f32]) {
        buf.data.copy_from_slice(data);
    }
    fn read(&self, buf: &CpuBuf, out: &mut [f32]) {
        out.copy_from_slice(&buf.data);
    }
    fn kv_copy_prefix(&self, src: &CpuKv, dst: &mut CpuKv, n: usize) {
        assert_eq!(
            src.layers.len(),
            dst.layers.len(),
            "KV copy between other models"
        );
        for (d, s) in dst.layers.iter_mut().zip(&src.layers) {
            d.copy_prefix(s, n);
        }
    }
    fn kv_save(&self, kv: &CpuKv, n: usize) -> KvHost {
        KvHost {
            layers: kv.layers.iter().map(|l| l.save(n)).collect(),
        }
    }
    fn kv_load(&self, host: &KvHost, kv: &mut CpuKv) {
        assert_eq!(
            host.layers.len(),
            kv.layers.len(),
            "KV load of another model"
        );
        for (l, h) in kv.layers.iter_mut().zip(&host.layers) {
            l.load(h);
        }
    }
    fn copy_rows(&self, src: &CpuBuf, src_row: usize, dst: &mut CpuBuf, dst_row: usize, n: usize) {
        crate::backend::check_copy_rows(
            (src.rows, src.cols),
            src_row,
            (dst.rows, dst.cols),
            dst_row,
            n,
        );
        let w = src.cols;
        dst.data[dst_row * w..(dst_row + n) * w]
            .copy_from_slice(&src.data[src_row * w..(src_row + n) * w]);
    }
    fn read_parts(&self, buf: &CpuBuf, outs: &mut [&mut [f32]]) {
        crate::backend::copy_parts(&buf.data, outs);
    }
    fn kv_cache(&self, layers: &[KvLayerSpec]) -> Result<CpuKv> {
        CpuKv::new(layers)
    }

    fn embed(&self, table: &CpuWeight, tokens: &[u32], out: &mut CpuBuf) {
        let bytes = table.view.bytes();
        let rb = table.row_bytes;
        out.data
            .par_chunks_mut(out.cols)
            .zip(tokens)
            .for_each(|(o, &tok)| {
                let t = tok as usize;
                // Token ids are checked by the session; the row length by `weight`.
                muser_quant::dequantize_row(table.view.ty, &bytes[t * rb..(t + 1) * rb], o)
                    .expect("embedding row has the checked length");
            });
    }

    fn rmsnorm(&self, x: &CpuBuf, w: Option<&CpuWeight>, eps: f32, out: &mut CpuBuf) {
        let w = w.map(|w| w.vec());
        out.data
            .par_chunks_mut(x.cols)
            .zip(x.data.par_chunks(x.cols))
            .for_each(|(o, x)| ops::rmsnorm_row(x, w, eps, o));
    }

    fn rmsnorm_heads(&self, x: &mut CpuBuf, w: &CpuWeight, head_dim: usize, eps: f32) {
        let w = w.vec();
        x.data.par_chunks_mut(head_dim).for_each(|h| {
            let src = h.to_vec();
            ops::rmsnorm_row(&src, Some(w), eps, h);
        });
    }

    fn matmul(&self, x: &CpuBuf, outs: &mut [(&CpuWeight, &mut CpuBuf)]) {
        let ws: Vec<&CpuWeight> = outs.iter().map(|(w, _)| *w).collect();
        let inp = self.quantize(&x.data, x.rows, x.cols, &ws);
        let mut slices: Vec<(&CpuWeight, &mut [f32])> = outs
            .iter_mut()
            .map(|(w, b)| (*w, b.data.as_mut_slice()))
            .collect();
        matmul::matmul_multi(self.kernels, self.threads, &inp, &mut slices);
    }

    fn ffn_gate_up_silu(&self, x: &CpuBuf, gate: &CpuWeight, up: &CpuWeight, out: &mut CpuBuf) {
        let inp = self.quantize(&x.data, x.rows, x.cols, &[gate, up]);
        matmul::gate_up_silu(self.kernels, self.threads, &inp, gate, up, &mut out.data);
    }

    fn rope(&self, x: &mut CpuBuf, head_dim: usize, rope: &RopeParams, pos0: usize) {
        /// (pos0, rows, n_rot, base bits) and the (cos, sin) of those rows.
        type Angles = ((usize, usize, usize, u32), Vec<(f32, f32)>);
        thread_local! {
            /// The angles of the calling thread's last batch: every layer's q and k of a batch
            /// use the same ones (computing them per call was 0.5% of prefill samples).
            static ANGLES: std::cell::RefCell<Angles> =
                const { std::cell::RefCell::new(((0, 0, 0, 0), Vec::new())) };
        }
        let half = rope.n_rot / 2;
        let key = (pos0, x.rows, rope.n_rot, rope.freq_base.to_bits());
        ANGLES.with(|a| {
            let mut a = a.borrow_mut();
            if a.0 != key || a.1.len() != x.rows * half {
                a.1.resize(x.rows * half, (0.0, 0.0));
                a.1.par_chunks_mut(half.max(1))
                    .enumerate()
                    .for_each(|(t, cs)| {
                        let mut v = Vec::with_capacity(half);
                        ops::rope_angles(pos0 + t, rope, &mut v);
                        cs.copy_from_slice(&v);
                    });
                a.0 = key;
            }
            let table = &a.1;
            x.data
                .par_chunks_mut(x.cols)
                .enumerate()
                .for_each(|(t, row)| {
                    let cs = &table[t * half..(t + 1) * half];
                    for h in row.chunks_exact_mut(head_dim) {
                        ops::rope_head(h, cs, rope.style);
                    }
                });
        });
    }

    fn kv_store(&self, kv: &mut CpuKv, layer: usize, k: &CpuBuf, v: &CpuBuf, pos0: usize) {
        kv.layers[layer].store(&k.data, &v.data, pos0);
    }

    fn attention(
        &self,
        q: &CpuBuf,
        kv: &CpuKv,
        layer: usize,
        pos0: usize,
        scale: f32,
        out: &mut CpuBuf,
    ) {
        let l = &kv.layers[layer];
        let n_head = q.cols / l.spec.head_dim;
        l.attend(&q.data, n_head, pos0, scale, &mut out.data);
    }

    fn sigmoid_gate(&self, a: &mut CpuBuf, g: &CpuBuf) {
        a.data
            .par_iter_mut()
            .zip(&g.data)
            .for_each(|(a, &g)| *a *= ops::sigmoid(g));
    }

    fn residual_norm(
        &self,
        h: &mut CpuBuf,
        x: &CpuBuf,
        post: Option<NormArgs<'_, CpuWeight>>,
        next: NormArgs<'_, CpuWeight>,
        out: &mut CpuBuf,
    ) {
        let cols = h.cols;
        let post = post.map(|p| (p.weight.vec(), p.eps));
        let (nw, neps) = (next.weight.vec(), next.eps);
        h.data
            .par_chunks_mut(cols)
            .zip(x.data.par_chunks(cols))
            .zip(out.data.par_chunks_mut(cols))
            .for_each(|((h, x), o)| {
                match post {
                    Some((w, eps)) => {
                        ops::rmsnorm_row(x, Some(w), eps, o);
                        h.iter_mut().zip(o.iter()).for_each(|(h, v)| *h += v);
                    }
                    None => h.iter_mut().zip(x).for_each(|(h, v)| *h += v),
                }
                ops::rmsnorm_row(h, Some(nw), neps, o);
            });
    }

    fn lm_head(
        &self,
        x: &CpuBuf,
        first_row: usize,
        w: &CpuWeight,
        scale: f32,
        softcap: Option<f32>,
        out: &mut CpuBuf,
    ) {
        let n = x.rows - first_row;
        let inp = self.quantize(&x.data[first_row * x.cols..], n, x.cols, &[w]);
        matmul::matmul_multi(
            self.kernels,
            self.threads,
            &inp,
            &mut [(w, out.data.as_mut_slice())],
        );
        out.data
            .par_chunks_mut(w.rows)
            .for_each(|row| ops::scale_softcap(row, scale, softcap));
    }

    fn rope_rows(
        &self,
        x: &mut CpuBuf,
        _width: usize,
        head_dim: usize,
        rope: &RopeParams,
        pos: &[usize],
    ) {
        x.data
            .par_chunks_mut(x.cols)
            .zip(pos)
            .for_each(|(row, &p)| {
                let mut cs = Vec::new();
                ops::rope_angles(p, rope, &mut cs);
                for h in row.chunks_exact_mut(head_dim) {
                    ops::rope_head(h, &cs, rope.style);
                }
            });
    }

    fn kv_store_rows(
        &self,
        kvs: &mut [&mut CpuKv],
        layer: usize,
        k: &CpuBuf,
        v: &CpuBuf,
        _width: usize,
        pos: &[usize],
    ) {
        kvs.par_iter_mut()
            .zip(k.data.par_chunks(k.cols))
            .zip(v.data.par_chunks(v.cols))
            .zip(pos)
            .for_each(|(((kv, k), v), &p)| kv.layers[layer].store(k, v, p));
    }

    fn attention_rows(
        &self,
        q: &CpuBuf,
        _width: usize,
        kvs: &[&mut CpuKv],
        layer: usize,
        pos: &[usize],
        scale: f32,
        gate: Option<&CpuBuf>,
        out: &mut CpuBuf,
    ) {
        let hd = kvs.first().map_or(1, |kv| kv.layers[layer].spec.head_dim);
        let n_head = q.cols / hd;
        let n_kv = kvs.first().map_or(1, |kv| kv.layers[layer].spec.n_head_kv);
        if attn::available(hd) && n_head.is_multiple_of(n_kv) {
            // One task per (row, KV head): its query heads together over the f16 cache, with
            // the bits of `attend_head` per head.
            let g = n_head / n_kv;
            out.data
                .par_chunks_mut(g * hd)
                .enumerate()
                .for_each(|(i, res)| {
                    let (t, kh) = (i / n_kv, i % n_kv);
                    let qs = &q.data[i * g * hd..(i + 1) * g * hd];
                    attn::attend_kv_head(&kvs[t].layers[layer], qs, kh, pos[t], scale, res);
                });
        } else {
            out.data.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
                let (t, h) = (i / n_head, i % n_head);
                let qh = &q.data[i * hd..(i + 1) * hd];
                kvs[t].layers[layer].attend_head(qh, h, n_head, pos[t], scale, o);
            });
        }
        if let Some(g) = gate {
            self.sigmoid_gate(out, g);
        }
    }
}
