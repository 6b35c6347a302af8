//! Tiled prefill matmul (AVX-512 VNNI): Q8_0 weights x Q8_0 activations, tiles of 16 weight rows
//! x 16 activation columns with the columns across the zmm lanes. Serves every Q8_0 matmul of
//! 12 columns or more (`matmul::TILE_Q8_0_MIN_COLUMNS`); from 4 to 11 columns
//! `gemm::q8_0_matmul` runs.
//!
//! Order. The bits are those of muser-quant's scalar reference `q8_0_blocks_add`, which every
//! one-column Q8_0 dot (decode) and `gemm::q8_0_matmul` keep: per (row, column) and block the
//! exact integer dot of the 32 products, then `sum += float(dot) * (d_x * d_y)` (two f32
//! products and a sum, no fma), blocks in order from the first. Here lane c of a vector is
//! column c: per block and row, its `vpdpbusd` chain over the 8 groups of 4 values gives the
//! block's integer exactly, then one conversion, d_x * d_y, the product and the sum, all lane-wise
//! the reference's operations on the same values, so the same bits (`tests/gemm.rs` checks every
//! (row, column) at ragged shapes against the scalar dot).
//!
//! Signed x signed. `vpdpbusd` multiplies unsigned by signed bytes: the panel holds the
//! activations plus 128 (0..255, a sign-bit flip), the weights' quants are the signed operand
//! (broadcast 4 at a time), and each block's chain starts at -128 x the sum of its 32 weights
//! (kept per row and block by the unpack). |32 x 255 x 128| + 128 x 32 x 128 fits an i32
//! easily, so every block's integer is exact.
//!
//! Layout. The activations are laid out once per matmul in a [`PanelQ8_0`]: per group of 16
//! columns and block, the 32 values plus 128 as 8 groups of 4 with the 16 columns side by side
//! (lane c holds column c's 4 values), and the columns' `d` as f32. A task's rows are unpacked
//! once per matmul: per row and block the 32 quants, the correction and `d` as f32 (40 bytes).
//! Then per group of 16 columns, per tile of 16 rows, passes of 8 rows (`row_pass`): the 8 rows'
//! f32 sums stay in registers while the blocks go by, the block's 8 activation vectors loaded
//! once for the 8 rows. The 16 x 16 result is transposed in registers and written one vector per
//! column (`tile::store_transposed`).
//!
//! Speed. One thread, 512 columns, llama-1b's shapes (7168 x 2048, 2048 x 7168, 2048 x 2048,
//! 512 x 2048): 345-362 GMAC/s against `q8_0_matmul`'s 88-105 (2026-11-30, 2-core AMD EPYC;
//! `tests/gemm_speed.rs`, MUSER_SPEED_ONLY=q8_0). The order before this one (that of the old
//! AVX-512 one-column dot: 32 f32 sums per (row, column), a conversion and an fma per 4-value
//! group, a reduction tree) bounded this kernel at 168-172. At 12 columns 162-184, at 16
//! 232-246, at 8 78-123 against `q8_0_matmul`'s 80-102.

use muser_quant::{BlockQ8_0, QK8_0};

/// Rows x columns of a tile.
pub const R: usize = 16;
pub const C: usize = 16;

/// out[t * rows + r] = dot(W[r], y[t]) for a row-major `rows x nb` block matrix `w` and `n`
/// Q8_0 activation columns of `nb` blocks each (`y` is `n x nb`).
pub type GemmFn = fn(w: &[BlockQ8_0], rows: usize, y: &[BlockQ8_0], n: usize, out: &mut [f32]);

/// Whether this CPU runs the tiled kernel.
pub fn available() -> bool {
    super::gemm::has_avx512_vnni()
}

/// The tiled Q8_0 kernel (panel built inside) when this CPU runs it.
pub fn q8_0_gemm() -> Option<GemmFn> {
    available().then_some(|w, rows, y, n, out| {
        let p = PanelQ8_0::new(y, n, w.len() / rows.max(1));
        gemm_q8_0(w, rows, &p, out)
    })
}

