//! Matrix x activations over quantized weights: `out[t][r] = dot(W[r], x[t])`.
//!
//! The input columns are quantized once per call to each activation format the weights need
//! (Q8_K for the K-quants, Q8_0 for Q8_0, f32 for the float types) and shared by every weight of
//! the call (Q/K/V/gate, gate+up). Work is split into tasks of consecutive weight rows (a few
//! hundred KB of weights each for one column) run on the current rayon pool; inside a task each
//! weight row is reused across a tile of columns while it sits in L1. The dots are
//! muser-quant's SIMD kernels (`Kernels::detect`). On CPUs with AVX2 (and FMA, F16C), Q4_K,
//! Q5_K and Q6_K matrices are repacked at load for `x16` (16 rows per register with AVX-512 VNNI,
//! 8 with AVX2; no reduction across lanes), which then serves every matmul over them whatever the
//! column count (bit-identical: `tests/gemm.rs`). 2-core Zen 4, llama-1b Q4_K_M, 2 threads,
//! alternated with `MUSER_CPU_X16=0` (BENCHMARKS.md, 2026-12-02): AVX-512, decode 2 / 4 streams
//! 75-89 / 109-134 tokens/s against 38-47 / 40-44; AVX2 (`MUSER_ISA=avx2`), 2 / 8 streams 72-88 /
//! 100-106 against 49-56 / 76, pp512 143-152 against 91-92; one stream unchanged (bound by
//! memory). The paths below are what runs when the repacking is off or for other types.
//! Otherwise, from 16 columns, Q4_K, Q5_K and Q6_K weights go through the tiles of `tile.rs`
//! instead (bit-identical), from 3 to 15 columns through those
//! of `tile4.rs`; both write straight into the output. From 12 columns Q8_0 weights go through
//! `tile_q8_0.rs` (bit-identical too), from 4 to 11 through `gemm::q8_0_matmul`. Below 4 the
//! one-column dots run: `q8_0_matmul`'s 8-row tiles are faster on one thread with the weights
//! in cache (llama-1b's shapes, one column: 51-62 GMAC/s against 39), but they read 8 rows as 8
//! streams, and decode from memory fell from 39-40 to 31 tokens/s (llama-1b Q8_0, 2 threads).
//! All of those need AVX-512 VNNI; on a CPU with AVX2 only, K-quant matmuls of 2 or more columns
//! go through muser-quant's AVX2 multi-column dots (`Kernels::cols`: 8, 4, then 2 columns per
//! weight row, each column with the AVX2 one-column dot's bits). One thread, Q4_K 512 x 2048 and
//! 256 x 7168 against 16 columns (`cargo test -p muser-quant --test cols_speed`, 2-core AMD EPYC
//! Zen 3, 2026-12-01): one-column 28.0 / 31.3 GMAC/s, 4 columns 39.2 / 43.1, 8 columns 50.4 /
//! 48.1.

use super::CpuWeight;
use muser_gguf::GgmlType;
use muser_quant::simd::Kernels;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, BlockQ8_0, QK8_0, QK_K};
use rayon::prelude::*;

/// Columns of `x` quantized to each activation format needed.
pub struct QuantizedInput<'a> {
    pub x: &'a [f32], // (n, cols)
    pub n: usize,
    pub cols: usize,
    q8_0: Vec<BlockQ8_0>, // (n, cols/32)
    q8_k: Vec<BlockQ8K>,  // (n, cols/256)
    /// The Q8_K columns in the tiled kernels' layout, when they serve this input.
    #[cfg(target_arch = "x86_64")]
    panel: Option<super::tile::Panel>,
    /// The same for `tile4.rs` (3 to 15 columns).
    #[cfg(target_arch = "x86_64")]
    panel4: Option<super::tile4::Panel4>,
    /// The Q8_0 columns in the layout of `tile_q8_0.rs`, when it serves this input.
    #[cfg(target_arch = "x86_64")]
    panel_q8_0: Option<super::tile_q8_0::PanelQ8_0>,
}

/// Columns from which Q4_K / Q5_K / Q6_K weights go through the tiles (16 columns a tile: with
/// fewer, the 8-column kernels of `gemm.rs` run faster; 8 streams 133 -> 149-159 tokens/s on the
/// 2-core machine, BENCHMARKS.md).
pub const TILE_MIN_COLUMNS: usize = 16;

