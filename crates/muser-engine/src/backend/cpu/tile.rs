//! Tiled prefill matmul (AVX-512 VNNI): Q4_K / Q5_K / Q6_K weights x Q8_K activations, tiles of
//! 16 weight rows x 16 activation columns with the columns across the zmm lanes. Serves every
//! matmul of 16 columns or more (`matmul::TILE_MIN_COLUMNS`).
//!
//! Order. Per (row, column) and block: the exact integers `isc = sum_s sc_s * dot_s` and (Q4_K,
//! Q5_K) `im = sum_s m_s * bsum_s`, then `v = d_y * d * isc - d_y * dmin * im` in f32, added to
//! the pair's sum block by block from 0: the order of muser-quant's scalar reference dots
//! (`dot.rs`) and of its AVX-512 one-column kernels, so a matmul gives bit for bit what
//! one-column dots give and prefill logits equal decode logits (`tests/gemm.rs`).
//!
//! Layout. The activations are laid out once per matmul in a [`Panel`]: per group of 16
//! columns and block, the 256 values as 64 groups of 4 with the 16 columns side by side (the
//! `vpdpbusd` operand: lane c holds column c's 4 values), the sums per 32 values paired for the
//! mins (Q4_K/Q5_K) and per 16 values (the Q6_K offset), and the columns' `d`. A task's rows
//! (four tiles of 16) are unpacked together, once per chunk of 512 columns (a whole prefill
//! chunk): the quants as one unsigned byte per value, the sub-block scales and mins as i32, `d`
//! and `dmin` as f32. Then per group of 16 columns the four row tiles advance block by block,
//! so a block of activations serves them all while it is in L1.
//!
//! Microkernel (`tile_k4`, `tile_q6`): per sub-block, the 4-value groups of the 16 columns are
//! loaded once, and 8 rows at a time run `vpdpbusd` with their 4 quants broadcast from memory
//! (8 per Q4_K/Q5_K sub-block of 32, 4 per Q6_K sub-block of 16; the 8 rows' chains
//! interleaved), then multiply the sum by the sub-block scale into the row's i32 accumulator
//! (`vpmulld`; Q6_K first takes 32 x the columns' sums of the sub-block off, its quants being
//! 0..63 for q - 32). The mins are 4 `vpdpwssd` per row on pairs (m_2p, m_2p+1). Then per row
//! one f32 value per lane. The 16 x 16 result is transposed in registers and written one
//! vector per column. One thread, 512 columns, llama-1b's shapes: 326-345 GMAC/s (2026-11-30,
//! BENCHMARKS.md; `tests/gemm_speed.rs`).

use muser_quant::blocks::scale_min_k4;
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};

/// Rows x columns of a tile.
pub const R: usize = 16;
pub const C: usize = 16;

/// out[t * rows + r] = dot(W[r], y[t]) for a row-major `rows x nb` block matrix `w` and `n`
/// activation columns of `nb` blocks each (`y` is `n x nb`).
pub type GemmFn<W> = fn(w: &[W], rows: usize, y: &[BlockQ8K], n: usize, out: &mut [f32]);

/// Whether this CPU runs the tiled kernels.
pub fn available() -> bool {
    super::gemm::has_avx512_vnni()
}

/// The tiled Q4_K kernel (panel built inside) when this CPU runs it.
pub fn q4_k_gemm() -> Option<GemmFn<BlockQ4K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q4_k(w, rows, &p, out)
    })
}

/// The tiled Q5_K kernel (panel built inside) when this CPU runs it.
pub fn q5_k_gemm() -> Option<GemmFn<BlockQ5K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q5_k(w, rows, &p, out)
    })
}

/// The tiled Q6_K kernel (panel built inside) when this CPU runs it.
pub fn q6_k_gemm() -> Option<GemmFn<BlockQ6K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel::new(y, n, w.len() / rows.max(1));
        gemm_q6_k(w, rows, &p, out)
    })
}

