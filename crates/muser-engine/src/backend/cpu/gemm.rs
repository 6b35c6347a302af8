//! Multi-column dot kernels for prefill and decode groups (AVX-512 VNNI).
//!
//! K-quants: one weight row against C = 4 or 8 activation columns. A block is unpacked once
//! (nibbles, high bits, sub-block scales) and then multiplied into C Q8_K columns, so the
//! unpacking, which costs as much as the multiplies in a one-column dot, is paid once per C
//! columns. Served Q4_K, Q5_K and Q6_K weights (the bulk of Q4_K_M and Q5_K_M files) when a
//! matmul had 4 to 15 columns; `matmul.rs` now sends those to `tile4.rs` (3 to 15 columns) and
//! `tile.rs` (16 and more), which need the same CPU features, so these K-quant kernels are kept
//! as a tested second implementation of the order (`tests/gemm.rs`) and for comparison
//! (`tests/gemm_speed.rs`), no longer dispatched.
//!
//! Q8_0: register tiles of up to 8 rows x 16 columns from 4 to 11 columns (`q8_0_matmul`;
//! from 12, `tile_q8_0.rs`).
//!
//! Other types and leftover columns use muser-quant's one-column kernels. Per column the
//! arithmetic is the scalar reference's per-block order, which muser-quant's one-column kernels
//! keep (each block's lanes reduced exactly: K-quants four columns at a time, Q8_0 eight rows at
//! a time), so results are bit-identical and prefill logits equal decode logits.
//! Tested against the scalar reference and the one-column kernel (`tests/gemm.rs`).

use muser_quant::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, BlockQ8_0};

/// A C-column dot: out[c] = dot(w, y[c]).
pub type DotN<W, const C: usize> = fn(&[W], [&[BlockQ8K]; C]) -> [f32; C];

/// The C-column Q4_K kernel (C = 4 or 8) when this CPU runs it.
pub fn q4_k_cols<const C: usize>() -> Option<DotN<BlockQ4K, C>> {
    has_avx512_vnni().then_some(dot_q4_k_q8_k_cols::<C> as DotN<BlockQ4K, C>)
}
/// The C-column Q5_K kernel (Q4_K's over quants 0..31) when this CPU runs it.
pub fn q5_k_cols<const C: usize>() -> Option<DotN<BlockQ5K, C>> {
    has_avx512_vnni().then_some(dot_q5_k_q8_k_cols::<C> as DotN<BlockQ5K, C>)
}
/// out[t * rows + r] = dot(w[r], y[t]) for `rows` Q8_0 rows of `nb` blocks (`w` is `rows x nb`,
/// `y` is `n x nb` Q8_0 columns).
pub type Q8_0Matmul = fn(w: &[BlockQ8_0], rows: usize, y: &[BlockQ8_0], n: usize, out: &mut [f32]);

/// The register-tiled Q8_0 matmul when this CPU runs it. Tiles of 8 rows (the last one padded)
/// x 4, 2 or 1 columns: a row's flipped quants and scales serve a tile's columns and a column's
/// quants, sums and scales its rows. Per (row, column) the scalar reference's order (per block
/// the exact integer dot, then one f32 step, block by block), which every one-column Q8_0 dot
/// keeps, so the bits are the same.
pub fn q8_0_matmul() -> Option<Q8_0Matmul> {
    has_avx512_vnni().then_some(q8_0_matmul_checked as Q8_0Matmul)
}

fn q8_0_matmul_checked(w: &[BlockQ8_0], rows: usize, y: &[BlockQ8_0], n: usize, out: &mut [f32]) {
    let nb = w.len() / rows.max(1);
    assert!(
        w.len() == rows * nb && y.len() == n * nb && out.len() == n * rows,
        "q8_0_matmul: {rows} rows and {n} columns of {nb} blocks into {} outputs",
        out.len()
    );
    assert!(has_avx512_vnni(), "q8_0_matmul needs AVX-512 VNNI");
    // SAFETY: the CPU has the features; the shapes were checked above.
    unsafe { x86::q8_0_matmul(w, rows, y, n, out) }
}