/// Columns from which (up to `TILE_MIN_COLUMNS`) Q4_K / Q5_K / Q6_K weights go through the
/// 4-column-group kernels of `tile4.rs` (bit-identical) instead of the column kernels of
/// `gemm.rs` and the one-column dots. 2-core EPYC, 2 threads, llama-1b Q4_K_M tg32 total
/// tokens/s, column kernels -> tile4: 2 streams 94.75/92.59 -> 68.33/69.50 (so not from 2),
/// 3 streams 91.93/93.32 -> 102.86/99.90, 4: 122.63 -> 135.69, 6: 119.98 -> 161.71,
/// 8: 175.69 -> 209.70, 12: 158.19 -> 243.19 (BENCHMARKS.md).
pub const TILE4_MIN_COLUMNS: usize = 3;

/// Columns from which Q8_0 weights go through the tiles of `tile_q8_0.rs` (bit-identical)
/// instead of the register tiles of `gemm::q8_0_matmul`. One thread, llama-1b's shapes
/// (gate/up, down, q/o, k/v), GMAC/s tile_q8_0 against q8_0_matmul (`tests/gemm_speed.rs`,
/// 2026-11-30, both in the scalar reference's order): 8 columns 78-123 against 80-102 (the
/// large FFN shapes lose), 12: 162-184 against 99-106, 16: 232-246 against 101-105, 512: 345-362
/// against 88-105.
pub const TILE_Q8_0_MIN_COLUMNS: usize = 12;

impl<'a> QuantizedInput<'a> {
    /// Quantizes the n columns of `x` for every format `types` need.
    pub fn new(x: &'a [f32], n: usize, cols: usize, types: &[GgmlType]) -> QuantizedInput<'a> {
        let mut q = QuantizedInput {
            x,
            n,
            cols,
            q8_0: Vec::new(),
            q8_k: Vec::new(),
            #[cfg(target_arch = "x86_64")]
            panel: None,
            #[cfg(target_arch = "x86_64")]
            panel4: None,
            #[cfg(target_arch = "x86_64")]
            panel_q8_0: None,
        };
        if types.contains(&GgmlType::Q8_0) {
            let nb = cols / QK8_0;
            q.q8_0 = vec![bytemuck::Zeroable::zeroed(); n * nb];
            q.q8_0
                .par_chunks_mut(nb)
                .zip(x.par_chunks(cols))
                .for_each(|(y, x)| super::quant::quantize_row_q8_0(x, y));
            #[cfg(target_arch = "x86_64")]
            if n >= TILE_Q8_0_MIN_COLUMNS && super::tile_q8_0::available() {
                q.panel_q8_0 = Some(super::tile_q8_0::PanelQ8_0::new(&q.q8_0, n, nb));
            }
        }
        if types
            .iter()
            .any(|t| matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K))
        {
            let nb = cols / QK_K;
            q.q8_k = vec![bytemuck::Zeroable::zeroed(); n * nb];
            q.q8_k
                .par_chunks_mut(nb)
                .zip(x.par_chunks(cols))
                .for_each(|(y, x)| super::quant::quantize_row_q8_k(x, y));
            #[cfg(target_arch = "x86_64")]
            if n >= TILE_MIN_COLUMNS
                && super::tile::available()
                && types
                    .iter()
                    .any(|t| matches!(t, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K))
            {
                q.panel = Some(super::tile::Panel::new(&q.q8_k, n, nb));
            }
            #[cfg(target_arch = "x86_64")]
            if (TILE4_MIN_COLUMNS..TILE_MIN_COLUMNS).contains(&n) && super::tile4::available() {
                q.panel4 = Some(super::tile4::Panel4::new(&q.q8_k, n, nb));
            }
        }
        q
    }
}

