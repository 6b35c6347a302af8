//! Matmul of 3 to 15 activation columns (decode groups of a few streams, AVX-512 VNNI): Q4_K /
//! Q5_K / Q6_K weights x Q8_K activations with 4 rows x 4 columns across the zmm lanes.
//!
//! Order. As `tile.rs` (per (row, column) and block the exact integers, then `d_y * d * isc -
//! d_y * dmin * im` in f32 added block by block): each lane holds one (row, column) pair and
//! does per lane exactly what a lane of `tile.rs` does, so the bits are those of the scalar
//! reference and of the one-column dots (`tests/gemm.rs`).
//!
//! Lanes. Lane 4L + p of a zmm is column L (of a group of 4) and row p (of a group of 4). A
//! `vpdpbusd` takes the 4 rows' quants of one 4-value group as 16 bytes broadcast to the four
//! 128-bit lanes, and the 4 columns' values of that group each repeated over its 128-bit lane
//! (laid out once per matmul in a [`Panel4`]): 64 products per instruction, the same as the
//! 16-column tiles, where the column kernels of `gemm.rs` (`vpmaddubsw` + `vpdpwssd` per
//! column, then one reduction per block and column) did a fraction of that.
//!
//! Weights. Per block, a group of 4 rows is unpacked to [`W4`]: per 64 values, the four rows'
//! bytes transposed by dwords (so each 4-value group of the 4 rows is 16 contiguous bytes),
//! and the scales, mins (in pairs) and `d`, `dmin` transposed alike. A pass takes 8 row groups
//! (32 rows) block by block, each block unpacked once and used by every column group. Those 32
//! rows are 32 streams through memory, more than the hardware prefetcher follows, so the pass
//! prefetches each row's block two ahead (decode reads the weights from DRAM: 4 streams went
//! from 95-108 to 136 tokens/s with it).

use super::gemm::scales_mins_k4;
use super::k4::{f16_to_f32, halves_i16, load32_twice, K4Block};
use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// Columns of a group.
pub const C4: usize = 4;
/// Row groups (of 4 rows) per pass.
const NRG: usize = 8;
/// Column groups at most (the tiles of `tile.rs` take 16 columns and more).
const MAX_CG: usize = 4;
/// Blocks ahead of the unpack that `gemm_into` prefetches.
const PF: usize = 2;

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    super::tile::available()
}

/// One group of 4 columns, one block (lane 4L + p: column L; see the module doc).
#[derive(Clone)]
#[repr(C, align(64))]
struct ActTile4 {
    /// a[g][L][p][4]: values 4g .. 4g + 3 of column L, four times.
    a: [i8; 64 * 64],
    /// Per pair q of 32-value sub-blocks: column L's sums of sub-blocks 2q (low i16) and 2q + 1.
    s32: [i32; 4 * 16],
    /// Per 16-value sub-block j: column L's sum.
    s16: [i32; 16 * 16],
    d: [f32; 16],
}

/// The activation columns of a matmul laid out for these kernels (columns padded to a
/// multiple of 4 with zeros).
pub struct Panel4 {
    tiles: Vec<ActTile4>,
    n: usize,
    nb: usize,
}