/// One group of 16 columns, one block.
#[derive(Clone)]
#[repr(C, align(64))]
struct ActTile {
    /// a[g][c][4]: values 4g .. 4g + 3 of column c, plus 128.
    a: [u8; 8 * C * 4],
    d: [f32; C],
}

/// The Q8_0 activation columns of a matmul laid out for the tiles (columns padded to a multiple
/// of 16 with zeros).
pub struct PanelQ8_0 {
    tiles: Vec<ActTile>,
    n: usize,
    nb: usize,
}

impl PanelQ8_0 {
    /// `y`: `n` columns of `nb` Q8_0 blocks each; built on the current rayon pool, one task per
    /// tile.
    pub fn new(y: &[BlockQ8_0], n: usize, nb: usize) -> PanelQ8_0 {
        assert_eq!(y.len(), n * nb, "PanelQ8_0: {n} columns of {nb} blocks");
        let tiles = super::panel_tiles(n, nb, C, |g, b| {
            let mut tile = ActTile {
                a: [0; 8 * C * 4],
                d: [0.0; C],
            };
            for c in 0..C.min(n - g * C) {
                let by = &y[(g * C + c) * nb + b];
                for gi in 0..8 {
                    for k in 0..4 {
                        tile.a[(gi * C + c) * 4 + k] = by.qs[4 * gi + k] as u8 ^ 0x80;
                    }
                }
                tile.d[c] = by.d.to_f32();
            }
            tile
        });
        PanelQ8_0 { tiles, n, nb }
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

/// One row's block, unpacked: the quants, -128 x their sum (the start of the block's
/// `vpdpbusd` chain, which sees the activations plus 128) and `d` as f32.
#[derive(Clone, Copy)]
#[repr(C)]
struct WBlock {
    q: [i8; QK8_0],
    corr: i32,
    d: f32,
}

const ZERO_W: WBlock = WBlock {
    q: [0; QK8_0],
    corr: 0,
    d: 0.0,
};

/// Rows of a task: whole tiles, about 384 KB of unpacked weights (40 bytes a block) so that they
/// stay in L2 while every column group passes; 16 to 64 rows.
pub fn rows_per_task(nb: usize) -> usize {
    let by_bytes = 384 * 1024 / (nb.max(1) * std::mem::size_of::<WBlock>());
    (by_bytes / R).clamp(1, 4) * R
}

thread_local! {
    /// The task's rows unpacked (rows x nb, rows padded to whole tiles).
    static W_BUF: std::cell::RefCell<Vec<WBlock>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// out[t * ld + r] for the task's rows (see `gemm_q8_0`).
///
/// # Safety
/// `out` valid for writes at t * ld + r for t < p.n, r < rows, unaliased meanwhile; the CPU has
/// the features of `available()`.
unsafe fn gemm_into(w: &[BlockQ8_0], rows: usize, p: &PanelQ8_0, out: *mut f32, ld: usize) {
    let nb = p.nb;
    let tiles = rows.div_ceil(R);
    W_BUF.with(|buf| {
        let wq = &mut *buf.borrow_mut();
        wq.resize(tiles * R * nb, ZERO_W);
        x86::unpack(w, &mut wq[..rows * nb]);
        wq[rows * nb..].fill(ZERO_W);
        for g in 0..p.n.div_ceil(C) {
            let acts = &p.tiles[g * nb..(g + 1) * nb];
            let cols = (p.n - g * C).min(C);
            for t in 0..tiles {
                x86::tile(
                    &wq[t * R * nb..(t + 1) * R * nb],
                    acts,
                    out.add(g * C * ld + t * R),
                    ld,
                    (rows - t * R).min(R),
                    cols,
                );
            }
        }
    });
}

fn check_shapes(what: &str, w: &[BlockQ8_0], rows: usize, p: &PanelQ8_0, ld: usize) {
    super::check_tile_shapes(what, available(), w.len(), rows, p.nb, ld)
}

/// out[t * rows + r] = dot(w[r], column t) for the panel's columns, with the bits of the scalar
/// reference dot (and so of every one-column dot).
pub fn gemm_q8_0(w: &[BlockQ8_0], rows: usize, p: &PanelQ8_0, out: &mut [f32]) {
    assert_eq!(
        out.len(),
        rows * p.n,
        "gemm_q8_0: output of {} x {rows}",
        p.n
    );
    check_shapes("gemm_q8_0", w, rows, p, rows);
    // SAFETY: the shapes and the CPU were checked; out holds n x rows values.
    unsafe { gemm_into(w, rows, p, out.as_mut_ptr(), rows) }
}

/// As `gemm_q8_0`, written to out[t * ld + r].
///
/// # Safety
/// `out` valid for writes at t * ld + r for t < p.n(), r < rows, unaliased meanwhile.
pub unsafe fn gemm_q8_0_into(
    w: &[BlockQ8_0],
    rows: usize,
    p: &PanelQ8_0,
    out: *mut f32,
    ld: usize,
) {
    check_shapes("gemm_q8_0", w, rows, p, ld);
    gemm_into(w, rows, p, out, ld)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ActTile, WBlock, C, R};
    use muser_quant::BlockQ8_0;
    use std::arch::x86_64::*;

    /// wq[i] = block w[i] unpacked (`WBlock`).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL + VNNI and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub unsafe fn unpack(w: &[BlockQ8_0], wq: &mut [WBlock]) {
        let ones = _mm256_set1_epi8(1);
        for (b, q) in w.iter().zip(wq.iter_mut()) {
            let v = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
            _mm256_storeu_si256(q.q.as_mut_ptr() as *mut __m256i, v);
            // The 8 lanes' sums of 4 values (1 x q), then their sum.
            let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, v);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
            q.corr = -128 * _mm_cvtsi128_si32(s);
            q.d = super::super::k4::f16_to_f32(b.d);
        }
    }