/// One group of 16 columns, one block (see the module doc).
#[derive(Clone)]
#[repr(C, align(64))]
struct ActTile {
    /// a[g][c][4]: values 4g .. 4g + 3 of column c.
    a: [i8; 64 * C * 4],
    /// Per pair p of 32-value sub-blocks: column c's sums of sub-blocks 2p (low i16) and 2p + 1.
    s32: [i32; 4 * C],
    /// Per 16-value sub-block j: column c's sum.
    s16: [i32; 16 * C],
    d: [f32; C],
}

/// The activation columns of a matmul laid out for the tiles (columns padded to a multiple of
/// 16 with zeros).
pub struct Panel {
    tiles: Vec<ActTile>,
    n: usize,
    nb: usize,
}

impl Panel {
    /// `y`: `n` columns of `nb` Q8_K blocks each. Built on the current rayon pool, one task
    /// per tile (serial, it was 1.1-1.4% of the samples of a 2-thread prefill, with the other
    /// thread idle meanwhile).
    pub fn new(y: &[BlockQ8K], n: usize, nb: usize) -> Panel {
        assert_eq!(y.len(), n * nb, "Panel: {n} columns of {nb} blocks");
        let tiles = super::panel_tiles(n, nb, C, |g, b| {
            let mut tile = ActTile {
                a: [0; 64 * C * 4],
                s32: [0; 4 * C],
                s16: [0; 16 * C],
                d: [0.0; C],
            };
            for c in 0..C.min(n - g * C) {
                let by = &y[(g * C + c) * nb + b];
                for gi in 0..64 {
                    tile.a[(gi * C + c) * 4..(gi * C + c) * 4 + 4]
                        .copy_from_slice(&by.qs[4 * gi..4 * gi + 4]);
                }
                for p in 0..4 {
                    let lo = by.bsums[4 * p] as i32 + by.bsums[4 * p + 1] as i32;
                    let hi = by.bsums[4 * p + 2] as i32 + by.bsums[4 * p + 3] as i32;
                    tile.s32[p * C + c] = (lo & 0xffff) | (hi << 16);
                }
                for j in 0..16 {
                    tile.s16[j * C + c] = by.bsums[j] as i32;
                }
                tile.d[c] = by.d;
            }
            tile
        });
        Panel { tiles, n, nb }
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

/// A tile of 16 weight rows, one block, unpacked (rows past the matrix are zero).
#[derive(Clone)]
#[repr(C, align(64))]
struct WTile {
    q: [u8; R * QK_K],
    /// Sub-block scales: Q4_K/Q5_K 8 per row, Q6_K 16 per row.
    sc: [i32; R * 16],
    /// Q4_K/Q5_K: the mins in pairs (m_2p low i16, m_2p+1 high), 4 per row.
    mn: [i32; R * 4],
    d: [f32; R],
    dmin: [f32; R],
}

const ZERO_W: WTile = WTile {
    q: [0; R * QK_K],
    sc: [0; R * 16],
    mn: [0; R * 4],
    d: [0.0; R],
    dmin: [0.0; R],
};

/// The K-quant formats of the tiles: how a block unpacks.
trait TileBlock: Copy {
    const Q6: bool;
    fn unpack(&self, t: &mut WTile, r: usize);
}

/// Writes row r's scales, mins (in pairs) and block scales of a Q4_K/Q5_K block.
fn scales_k4(t: &mut WTile, r: usize, scales: &[u8; 12], d: f32, dmin: f32) {
    for s in 0..8 {
        t.sc[r * 16 + s] = scale_min_k4(s, scales).0 as i32;
    }
    for p in 0..4 {
        let (m0, m1) = (
            scale_min_k4(2 * p, scales).1,
            scale_min_k4(2 * p + 1, scales).1,
        );
        t.mn[r * 4 + p] = m0 as i32 | (m1 as i32) << 16;
    }
    t.d[r] = d;
    t.dmin[r] = dmin;
}

/// Q4_K nibbles in value order: per 64 values, byte l of the group's 32 holds value l (low
/// nibble) and l + 32 (high); `BlockQ4K::quant`'s layout, written as loops the compiler
/// vectorizes (the unpack runs once per row tile, block and column chunk).
fn nibbles(q: &mut [u8], qs: &[u8; 128]) {
    for j in 0..4 {
        let src = &qs[32 * j..32 * j + 32];
        let (lo, hi) = q[64 * j..64 * j + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = src[l] & 0x0f;
            hi[l] = src[l] >> 4;
        }
    }
}

impl TileBlock for BlockQ4K {
    const Q6: bool = false;
    fn unpack(&self, t: &mut WTile, r: usize) {
        nibbles(&mut t.q[r * QK_K..(r + 1) * QK_K], &self.qs);
        scales_k4(t, r, &self.scales, self.d.to_f32(), self.dmin.to_f32());
    }
}

impl TileBlock for BlockQ5K {
    const Q6: bool = false;
    fn unpack(&self, t: &mut WTile, r: usize) {
        let q = &mut t.q[r * QK_K..(r + 1) * QK_K];
        nibbles(q, &self.qs);
        // The fifth bit of value 64j + 32h + l is bit 2j + h of qh[l] (`BlockQ5K::quant`).
        for j in 0..4 {
            for h in 0..2 {
                let bit = 2 * j + h;
                for l in 0..32 {
                    q[64 * j + 32 * h + l] |= ((self.qh[l] >> bit) & 1) << 4;
                }
            }
        }
        scales_k4(t, r, &self.scales, self.d.to_f32(), self.dmin.to_f32());
    }
}

impl TileBlock for BlockQ6K {
    const Q6: bool = true;
    fn unpack(&self, t: &mut WTile, r: usize) {
        let q = &mut t.q[r * QK_K..(r + 1) * QK_K];
        // Value 128h + 32k + l (`BlockQ6K::quant`): the low nibble of ql[64h + 32(k & 1) + l]
        // (k < 2) or its high nibble (k >= 2), the high bits pair k of qh[32h + l].
        for h in 0..2 {
            for k in 0..4 {
                let ql = &self.ql[64 * h + 32 * (k & 1)..64 * h + 32 * (k & 1) + 32];
                let qh = &self.qh[32 * h..32 * h + 32];
                let dst = &mut q[128 * h + 32 * k..128 * h + 32 * k + 32];
                for l in 0..32 {
                    let low = if k < 2 { ql[l] & 0x0f } else { ql[l] >> 4 };
                    dst[l] = low | (((qh[l] >> (2 * k)) & 3) << 4);
                }
            }
        }
        for j in 0..16 {
            t.sc[r * 16 + j] = self.scales[j] as i32;
        }
        t.d[r] = self.d.to_f32();
    }
}

/// Columns per chunk: a row tile's blocks are unpacked once per chunk, and the chunk's
/// activations stream from L2/L3 past them. 512 (one prefill chunk: each weight block unpacked
/// once) against 128 (the chunk's activations kept in L2, weights unpacked four times at 512
/// columns): llama-1b Q4_K_M pp512 on 2 threads 499-511 -> 531-532 tokens/s (BENCHMARKS.md).
const CHUNK: usize = 512;

/// Row tiles unpacked together (a task's rows): each column group's activations pass them all
/// while they are in L2, rather than coming from L3 once per row tile.
const TILES: usize = 4;

/// Rows of a task: four tiles (`TILES`), whatever the row length (`nb` blocks; kept in the
/// signature for the callers' rule). The four tiles' unpacked blocks live together (about 22 KB
/// per block: 176 KB at 8 blocks, 616 KB at 28, inside a 1 MB L2); four tiles keep tasks small
/// enough to balance two threads over the Glimmer and llama-1b shapes (eight gave no more
/// prefill on llama-1b: pp512 584.22 / 587.25 / 584.87 against 597.82 / 589.81 / 581.40).
pub fn rows_per_task(_nb: usize) -> usize {
    4 * R
}

thread_local! {
    static W_BUF: std::cell::RefCell<Vec<WTile>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// out[t * ld + r] for the task's rows (see `gemm_q4_k`).
///
/// # Safety
/// `out` valid for writes at t * ld + r for t < p.n, r < rows, unaliased meanwhile.
unsafe fn gemm_into<B: TileBlock>(w: &[B], rows: usize, p: &Panel, out: *mut f32, ld: usize) {
    let nb = p.nb;
    W_BUF.with(|buf| {
        let mut wt = buf.borrow_mut();
        wt.resize(TILES * nb, ZERO_W);
        for c0 in (0..p.n).step_by(CHUNK) {
            let c1 = (c0 + CHUNK).min(p.n);
            for s0 in (0..rows).step_by(TILES * R) {
                let tiles = (rows - s0).min(TILES * R).div_ceil(R);
                for i in 0..tiles {
                    let r0 = s0 + i * R;
                    let nr = (rows - r0).min(R);
                    for (b, t) in wt.iter_mut().skip(i).step_by(tiles).take(nb).enumerate() {
                        for r in 0..R {
                            if r < nr {
                                w[(r0 + r) * nb + b].unpack(t, r);
                            } else {
                                t.q[r * QK_K..(r + 1) * QK_K].fill(0);
                                t.sc[r * 16..(r + 1) * 16].fill(0);
                                t.mn[r * 4..(r + 1) * 4].fill(0);
                                t.d[r] = 0.0;
                                t.dmin[r] = 0.0;
                            }
                        }
                    }
                }
                for g in (c0 / C)..c1.div_ceil(C) {
                    x86::tile_rows::<B>(
                        &wt[..tiles * nb],
                        tiles,
                        &p.tiles[g * nb..(g + 1) * nb],
                        out.add(g * C * ld + s0),
                        ld,
                        rows - s0,
                        (p.n - g * C).min(C),
                    );
                }
            }
        }
    });
}

/// out[t * rows + r] for every column of the panel (`what` names the caller in errors).
fn gemm_checked<B: TileBlock>(what: &str, w: &[B], rows: usize, p: &Panel, out: &mut [f32]) {
    assert_eq!(out.len(), rows * p.n, "{what}: output of {} x {rows}", p.n);
    check_shapes(what, w, rows, p, rows);
    // SAFETY: the shapes were checked; out holds n x rows values.
    unsafe { gemm_into(w, rows, p, out.as_mut_ptr(), rows) }
}

tile_entry_points!(Panel, "");

/// The 16 x 16 transposed store, shared with `tile_q8_0.rs`.
#[cfg(target_arch = "x86_64")]
pub(super) use x86::store_transposed;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ActTile, TileBlock, WTile, C, R, TILES};
    use std::arch::x86_64::*;

    /// out[c * ld + r] = the dot of row r and column c over the blocks (wt[b * tiles + r / R],
    /// acts[b]), in the order of the module doc, for r < min(rows, tiles * R) and c < cols:
    /// `tiles` row tiles, block by block, so that each block of activations serves them all
    /// while it is in L1.
    ///
    /// # Safety
    /// `out` valid for writes at c * ld + r for those r and c (cols <= C, tiles <= TILES);
    /// the CPU has the features of `available()` (AVX-512 F/BW/VL + VNNI).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile_rows<B: TileBlock>(
        wt: &[WTile],
        tiles: usize,
        acts: &[ActTile],
        out: *mut f32,
        ld: usize,
        rows: usize,
        cols: usize,
    ) {
        // The sums start at the first block (`first`: 0 + v there, as the reference's sum from
        // 0), so the 4 KB of accumulators are not zeroed per call (a `memset`: 2% of prefill).
        let mut acc = [std::mem::MaybeUninit::<[__m512; R]>::uninit(); TILES];
        if acts.is_empty() {
            acc = [std::mem::MaybeUninit::new([_mm512_setzero_ps(); R]); TILES];
        }
        for (b, (wb, a)) in wt.chunks_exact(tiles).zip(acts).enumerate() {
            for (w, acc) in wb.iter().zip(acc.iter_mut()) {
                let acc = acc.as_mut_ptr() as *mut __m512;
                if B::Q6 {
                    tile_q6(w, a, acc, b == 0);
                } else {
                    tile_k4(w, a, acc, b == 0);
                }
            }
        }
        for (i, acc) in acc.iter().take(tiles).enumerate() {
            // SAFETY: the first block (or the zeros above) wrote the tiles used here.
            let acc = &*acc.as_ptr();
            store_transposed(acc, out.add(i * R), ld, (rows - i * R).min(R), cols);
        }
    }