impl Panel4 {
    /// `y`: `n` (at most 16) columns of `nb` Q8_K blocks each.
    pub fn new(y: &[BlockQ8K], n: usize, nb: usize) -> Panel4 {
        assert_eq!(y.len(), n * nb, "Panel4: {n} columns of {nb} blocks");
        assert!(n <= C4 * MAX_CG, "Panel4: {n} columns");
        let zero = ActTile4 {
            a: [0; 64 * 64],
            s32: [0; 4 * 16],
            s16: [0; 16 * 16],
            d: [0.0; 16],
        };
        let mut tiles = vec![zero; n.div_ceil(C4) * nb];
        for (t, by) in y.iter().enumerate() {
            let (col, b) = (t / nb, t % nb);
            let tile = &mut tiles[(col / C4) * nb + b];
            let l = col % C4;
            for g in 0..64 {
                for p in 0..4 {
                    let at = 64 * g + 16 * l + 4 * p;
                    tile.a[at..at + 4].copy_from_slice(&by.qs[4 * g..4 * g + 4]);
                }
            }
            for p in 0..4 {
                for q in 0..4 {
                    let lo = by.bsums[4 * q] as i32 + by.bsums[4 * q + 1] as i32;
                    let hi = by.bsums[4 * q + 2] as i32 + by.bsums[4 * q + 3] as i32;
                    tile.s32[16 * q + 4 * l + p] = (lo & 0xffff) | (hi << 16);
                }
                for j in 0..16 {
                    tile.s16[16 * j + 4 * l + p] = by.bsums[j] as i32;
                }
                tile.d[4 * l + p] = by.d;
            }
        }
        Panel4 { tiles, n, nb }
    }

    pub fn n(&self) -> usize {
        self.n
    }
}

/// Four rows, one block, unpacked (see the module doc). Dword e (0..16) of a 64-value group k
/// of row p sits at byte 256k + 64(e % 4) + 16(e / 4) + 4p of `q`; `meta` holds one such
/// group of 16 dwords per row: Q4_K/Q5_K the 8 scales (e = s), the 4 min pairs (e = 8 + q), d
/// (e = 12) and dmin (e = 13) as f32 bits; Q6_K the 16 scales.
#[derive(Clone)]
#[repr(C, align(64))]
struct W4 {
    q: [u8; 1024],
    meta: [u8; 256],
    /// Q6_K: the rows' d.
    d6: [f32; 4],
}

const ZERO_W4: W4 = W4 {
    q: [0; 1024],
    meta: [0; 256],
    d6: [0.0; 4],
};

/// The dword 4 x 4 transpose inside each 128-bit lane: lane λ of out[i] = dword 4λ + i of
/// x[0], x[1], x[2], x[3].
#[inline(always)]
unsafe fn transpose4(x: [__m512i; 4]) -> [__m512i; 4] {
    let a = _mm512_unpacklo_epi32(x[0], x[1]);
    let b = _mm512_unpackhi_epi32(x[0], x[1]);
    let c = _mm512_unpacklo_epi32(x[2], x[3]);
    let d = _mm512_unpackhi_epi32(x[2], x[3]);
    [
        _mm512_unpacklo_epi64(a, c),
        _mm512_unpackhi_epi64(a, c),
        _mm512_unpacklo_epi64(b, d),
        _mm512_unpackhi_epi64(b, d),
    ]
}

/// Stores x transposed (`transpose4`) at p: out[i] at p + 64i.
#[inline(always)]
unsafe fn store_t(p: *mut u8, x: [__m512i; 4]) {
    for (i, v) in transpose4(x).iter().enumerate() {
        _mm512_store_si512(p.add(64 * i) as *mut _, *v);
    }
}

/// How a block of each format unpacks into a [`W4`].
trait Tile4Block: Copy {
    const Q6: bool;
    /// Values 64k .. 64k + 64 of the block as bytes, in order.
    ///
    /// # Safety
    /// AVX-512 F/BW.
    unsafe fn group(&self, k: usize) -> __m512i;
    /// The row's `meta` dwords (see [`W4`]) and its d (Q6_K).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL, F16C.
    unsafe fn meta(&self) -> (__m512i, f32);
}

/// Q4_K/Q5_K meta: 8 scales, 4 min pairs, d, dmin.
#[inline(always)]
unsafe fn k4_meta<B: K4Block>(b: &B) -> (__m512i, f32) {
    let (sc, mn) = scales_mins_k4(b.scales());
    let v = _mm_set_epi64x(i64::from_le_bytes(mn), i64::from_le_bytes(sc));
    let sc32 = _mm256_cvtepu8_epi32(v);
    let mn16 = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(v));
    let dd = _mm_set_epi32(
        0,
        0,
        f16_to_f32(b.dmin()).to_bits() as i32,
        f16_to_f32(b.d()).to_bits() as i32,
    );
    let hi = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(mn16), dd);
    (
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(sc32), hi),
        0.0,
    )
}