/// The C-column Q6_K kernel when this CPU runs it.
pub fn q6_k_cols<const C: usize>() -> Option<DotN<BlockQ6K, C>> {
    has_avx512_vnni().then_some(dot_q6_k_q8_k_cols::<C> as DotN<BlockQ6K, C>)
}

pub(super) fn has_avx512_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
                && std::env::var("MUSER_ISA").map_or(true, |v| v == "avx512")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block (SPEC section 8), four bytes at a
/// time: scales 0..4 and mins 0..4 are the low 6 bits of bytes 0..4 and 4..8; scales 4..8 are
/// the low nibbles of bytes 8..12 with the top 2 bits of bytes 0..4 above them, mins 4..8 the
/// high nibbles with the top 2 bits of bytes 4..8. (Per-byte masks keep the u32 shifts from
/// mixing bytes.)
#[inline(always)]
pub(super) fn scales_mins_k4(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let sc_lo = a & 0x3f3f_3f3f;
    let m_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    let join = |lo: u32, hi: u32| (lo as u64 | (hi as u64) << 32).to_le_bytes();
    (join(sc_lo, sc_hi), join(m_lo, m_hi))
}

fn check_cols(what: &str, nb: usize, y: &[&[BlockQ8K]]) {
    for c in y {
        assert_eq!(
            c.len(),
            nb,
            "{what}: {nb} weight blocks, {} activation blocks",
            c.len()
        );
    }
    assert!(has_avx512_vnni(), "{what} needs AVX-512 VNNI");
}