    /// Rows per pass: RG f32 sums (16 columns each) in registers.
    const RG: usize = 8;

    /// out[c * ld + r] = the dot of row r (blocks wq[r * nb ..]) and column c of `acts` (nb
    /// blocks), for r < rows <= R and c < cols <= C.
    ///
    /// # Safety
    /// `out` valid for writes at c * ld + r for those r and c; wq holds R x nb entries; the CPU
    /// has AVX-512 F/BW/VL + VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile(
        wq: &[WBlock],
        acts: &[ActTile],
        out: *mut f32,
        ld: usize,
        rows: usize,
        cols: usize,
    ) {
        let nb = acts.len();
        let mut f = [_mm512_setzero_ps(); R];
        for r0 in (0..R).step_by(RG) {
            let v = row_pass(&wq[r0 * nb..], acts);
            f[r0..r0 + RG].copy_from_slice(&v);
        }
        super::super::tile::store_transposed(&f, out, ld, rows, cols);
    }

    /// The sums of RG rows (blocks wq[r * nb + b]) against the 16 columns, in the order of the
    /// module doc: per block and row, its `vpdpbusd` chain (8 groups of 4 values, exact), one
    /// conversion, d_x * d_y, the product, the sum.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn row_pass(wq: &[WBlock], acts: &[ActTile]) -> [__m512; RG] {
        let nb = acts.len();
        assert!(wq.len() >= RG * nb);
        let mut acc = [_mm512_setzero_ps(); RG];
        for b in 0..nb {
            let a = acts.get_unchecked(b);
            let dy = _mm512_load_ps(a.d.as_ptr());
            let av: [__m512i; 8] =
                std::array::from_fn(|g| _mm512_load_si512(a.a.as_ptr().add(g * C * 4) as *const _));
            for (r, acc) in acc.iter_mut().enumerate() {
                let wb = wq.get_unchecked(r * nb + b);
                let q = |g: usize| (wb.q.as_ptr().add(4 * g) as *const i32).read_unaligned();
                let mut t = _mm512_set1_epi32(wb.corr);
                for (g, &av) in av.iter().enumerate() {
                    t = _mm512_dpbusd_epi32(t, av, _mm512_set1_epi32(q(g)));
                }
                let s = _mm512_mul_ps(_mm512_set1_ps(wb.d), dy);
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_cvtepi32_ps(t), s));
            }
        }
        acc
    }
}