/// Q4_K and Q5_K share their unpacking (`quants`) and metadata (`k4_meta`).
macro_rules! tile4_q45 {
    ($($t:ty),*) => {$(
        impl Tile4Block for $t {
            const Q6: bool = false;
            #[inline(always)]
            unsafe fn group(&self, k: usize) -> __m512i {
                self.quants(k, _mm512_set1_epi8(0x0f), halves_i16(0, 4))
            }
            #[inline(always)]
            unsafe fn meta(&self) -> (__m512i, f32) {
                k4_meta(self)
            }
        }
    )*};
}
tile4_q45!(BlockQ4K, BlockQ5K);

impl Tile4Block for BlockQ6K {
    const Q6: bool = true;
    /// Half h = k / 2 of 128 values: the 64 `ql` bytes hold values 0..64 in their low nibbles
    /// and 64..128 in their high ones; bit pairs 0-1, 2-3, 4-5, 6-7 of `qh[l]` are the top bits
    /// of values l, l + 32, l + 64, l + 96, moved to bits 4-5 by per-half shifts.
    #[inline(always)]
    unsafe fn group(&self, k: usize) -> __m512i {
        let h = k / 2;
        let a = _mm512_loadu_si512(self.ql.as_ptr().add(64 * h) as *const _);
        let qh = load32_twice(self.qh.as_ptr().add(32 * h));
        let (m4, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
        if k.is_multiple_of(2) {
            _mm512_or_si512(
                _mm512_and_si512(a, m4),
                _mm512_and_si512(_mm512_sllv_epi16(qh, halves_i16(4, 2)), m30),
            )
        } else {
            _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(a), m4),
                _mm512_and_si512(_mm512_srlv_epi16(qh, halves_i16(0, 2)), m30),
            )
        }
    }
    #[inline(always)]
    unsafe fn meta(&self) -> (__m512i, f32) {
        let s = _mm_loadu_si128(self.scales.as_ptr() as *const __m128i);
        (_mm512_cvtepi8_epi32(s), f16_to_f32(self.d))
    }
}

/// Unpacks rows r0 .. r0 + 4 (those below `rows`; the others as zeros) of block b.
#[inline(always)]
unsafe fn unpack<B: Tile4Block>(w: &[B], nb: usize, rows: usize, r0: usize, b: usize, t: &mut W4) {
    let mut x = [_mm512_setzero_si512(); 4];
    for k in 0..4 {
        for (p, xp) in x.iter_mut().enumerate() {
            if r0 + p < rows {
                *xp = w[(r0 + p) * nb + b].group(k);
            }
        }
        store_t(t.q.as_mut_ptr().add(256 * k), x);
    }
    let mut m = [_mm512_setzero_si512(); 4];
    for (p, mp) in m.iter_mut().enumerate() {
        if r0 + p < rows {
            let (v, d) = w[(r0 + p) * nb + b].meta();
            *mp = v;
            t.d6[p] = d;
        } else {
            t.d6[p] = 0.0;
        }
    }
    store_t(t.meta.as_mut_ptr(), m);
}

/// Broadcast of 16 bytes at p to the four 128-bit lanes.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    _mm512_broadcast_i32x4(_mm_loadu_si128(p as *const __m128i))
}