fn dot_q4_k_q8_k_cols<const C: usize>(x: &[BlockQ4K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    check_cols("dot_q4_k_q8_k_cols", x.len(), &y);
    // SAFETY: the CPU has the features and every column has x.len() blocks (checked above).
    unsafe { x86::k4_cols(x, y) }
}

fn dot_q5_k_q8_k_cols<const C: usize>(x: &[BlockQ5K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    check_cols("dot_q5_k_q8_k_cols", x.len(), &y);
    // SAFETY: as above.
    unsafe { x86::k4_cols(x, y) }
}

fn dot_q6_k_q8_k_cols<const C: usize>(x: &[BlockQ6K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    check_cols("dot_q6_k_q8_k_cols", x.len(), &y);
    // SAFETY: as above.
    unsafe { x86::q6_k_cols(x, y) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::k4::{f16_to_f32, halves_i16, load32_twice, K4Block};
    use super::scales_mins_k4;
    use muser_quant::{BlockQ6K, BlockQ8K, BlockQ8_0};
    use std::arch::x86_64::*;

    /// Q4_K or Q5_K (`K4Block`: the quants 0..15 or 0..31 as bytes, the rest alike).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn k4_cols<B: K4Block, const C: usize>(x: &[B], y: [&[BlockQ8K]; C]) -> [f32; C] {
        let m4 = _mm512_set1_epi8(0x0f);
        // Low half keeps the low nibbles (sub-block 2g), high half shifts in the high ones (2g+1).
        let shift = halves_i16(0, 4);
        let mut acc = [0.0f32; C];
        for (i, bx) in x.iter().enumerate() {
            let (sc, mn) = scales_mins_k4(bx.scales());
            let d = bx.d().to_f32();
            let dmin = bx.dmin().to_f32();
            // Each min twice, as i16, to pair with the sixteen bsums.
            let mins = _mm256_set_epi16(
                mn[7] as i16,
                mn[7] as i16,
                mn[6] as i16,
                mn[6] as i16,
                mn[5] as i16,
                mn[5] as i16,
                mn[4] as i16,
                mn[4] as i16,
                mn[3] as i16,
                mn[3] as i16,
                mn[2] as i16,
                mn[2] as i16,
                mn[1] as i16,
                mn[1] as i16,
                mn[0] as i16,
                mn[0] as i16,
            );
            let mut sumi = [_mm512_setzero_si512(); C];
            for g in 0..4 {
                let q = bx.quants(g, m4, shift);
                let s = halves_i16(sc[2 * g] as i16, sc[2 * g + 1] as i16);
                for c in 0..C {
                    let a = _mm512_loadu_si512(y[c][i].qs.as_ptr().add(64 * g) as *const _);
                    let p = _mm512_maddubs_epi16(q, a);
                    sumi[c] = _mm512_dpwssd_epi32(sumi[c], p, s);
                }
            }
            // The one-column kernel's (and the scalar reference's) order: the block's integers
            // exactly, then one f32 expression per block, so prefill and decode logits agree to
            // the bit.
            // Four columns at a time through muser-quant's `k_values4` (the one-column kernel's
            // block values; C is 4 or 8).
            for c0 in (0..C).step_by(4) {
                let isc: [__m512i; 4] = std::array::from_fn(|k| sumi[c0 + k]);
                let im: [__m256i; 4] = std::array::from_fn(|k| {
                    let bsums = y[c0 + k][i].bsums.as_ptr() as *const __m256i;
                    _mm256_madd_epi16(mins, _mm256_loadu_si256(bsums))
                });
                let dd: [f32; 4] = std::array::from_fn(|k| y[c0 + k][i].d * d);
                let dm: [f32; 4] = std::array::from_fn(|k| y[c0 + k][i].d * dmin);
                let vs = muser_quant::simd::k_values4(&isc, &im, &dd, &dm);
                for k in 0..4 {
                    acc[c0 + k] += vs[k];
                }
            }
        }
        acc
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn q6_k_cols<const C: usize>(x: &[BlockQ6K], y: [&[BlockQ8K]; C]) -> [f32; C] {
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        // Bits of value l (< 32) of a half: qh[l] bits 0-1 (l), 2-3 (l+32), 4-5 (l+64), 6-7
        // (l+96); these shifts move them to bits 4-5 (16-bit shifts; neighbour bits that cross
        // a byte land outside 0x30).
        let shl_lo = halves_i16(4, 2);
        let shr_hi = halves_i16(0, 2);
        let index =
            muser_quant::simd::Q6_K_SCALE_INDEX.map(|a| _mm512_loadu_si512(a.as_ptr() as *const _));
        let mut acc = [0.0f32; C];
        for (i, bx) in x.iter().enumerate() {
            let d = bx.d.to_f32();
            let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr() as *const __m128i));
            let s512 = _mm512_zextsi256_si512(s16);
            let mut sumi = [_mm512_setzero_si512(); C];
            for h in 0..2 {
                // ql[64h..64h+64]: low nibbles are values 0..64 of the half, high nibbles 64..128.
                let a = _mm512_loadu_si512(bx.ql.as_ptr().add(64 * h) as *const _);
                let hb = load32_twice(bx.qh.as_ptr().add(32 * h));
                let q_lo = _mm512_or_si512(
                    _mm512_and_si512(a, m4),
                    _mm512_and_si512(_mm512_sllv_epi16(hb, shl_lo), m30),
                );
                let q_hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(a, 4), m4),
                    _mm512_and_si512(_mm512_srlv_epi16(hb, shr_hi), m30),
                );
                let s_lo = _mm512_permutexvar_epi16(index[2 * h], s512);
                let s_hi = _mm512_permutexvar_epi16(index[2 * h + 1], s512);
                for c in 0..C {
                    let base = y[c][i].qs.as_ptr().add(128 * h);
                    let p_lo = _mm512_maddubs_epi16(q_lo, _mm512_loadu_si512(base as *const _));
                    let p_hi =
                        _mm512_maddubs_epi16(q_hi, _mm512_loadu_si512(base.add(64) as *const _));
                    sumi[c] = _mm512_dpwssd_epi32(sumi[c], p_lo, s_lo);
                    sumi[c] = _mm512_dpwssd_epi32(sumi[c], p_hi, s_hi);
                }
            }
            for c0 in (0..C).step_by(4) {
                let lanes: [__m256i; 4] = std::array::from_fn(|k| {
                    let by = &y[c0 + k][i];
                    // The quants were used unsigned (0..63): subtract 32 * sc_j * bsums_j.
                    let bias = _mm256_madd_epi16(
                        s16,
                        _mm256_loadu_si256(by.bsums.as_ptr() as *const __m256i),
                    );
                    let s = sumi[c0 + k];
                    let s = _mm256_add_epi32(
                        _mm512_castsi512_si256(s),
                        _mm512_extracti64x4_epi64(s, 1),
                    );
                    _mm256_sub_epi32(s, _mm256_slli_epi32(bias, 5))
                });
                // As the one-column kernel: the block's integer exactly, then `d_y * d * isc`.
                let dd: [f32; 4] = std::array::from_fn(|k| y[c0 + k][i].d * d);
                let fi = _mm_cvtepi32_ps(muser_quant::simd::reduce4_256(&lanes));
                let mut vs = [0f32; 4];
                _mm_storeu_ps(vs.as_mut_ptr(), _mm_mul_ps(_mm_loadu_ps(dd.as_ptr()), fi));
                for k in 0..4 {
                    acc[c0 + k] += vs[k];
                }
            }
        }
        acc
    }

    /// Blocks a and b's 32 quants in the low and high 256 bits.
    #[inline(always)]
    unsafe fn join_q8_0(a: &BlockQ8_0, b: &BlockQ8_0) -> __m512i {
        _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(a.qs.as_ptr() as *const __m256i)),
            _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i),
            1,
        )
    }

    /// `vpermt2q` indices of the last level of `reduce8x2`: 128-bit lanes (c0.0, c1.0, c0.2,
    /// c1.2) and (c0.1, c1.1, c0.3, c1.3).
    const REDUCE_LAST: [[i64; 8]; 2] = [[0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]];

    /// The exact integer dots of 8 (row, column) pairs for two blocks: `v[p]` holds pair p's
    /// i32 lanes, block i in the low 256 bits and block i + 1 in the high; the result is
    /// [pairs 0..8 of block i, pairs 0..8 of block i + 1]. A transpose-and-add tree (integer
    /// adds, exact in any order): after the 32-bit and 64-bit interleaves, 128-bit lane l of
    /// c[j] holds the lane sums of lane l of pairs 4j .. 4j + 4; a block is lanes (0, 1) or
    /// (2, 3).
    #[inline(always)]
    unsafe fn reduce8x2(v: &[__m512i; 8], last: &[__m512i; 2]) -> __m512i {
        let a: [__m512i; 4] = std::array::from_fn(|k| {
            _mm512_add_epi32(
                _mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]),
            )
        });
        let c: [__m512i; 2] = std::array::from_fn(|j| {
            _mm512_add_epi32(
                _mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]),
            )
        });
        _mm512_add_epi32(
            _mm512_permutex2var_epi64(c[0], last[0], c[1]),
            _mm512_permutex2var_epi64(c[0], last[1], c[1]),
        )
    }

    /// Per (row, column) the scalar reference's order (`muser_quant::dot::q8_0_blocks_add`,
    /// which every one-column Q8_0 dot follows): per block the exact integer dot, then
    /// `sum += float(dot) * (d_x * d_y)` in f32 (two products and a sum, no fma), blocks in
    /// order. 8 rows x C columns; two blocks per step: the rows' quants plus 128 (x xor 0x80)
    /// serve every column, a column's `-128 sum(y)` (per 4-value lane) starts each of its
    /// `vpdpbusd`; the 8 rows' integers of a column go through `reduce8x2` into one vector,
    /// times the 8 rows' d_x by the column's d_y, and are added to the column's 8 sums (one
    /// 8-lane vector: a lane is a (row, column) pair) block i, then block i + 1. An odd last
    /// block takes the low halves only. out[c][r].
    // Not inlined into the driver (one function per tile shape).
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c")]
    pub unsafe fn q8_0_tile<const C: usize>(
        x: [&[BlockQ8_0]; 8],
        y: [&[BlockQ8_0]; C],
    ) -> [[f32; 8]; C] {
        let (flip, ones, zero) = (
            _mm512_set1_epi8(-128),
            _mm512_set1_epi8(1),
            _mm512_setzero_si512(),
        );
        let last = REDUCE_LAST.map(|a| _mm512_loadu_si512(a.as_ptr() as *const _));
        let nb = y[0].len();
        let mut acc = [_mm256_setzero_ps(); C];
        for i in (0..nb).step_by(2) {
            // The second block of an odd tail is the first again; its values are not added.
            let j = (i + 1).min(nb - 1);
            let xq: [__m512i; 8] =
                std::array::from_fn(|r| _mm512_xor_si512(join_q8_0(&x[r][i], &x[r][j]), flip));
            let dx = _mm512_cvtph_ps(_mm256_setr_epi16(
                x[0][i].d.to_bits() as i16,
                x[1][i].d.to_bits() as i16,
                x[2][i].d.to_bits() as i16,
                x[3][i].d.to_bits() as i16,
                x[4][i].d.to_bits() as i16,
                x[5][i].d.to_bits() as i16,
                x[6][i].d.to_bits() as i16,
                x[7][i].d.to_bits() as i16,
                x[0][j].d.to_bits() as i16,
                x[1][j].d.to_bits() as i16,
                x[2][j].d.to_bits() as i16,
                x[3][j].d.to_bits() as i16,
                x[4][j].d.to_bits() as i16,
                x[5][j].d.to_bits() as i16,
                x[6][j].d.to_bits() as i16,
                x[7][j].d.to_bits() as i16,
            ));
            for c in 0..C {
                let yq = join_q8_0(&y[c][i], &y[c][j]);
                let corr = _mm512_sub_epi32(
                    zero,
                    _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, ones, yq), 7),
                );
                let dots: [__m512i; 8] =
                    std::array::from_fn(|r| _mm512_dpbusd_epi32(corr, xq[r], yq));
                let dy = _mm512_insertf32x8(
                    _mm512_castps256_ps512(_mm256_set1_ps(f16_to_f32(y[c][i].d))),
                    _mm256_set1_ps(f16_to_f32(y[c][j].d)),
                    1,
                );
                let v = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(reduce8x2(&dots, &last)),
                    _mm512_mul_ps(dx, dy),
                );
                acc[c] = _mm256_add_ps(acc[c], _mm512_castps512_ps256(v));
                if j > i {
                    acc[c] = _mm256_add_ps(acc[c], _mm512_extractf32x8_ps::<1>(v));
                }
            }
        }
        acc.map(|a| {
            let mut o = [0f32; 8];
            _mm256_storeu_ps(o.as_mut_ptr(), a);
            o
        })
    }

    /// See [`super::q8_0_matmul`].
    ///
    /// # Safety
    /// The CPU must have AVX-512 VNNI; `w` holds `rows x nb` blocks, `y` `n x nb` and `out`
    /// `n x rows` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,f16c")]
    pub unsafe fn q8_0_matmul(
        w: &[BlockQ8_0],
        rows: usize,
        y: &[BlockQ8_0],
        n: usize,
        out: &mut [f32],
    ) {
        let nb = w.len() / rows.max(1);
        // Rows r0 .. r0 + 8 (past the last row: the last row again, not written) against
        // columns t0 .. t0 + C.
        macro_rules! tile {
            ($c:literal, $r0:expr, $t0:expr) => {{
                let (r0, t0): (usize, usize) = ($r0, $t0);
                let v = q8_0_tile::<$c>(
                    std::array::from_fn(|i| {
                        let r = (r0 + i).min(rows - 1);
                        &w[r * nb..(r + 1) * nb]
                    }),
                    std::array::from_fn(|j| &y[(t0 + j) * nb..(t0 + j + 1) * nb]),
                );
                for (j, vc) in v.iter().enumerate() {
                    for (i, &x) in vc.iter().take(rows - r0).enumerate() {
                        out[(t0 + j) * rows + r0 + i] = x;
                    }
                }
            }};
        }
        if nb == 0 {
            return out.fill(0.0);
        }
        for r0 in (0..rows).step_by(8) {
            let mut t0 = 0;
            while t0 < n {
                t0 += match n - t0 {
                    4.. => {
                        tile!(4, r0, t0);
                        4
                    }
                    2.. => {
                        tile!(2, r0, t0);
                        2
                    }
                    _ => {
                        tile!(1, r0, t0);
                        1
                    }
                };
            }
        }
    }
}