/// Computes rows r0..r1 of `w` against every column: tile[t * (r1 - r0) + r - r0].
pub fn rows_times_columns(
    k: &Kernels,
    w: &CpuWeight,
    inp: &QuantizedInput,
    r0: usize,
    r1: usize,
    tile: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = w.x16() {
        assert_eq!(
            tile.len(),
            (r1 - r0) * inp.n,
            "rows_times_columns: tile size"
        );
        // SAFETY: tile holds n rows of r1 - r0 outputs, and is this call's alone.
        unsafe { x.gemm_into(&inp.q8_k, inp.n, r0, r1, tile.as_mut_ptr(), r1 - r0) };
        return;
    }
    let bytes = w.view.bytes();
    let rb = w.row_bytes;
    let wrows = &bytes[r0 * rb..r1 * rb];
    // A K-quant weight without a tile panel: the AVX-512 multi-column dots from 4 columns, else
    // the level's own (AVX2) from 2, else one column at a time; each column's bits are the
    // one-column dot's in every case.
    macro_rules! k_quant_cols {
        ($blk:ty, $cols:ident, $dot:ident, $c8:ident, $c4:ident, $c2:ident) => {
            match (cols::$cols::<8>(), cols::$cols::<4>(), k.cols) {
                (Some(k8), Some(k4), _) if inp.n >= 4 => {
                    kernel_cols(wrows, &inp.q8_k, inp.n, k.$dot, k8, k4, None, tile)
                }
                (_, _, Some(kc)) if inp.n >= 2 && level_cols() => {
                    let (k8, k4, k2) = (kc.$c8, kc.$c4, Some(kc.$c2));
                    kernel_cols(wrows, &inp.q8_k, inp.n, k.$dot, k8, k4, k2, tile)
                }
                _ => kernel::<$blk, BlockQ8K>(wrows, &inp.q8_k, inp.n, k.$dot, tile),
            }
        };
    }
    match w.view.ty {
        GgmlType::F32 => kernel::<f32, f32>(wrows, inp.x, inp.n, k.dot_f32, tile),
        GgmlType::F16 => kernel::<half::f16, f32>(wrows, inp.x, inp.n, k.dot_f16_f32, tile),
        GgmlType::BF16 => kernel::<half::bf16, f32>(wrows, inp.x, inp.n, k.dot_bf16_f32, tile),
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q8_0 if inp.panel_q8_0.is_some() => {
            let p = inp.panel_q8_0.as_ref().expect("checked");
            super::tile_q8_0::gemm_q8_0(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        GgmlType::Q8_0 => match cols::q8_0_matmul() {
            Some(mm) if inp.n >= 4 => {
                mm(bytemuck::cast_slice(wrows), r1 - r0, &inp.q8_0, inp.n, tile)
            }
            _ => kernel::<BlockQ8_0, BlockQ8_0>(wrows, &inp.q8_0, inp.n, k.dot_q8_0_q8_0, tile),
        },
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q4_K if inp.panel4.is_some() => {
            let p = inp.panel4.as_ref().expect("checked");
            super::tile4::gemm_q4_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q5_K if inp.panel4.is_some() => {
            let p = inp.panel4.as_ref().expect("checked");
            super::tile4::gemm_q5_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q6_K if inp.panel4.is_some() => {
            let p = inp.panel4.as_ref().expect("checked");
            super::tile4::gemm_q6_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q4_K if inp.panel.is_some() => {
            let p = inp.panel.as_ref().expect("checked");
            super::tile::gemm_q4_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q5_K if inp.panel.is_some() => {
            let p = inp.panel.as_ref().expect("checked");
            super::tile::gemm_q5_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q6_K if inp.panel.is_some() => {
            let p = inp.panel.as_ref().expect("checked");
            super::tile::gemm_q6_k(bytemuck::cast_slice(wrows), r1 - r0, p, tile)
        }
        GgmlType::Q4_K => k_quant_cols!(BlockQ4K, q4_k, dot_q4_k_q8_k, q4_k8, q4_k4, q4_k2),
        GgmlType::Q5_K => k_quant_cols!(BlockQ5K, q5_k, dot_q5_k_q8_k, q5_k8, q5_k4, q5_k2),
        GgmlType::Q6_K => k_quant_cols!(BlockQ6K, q6_k, dot_q6_k_q8_k, q6_k8, q6_k4, q6_k2),
        // CpuBackend::weight refuses every other type.
        t => unreachable!("matmul over unsupported type {t}"),
    }
}

/// Rows r0..r1 of `w` against every column through the tiled kernels, written to
/// out[t * ld + r - r0], when they serve this weight and input; false (nothing written)
/// otherwise.
///
/// # Safety
/// `out` must be valid for writes at t * ld + r for t < n, r < r1 - r0, unaliased meanwhile.
unsafe fn tiled_into(
    w: &CpuWeight,
    inp: &QuantizedInput,
    r0: usize,
    r1: usize,
    out: *mut f32,
    ld: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(x) = w.x16() {
            x.gemm_into(&inp.q8_k, inp.n, r0, r1, out, ld);
            return true;
        }
        let wrows = &w.view.bytes()[r0 * w.row_bytes..r1 * w.row_bytes];
        let rows = r1 - r0;
        // A K-quant weight through a tile module's `gemm_*_into` (tile.rs and tile4.rs have the
        // same entry points, `tile_entry_points!`).
        macro_rules! k_quant_into {
            ($m:ident, $p:expr) => {
                match w.view.ty {
                    GgmlType::Q4_K => {
                        super::$m::gemm_q4_k_into(bytemuck::cast_slice(wrows), rows, $p, out, ld);
                        return true;
                    }
                    GgmlType::Q5_K => {
                        super::$m::gemm_q5_k_into(bytemuck::cast_slice(wrows), rows, $p, out, ld);
                        return true;
                    }
                    GgmlType::Q6_K => {
                        super::$m::gemm_q6_k_into(bytemuck::cast_slice(wrows), rows, $p, out, ld);
                        return true;
                    }
                    _ => {}
                }
            };
        }
        if let Some(p) = inp.panel.as_ref() {
            k_quant_into!(tile, p);
        }
        if let (Some(p), GgmlType::Q8_0) = (inp.panel_q8_0.as_ref(), w.view.ty) {
            super::tile_q8_0::gemm_q8_0_into(bytemuck::cast_slice(wrows), rows, p, out, ld);
            return true;
        }
        if let Some(p) = inp.panel4.as_ref() {
            k_quant_into!(tile4, p);
        }
    }
    let _ = (w, inp, r0, r1, out, ld);
    false
}

/// Whether a level's own multi-column dots (`Kernels::cols`, AVX2) serve matmuls of 2 or more
/// columns; `MUSER_CPU_COLS=0` sends those columns one by one through the one-column dot (the
/// same bits: a measuring switch).
fn level_cols() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MUSER_CPU_COLS").map_or(true, |v| v != "0"))
}

/// Columns per tile: a weight row is reused for this many columns while it is in L1.
const COL_TILE: usize = 16;

fn kernel<W: bytemuck::Pod, A>(
    wrows: &[u8],
    acts: &[A],
    n: usize,
    dot: fn(&[W], &[A]) -> f32,
    tile: &mut [f32],
) {
    // Alignment was checked when the weight was made resident.
    let w: &[W] = bytemuck::cast_slice(wrows);
    let nr = tile.len() / n;
    let per_row = w.len() / nr;
    let per_col = acts.len() / n;
    for t0 in (0..n).step_by(COL_TILE) {
        let t1 = (t0 + COL_TILE).min(n);
        for r in 0..nr {
            let wr = &w[r * per_row..(r + 1) * per_row];
            for t in t0..t1 {
                tile[t * nr + r] = dot(wr, &acts[t * per_col..(t + 1) * per_col]);
            }
        }
    }
}

/// As `kernel`, eight, then four, then (with `dot2`) two columns at a time through multi-column
/// dots (the rest one by one).
#[allow(clippy::too_many_arguments)]
fn kernel_cols<W: bytemuck::Pod>(
    wrows: &[u8],
    acts: &[BlockQ8K],
    n: usize,
    dot: fn(&[W], &[BlockQ8K]) -> f32,
    dot8: cols::DotN<W, 8>,
    dot4: cols::DotN<W, 4>,
    dot2: Option<cols::DotN<W, 2>>,
    tile: &mut [f32],
) {
    let w: &[W] = bytemuck::cast_slice(wrows);
    let nr = tile.len() / n;
    let per_row = w.len() / nr;
    let per_col = acts.len() / n;
    let col = |t: usize| &acts[t * per_col..(t + 1) * per_col];
    for t0 in (0..n).step_by(COL_TILE) {
        let t1 = (t0 + COL_TILE).min(n);
        for r in 0..nr {
            let wr = &w[r * per_row..(r + 1) * per_row];
            let mut t = t0;
            while t + 8 <= t1 {
                let v = dot8(wr, std::array::from_fn(|k| col(t + k)));
                for (k, v) in v.into_iter().enumerate() {
                    tile[(t + k) * nr + r] = v;
                }
                t += 8;
            }
            if t + 4 <= t1 {
                let v = dot4(wr, std::array::from_fn(|k| col(t + k)));
                for (k, v) in v.into_iter().enumerate() {
                    tile[(t + k) * nr + r] = v;
                }
                t += 4;
            }
            if let Some(dot2) = dot2.filter(|_| t + 2 <= t1) {
                let v = dot2(wr, std::array::from_fn(|k| col(t + k)));
                for (k, v) in v.into_iter().enumerate() {
                    tile[(t + k) * nr + r] = v;
                }
                t += 2;
            }
            for t in t..t1 {
                tile[t * nr + r] = dot(wr, col(t));
            }
        }
    }
}

/// The multi-column kernels where this target has them.
mod cols {
    #[cfg(target_arch = "x86_64")]
    pub use super::super::gemm::{
        q4_k_cols as q4_k, q5_k_cols as q5_k, q6_k_cols as q6_k, q8_0_matmul, DotN,
    };
    #[cfg(not(target_arch = "x86_64"))]
    pub type DotN<W, const C: usize> = fn(&[W], [&[muser_quant::BlockQ8K]; C]) -> [f32; C];
    #[cfg(not(target_arch = "x86_64"))]
    pub fn q4_k<const C: usize>() -> Option<DotN<muser_quant::BlockQ4K, C>> {
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub fn q5_k<const C: usize>() -> Option<DotN<muser_quant::BlockQ5K, C>> {
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub type Q8_0Matmul =
        fn(&[muser_quant::BlockQ8_0], usize, &[muser_quant::BlockQ8_0], usize, &mut [f32]);
    #[cfg(not(target_arch = "x86_64"))]
    pub fn q8_0_matmul() -> Option<Q8_0Matmul> {
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub fn q6_k<const C: usize>() -> Option<DotN<muser_quant::BlockQ6K, C>> {
        None
    }
}

/// Rows per task: about 256 KB of weights, and at least 4 tasks per thread for each matrix.
pub fn rows_per_task(w: &CpuWeight, n: usize, threads: usize) -> usize {
    let by_bytes = (256 * 1024 / w.row_bytes.max(1)).max(1);
    let by_balance = w.rows.div_ceil(threads * 4).max(1);
    let mut r = by_bytes.min(by_balance);
    if n > 1 {
        // Compute-bound: smaller tasks balance better; keep a tile a few rows tall, in whole
        // tiles of the tiled kernels.
        r = r.min(w.rows.div_ceil(threads * 16)).max(4.min(w.rows));
        #[cfg(target_arch = "x86_64")]
        if n >= TILE_MIN_COLUMNS
            && matches!(w.view.ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
            && super::tile::available()
        {
            // Whole tiles of 16 rows.
            r = r
                .min(super::tile::rows_per_task(w.cols / QK_K))
                .div_ceil(super::tile::R)
                * super::tile::R;
        }
        #[cfg(target_arch = "x86_64")]
        if n >= TILE_Q8_0_MIN_COLUMNS
            && w.view.ty == GgmlType::Q8_0
            && super::tile_q8_0::available()
        {
            // Whole tiles of 16 rows.
            r = r
                .min(super::tile_q8_0::rows_per_task(w.cols / QK8_0))
                .div_ceil(super::tile_q8_0::R)
                * super::tile_q8_0::R;
        }
        r = r.div_ceil(4) * 4;
        if w.view.ty == GgmlType::Q8_0 {
            // Whole 8-row tiles of `gemm::q8_0_matmul`.
            r = r.div_ceil(8) * 8;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = w.x16() {
        // Whole groups of `x16`.
        r = r.div_ceil(x.group_rows()) * x.group_rows();
    }
    r
}

/// Whether matrices of type `ty` are repacked for `x16` at load: on CPUs that run it, for
/// the types it knows, unless `MUSER_CPU_X16` says otherwise (for comparisons: `0` for none, or
/// a list of types such as `q4_k,q6_k`).
pub fn x16_enabled(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x16::available()
            && std::env::var("MUSER_CPU_X16").map_or(true, |v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case(&ty.to_string()))
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);

impl OutPtr {
    /// The pointer (a method, so closures capture the whole Send + Sync wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
// SAFETY: every task writes a distinct set of elements (its own rows) and the pointer outlives
// the parallel loop that uses it.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// out_i[t][r] = dot(W_i[r], x[t]) for several weights sharing the quantized input.
pub fn matmul_multi(
    k: &Kernels,
    threads: usize,
    inp: &QuantizedInput,
    outs: &mut [(&CpuWeight, &mut [f32])],
) {
    let n = inp.n;
    let mut tasks = Vec::new();
    let mut ptrs = Vec::new();
    let mut weights = Vec::new();
    for (i, (w, out)) in outs.iter_mut().enumerate() {
        assert_eq!(
            out.len(),
            n * w.rows,
            "matmul output of {} has the wrong size",
            w.view.name
        );
        ptrs.push(OutPtr(out.as_mut_ptr()));
        weights.push(*w);
        let step = rows_per_task(w, n, threads);
        for r0 in (0..w.rows).step_by(step) {
            tasks.push((i, r0, (r0 + step).min(w.rows)));
        }
    }
    tasks.par_iter().for_each(|&(i, r0, r1)| {
        let w = weights[i];
        let p = ptrs[i];
        // SAFETY: columns r0..r1 of every row of out_i ([n, rows]) are inside it and only this
        // task writes them.
        if unsafe { tiled_into(w, inp, r0, r1, p.at(r0), w.rows) } {
            return;
        }
        let mut tile = vec![0f32; (r1 - r0) * n];
        rows_times_columns(k, w, inp, r0, r1, &mut tile);
        for (t, row) in tile.chunks_exact(r1 - r0).enumerate() {
            // SAFETY: row t, columns r0..r1 of out_i ([n, rows]) are inside it and only this
            // task writes them.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), p.at(t * w.rows + r0), r1 - r0) };
        }
    });
}

/// out[t][r] = silu(dot(G[r], x[t])) * dot(U[r], x[t]): both matrices in one pass over x
/// (silu on the shared vector exp, `softmax::silu_mul`).
pub fn gate_up_silu(
    k: &Kernels,
    threads: usize,
    inp: &QuantizedInput,
    g: &CpuWeight,
    u: &CpuWeight,
    out: &mut [f32],
) {
    let n = inp.n;
    let rows = g.rows;
    assert_eq!(out.len(), n * rows);
    let mut step = rows_per_task(g, n, threads);
    // Tasks start on whole groups of a repacked up matrix too (gate and up may differ in type).
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = u.x16() {
        step = step.div_ceil(x.group_rows()) * x.group_rows();
    }
    let p = OutPtr(out.as_mut_ptr());
    let tasks: Vec<usize> = (0..rows).step_by(step).collect();
    tasks.par_iter().for_each(|&r0| {
        let r1 = (r0 + step).min(rows);
        let nr = r1 - r0;
        with_scratch(nr * n, |tg| {
            rows_times_columns(k, g, inp, r0, r1, tg);
            // SAFETY: columns r0..r1 of every row of out are inside it and only this task
            // writes them.
            if unsafe { tiled_into(u, inp, r0, r1, p.at(r0), rows) } {
                for t in 0..n {
                    // SAFETY: as above; the slice is this task's part of row t.
                    let o = unsafe { std::slice::from_raw_parts_mut(p.at(t * rows + r0), nr) };
                    super::softmax::silu_mul_in_place(&tg[t * nr..(t + 1) * nr], o);
                }
                return;
            }
            let mut tu = vec![0f32; nr * n];
            rows_times_columns(k, u, inp, r0, r1, &mut tu);
            for t in 0..n {
                // SAFETY: as above.
                let o = unsafe { std::slice::from_raw_parts_mut(p.at(t * rows + r0), nr) };
                super::softmax::silu_mul(&tg[t * nr..(t + 1) * nr], &tu[t * nr..(t + 1) * nr], o);
            }
        });
    });
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs f on this thread's scratch buffer of `len` f32 (contents stale: f must write before
/// it reads).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let r = f(&mut buf[..len]);
    SCRATCH.with(|b| *b.borrow_mut() = buf);
    r
}