/// acc[k] += the block's values of row group k over a column group (Q4_K/Q5_K).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_k4(w: &[W4; NRG], a: &ActTile4, acc: &mut [__m512; NRG]) {
    let mut isc = [_mm512_setzero_si512(); NRG];
    for s in 0..8 {
        let ag: [__m512i; 8] = std::array::from_fn(|g| {
            _mm512_load_si512(a.a.as_ptr().add(64 * (8 * s + g)) as *const _)
        });
        let mut t = [_mm512_setzero_si512(); NRG];
        for (g, av) in ag.iter().enumerate() {
            let off = 256 * (s / 2) + 64 * (g % 4) + 16 * (2 * (s % 2) + g / 4);
            for k in 0..NRG {
                t[k] = _mm512_dpbusd_epi32(t[k], bcast(w[k].q.as_ptr().add(off)), *av);
            }
        }
        let so = 64 * (s % 4) + 16 * (s / 4);
        for k in 0..NRG {
            isc[k] = _mm512_add_epi32(
                isc[k],
                _mm512_mullo_epi32(t[k], bcast(w[k].meta.as_ptr().add(so))),
            );
        }
    }
    let sp: [__m512i; 4] =
        std::array::from_fn(|q| _mm512_load_si512(a.s32.as_ptr().add(16 * q) as *const _));
    let dy = _mm512_load_ps(a.d.as_ptr());
    for k in 0..NRG {
        let m = w[k].meta.as_ptr();
        let mut im = _mm512_setzero_si512();
        for (q, s) in sp.iter().enumerate() {
            im = _mm512_dpwssd_epi32(im, bcast(m.add(64 * q + 32)), *s);
        }
        // d_y * d * isc - d_y * dmin * im, as the scalar reference.
        let a1 = _mm512_mul_ps(
            _mm512_mul_ps(dy, _mm512_castsi512_ps(bcast(m.add(48)))),
            _mm512_cvtepi32_ps(isc[k]),
        );
        let a2 = _mm512_mul_ps(
            _mm512_mul_ps(dy, _mm512_castsi512_ps(bcast(m.add(112)))),
            _mm512_cvtepi32_ps(im),
        );
        acc[k] = _mm512_add_ps(acc[k], _mm512_sub_ps(a1, a2));
    }
}

/// As `block_k4` for Q6_K.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_q6(w: &[W4; NRG], a: &ActTile4, acc: &mut [__m512; NRG]) {
    let mut isc = [_mm512_setzero_si512(); NRG];
    for j in 0..16 {
        let ag: [__m512i; 4] = std::array::from_fn(|g| {
            _mm512_load_si512(a.a.as_ptr().add(64 * (4 * j + g)) as *const _)
        });
        // 32 x the columns' sums of the sub-block: the quants are q - 32 used as 0..63.
        let off = _mm512_slli_epi32::<5>(_mm512_load_si512(a.s16.as_ptr().add(16 * j) as *const _));
        let mut t = [_mm512_setzero_si512(); NRG];
        for (g, av) in ag.iter().enumerate() {
            let o = 256 * (j / 4) + 64 * g + 16 * (j % 4);
            for k in 0..NRG {
                t[k] = _mm512_dpbusd_epi32(t[k], bcast(w[k].q.as_ptr().add(o)), *av);
            }
        }
        let so = 64 * (j % 4) + 16 * (j / 4);
        for k in 0..NRG {
            isc[k] = _mm512_add_epi32(
                isc[k],
                _mm512_mullo_epi32(
                    _mm512_sub_epi32(t[k], off),
                    bcast(w[k].meta.as_ptr().add(so)),
                ),
            );
        }
    }
    let dy = _mm512_load_ps(a.d.as_ptr());
    for k in 0..NRG {
        // d_y * d * isc, as the scalar reference.
        let d = _mm512_castsi512_ps(bcast(w[k].d6.as_ptr() as *const u8));
        let v = _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isc[k]));
        acc[k] = _mm512_add_ps(acc[k], v);
    }
}