    /// out[c * ld + r] = lane c of acc[r]: the 16 x 16 tile transposed in registers, each
    /// column's rows written as one vector (masked to nr rows).
    #[target_feature(enable = "avx512f")]
    pub(in crate::backend::cpu) unsafe fn store_transposed(
        acc: &[__m512; R],
        out: *mut f32,
        ld: usize,
        nr: usize,
        cols: usize,
    ) {
        // Pairs of rows interleaved: t[2i] lane k = (a[2i][4k], a[2i+1][4k], a[2i][4k+1],
        // a[2i+1][4k+1]), t[2i+1] the same for 4k+2, 4k+3.
        let t: [__m512; R] = std::array::from_fn(|i| {
            let (a, b) = (acc[i & !1], acc[i | 1]);
            if i & 1 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4i + j] lane k: column 4k + j, rows 4i .. 4i + 3.
        let u: [__m512; R] = std::array::from_fn(|x| {
            let (i, j) = (x / 4, x % 4);
            let a = _mm512_castps_pd(t[4 * i + (j >> 1)]);
            let b = _mm512_castps_pd(t[4 * i + 2 + (j >> 1)]);
            _mm512_castpd_ps(if j & 1 == 0 {
                _mm512_unpacklo_pd(a, b)
            } else {
                _mm512_unpackhi_pd(a, b)
            })
        });
        let mask: __mmask16 = if nr >= R { 0xffff } else { (1u16 << nr) - 1 };
        for j in 0..4 {
            let v = [u[j], u[4 + j], u[8 + j], u[12 + j]];
            let x0 = _mm512_shuffle_f32x4::<0x44>(v[0], v[1]);
            let x1 = _mm512_shuffle_f32x4::<0xee>(v[0], v[1]);
            let x2 = _mm512_shuffle_f32x4::<0x44>(v[2], v[3]);
            let x3 = _mm512_shuffle_f32x4::<0xee>(v[2], v[3]);
            // o[k]: column 4k + j, rows 0..16.
            let o = [
                _mm512_shuffle_f32x4::<0x88>(x0, x2),
                _mm512_shuffle_f32x4::<0xdd>(x0, x2),
                _mm512_shuffle_f32x4::<0x88>(x1, x3),
                _mm512_shuffle_f32x4::<0xdd>(x1, x3),
            ];
            for (k, ok) in o.iter().enumerate() {
                let c = 4 * k + j;
                if c < cols {
                    _mm512_mask_storeu_ps(out.add(c * ld), mask, *ok);
                }
            }
        }
    }

    /// Rows per pass of the microkernels: their sums interleave, so four independent
    /// `vpdpbusd` chains are in flight, and the pass's integer sums stay in registers.
    const RG: usize = 8;

    /// acc: R sums, written (`first`: 0 + v) or added to.
    // The row index addresses the accumulators, the scales and the f32 sums together.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile_k4(w: &WTile, a: &ActTile, acc: *mut __m512, first: bool) {
        let sp: [__m512i; 4] =
            std::array::from_fn(|p| _mm512_load_si512(a.s32.as_ptr().add(p * C) as *const _));
        let dy = _mm512_load_ps(a.d.as_ptr());
        for r0 in (0..R).step_by(RG) {
            let mut isc = [_mm512_setzero_si512(); RG];
            for s in 0..8 {
                let ag: [__m512i; 8] = std::array::from_fn(|g| {
                    _mm512_load_si512(a.a.as_ptr().add((8 * s + g) * C * 4) as *const _)
                });
                let mut t = [_mm512_setzero_si512(); RG];
                for (g, av) in ag.iter().enumerate() {
                    for k in 0..RG {
                        let q = w.q.as_ptr().add((r0 + k) * 256 + 32 * s + 4 * g) as *const i32;
                        t[k] =
                            _mm512_dpbusd_epi32(t[k], _mm512_set1_epi32(q.read_unaligned()), *av);
                    }
                }
                for k in 0..RG {
                    isc[k] = _mm512_add_epi32(
                        isc[k],
                        _mm512_mullo_epi32(t[k], _mm512_set1_epi32(w.sc[(r0 + k) * 16 + s])),
                    );
                }
            }
            for k in 0..RG {
                let r = r0 + k;
                let mut im = _mm512_setzero_si512();
                for (p, s) in sp.iter().enumerate() {
                    im = _mm512_dpwssd_epi32(im, _mm512_set1_epi32(w.mn[r * 4 + p]), *s);
                }
                // d_y * d * isc - d_y * dmin * im, as the scalar reference.
                let a1 = _mm512_mul_ps(
                    _mm512_mul_ps(dy, _mm512_set1_ps(w.d[r])),
                    _mm512_cvtepi32_ps(isc[k]),
                );
                let a2 = _mm512_mul_ps(
                    _mm512_mul_ps(dy, _mm512_set1_ps(w.dmin[r])),
                    _mm512_cvtepi32_ps(im),
                );
                let prev = if first {
                    _mm512_setzero_ps()
                } else {
                    acc.add(r).read()
                };
                acc.add(r).write(_mm512_add_ps(prev, _mm512_sub_ps(a1, a2)));
            }
        }
    }

    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tile_q6(w: &WTile, a: &ActTile, acc: *mut __m512, first: bool) {
        let dy = _mm512_load_ps(a.d.as_ptr());
        for r0 in (0..R).step_by(RG) {
            let mut isc = [_mm512_setzero_si512(); RG];
            for j in 0..16 {
                let ag: [__m512i; 4] = std::array::from_fn(|g| {
                    _mm512_load_si512(a.a.as_ptr().add((4 * j + g) * C * 4) as *const _)
                });
                // 32 x the columns' sums of the sub-block: the quants are q - 32 used as 0..63.
                let off =
                    _mm512_slli_epi32(_mm512_load_si512(a.s16.as_ptr().add(j * C) as *const _), 5);
                let mut t = [_mm512_setzero_si512(); RG];
                for (g, av) in ag.iter().enumerate() {
                    for k in 0..RG {
                        let q = w.q.as_ptr().add((r0 + k) * 256 + 16 * j + 4 * g) as *const i32;
                        t[k] =
                            _mm512_dpbusd_epi32(t[k], _mm512_set1_epi32(q.read_unaligned()), *av);
                    }
                }
                for k in 0..RG {
                    isc[k] = _mm512_add_epi32(
                        isc[k],
                        _mm512_mullo_epi32(
                            _mm512_sub_epi32(t[k], off),
                            _mm512_set1_epi32(w.sc[(r0 + k) * 16 + j]),
                        ),
                    );
                }
            }
            for k in 0..RG {
                let r = r0 + k;
                // d_y * d * isc, as the scalar reference.
                let v = _mm512_mul_ps(
                    _mm512_mul_ps(dy, _mm512_set1_ps(w.d[r])),
                    _mm512_cvtepi32_ps(isc[k]),
                );
                let prev = if first {
                    _mm512_setzero_ps()
                } else {
                    acc.add(r).read()
                };
                acc.add(r).write(_mm512_add_ps(prev, v));
            }
        }
    }
}