thread_local! {
    static W_BUF: std::cell::RefCell<Vec<W4>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// out[t * ld + r] for the rows of `w` (see `gemm_q4_k`).
///
/// # Safety
/// `out` valid for writes at t * ld + r for t < p.n, r < rows, unaliased meanwhile; the CPU
/// has the features of `available()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm_into<B: Tile4Block>(w: &[B], rows: usize, p: &Panel4, out: *mut f32, ld: usize) {
    let nb = p.nb;
    let cgs = p.n.div_ceil(C4);
    let groups = rows.div_ceil(4);
    W_BUF.with(|buf| {
        let mut wt = buf.borrow_mut();
        wt.resize(NRG, ZERO_W4);
        let wt: &mut [W4; NRG] = (&mut wt[..NRG]).try_into().expect("NRG tiles");
        for g0 in (0..groups).step_by(NRG) {
            let ng = (groups - g0).min(NRG);
            let mut acc = [[_mm512_setzero_ps(); NRG]; MAX_CG];
            let pass_rows = (rows - 4 * g0).min(4 * NRG);
            for b in 0..nb {
                // The pass's rows are 32 streams through memory, too many for the hardware
                // prefetcher: each row's block PF blocks ahead is fetched here.
                if b + PF < nb {
                    for r in 4 * g0..4 * g0 + pass_rows {
                        let at = (&w[r * nb + b + PF]) as *const B as *const i8;
                        for l in (0..std::mem::size_of::<B>()).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>(at.add(l));
                        }
                    }
                }
                for (k, t) in wt.iter_mut().enumerate().take(ng) {
                    unpack(w, nb, rows, 4 * (g0 + k), b, t);
                }
                for (cg, acc) in acc.iter_mut().enumerate().take(cgs) {
                    let a = &p.tiles[cg * nb + b];
                    if B::Q6 {
                        block_q6(wt, a, acc);
                    } else {
                        block_k4(wt, a, acc);
                    }
                }
            }
            for (cg, acc) in acc.iter().enumerate().take(cgs) {
                for (k, v) in acc.iter().enumerate().take(ng) {
                    let r0 = 4 * (g0 + k);
                    let mask: __mmask8 = (1u8 << (rows - r0).min(4)) - 1;
                    let lanes = [
                        _mm512_castps512_ps128(*v),
                        _mm512_extractf32x4_ps::<1>(*v),
                        _mm512_extractf32x4_ps::<2>(*v),
                        _mm512_extractf32x4_ps::<3>(*v),
                    ];
                    for (l, x) in lanes.iter().enumerate() {
                        let col = C4 * cg + l;
                        if col < p.n {
                            _mm_mask_storeu_ps(out.add(col * ld + r0), mask, *x);
                        }
                    }
                }
            }
        }
    });
}

/// out[t * rows + r] for every column of the panel (`what` names the caller in errors).
fn gemm_checked<B: Tile4Block>(what: &str, w: &[B], rows: usize, p: &Panel4, out: &mut [f32]) {
    assert_eq!(out.len(), rows * p.n, "{what}: output of {} x {rows}", p.n);
    check_shapes(what, w, rows, p, rows);
    // SAFETY: the shapes were checked; out holds n x rows values.
    unsafe { gemm_into(w, rows, p, out.as_mut_ptr(), rows) }
}

tile_entry_points!(Panel4, "tile4::");

/// out[t * rows + r] = dot(W[r], y[t]) (`y` is `n x nb`, n at most 16), panel built inside.
pub type GemmFn<W> = fn(w: &[W], rows: usize, y: &[BlockQ8K], n: usize, out: &mut [f32]);

/// The Q4_K kernel (panel built inside) when this CPU runs it.
pub fn q4_k_gemm() -> Option<GemmFn<BlockQ4K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel4::new(y, n, w.len() / rows.max(1));
        gemm_q4_k(w, rows, &p, out)
    })
}

/// The Q5_K kernel (panel built inside) when this CPU runs it.
pub fn q5_k_gemm() -> Option<GemmFn<BlockQ5K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel4::new(y, n, w.len() / rows.max(1));
        gemm_q5_k(w, rows, &p, out)
    })
}

/// The Q6_K kernel (panel built inside) when this CPU runs it.
pub fn q6_k_gemm() -> Option<GemmFn<BlockQ6K>> {
    available().then_some(|w, rows, y, n, out| {
        let p = Panel4::new(y, n, w.len() / rows.max(1));
        gemm_q6_k(w, rows, &p, out)
    })
}
