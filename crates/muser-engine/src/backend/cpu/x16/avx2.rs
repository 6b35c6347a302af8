//! The AVX2 kernels of `x16` (8 rows per ymm): lane r is row r of the group. Without VNNI a
//! 4-value group's products go through `vpmaddubsw` (pairs summed in i16) and `vpmaddwd` by ones
//! (pairs of pairs in i32). The i16 sums never saturate: a pair is at most 2 x 63 x 128 = 16,128
//! (Q6_K), and Q4_K sums 8 groups (30,720 at most), Q5_K 4 (31,744) and Q6_K 1 in i16 before
//! widening.

use super::{Lay, Sums};
use muser_gguf::GgmlType;
use muser_quant::BlockQ8K;
use std::arch::x86_64::*;

const L: Lay = Lay { r: 8 };

/// Whether this CPU runs these kernels (AVX2, FMA, F16C).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// One group's 8 rows of format `ty` against `c` (1 or 2) columns (`y`: c x nb blocks).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds the group's nb blocks.
pub(super) unsafe fn group(
    ty: GgmlType,
    c: usize,
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    sums: &mut Sums,
) {
    match (ty, c) {
        (GgmlType::Q4_K, 1) => group_k4::<1, false>(w, y, nb, sums),
        (GgmlType::Q4_K, _) => group_k4::<2, false>(w, y, nb, sums),
        (GgmlType::Q5_K, 1) => group_k4::<1, true>(w, y, nb, sums),
        (GgmlType::Q5_K, _) => group_k4::<2, true>(w, y, nb, sums),
        (_, 1) => group_q6::<1>(w, y, nb, sums),
        (_, _) => group_q6::<2>(w, y, nb, sums),
    }
}

#[inline(always)]
unsafe fn dword(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

#[inline(always)]
unsafe fn line(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const _)
}

/// Each byte's bit k moved to bit 4, the others cleared.
#[inline(always)]
unsafe fn bit_to_4(x: __m256i, k: usize) -> __m256i {
    let s = if k <= 4 {
        _mm256_sll_epi16(x, _mm_cvtsi32_si128(4 - k as i32))
    } else {
        _mm256_srl_epi16(x, _mm_cvtsi32_si128(k as i32 - 4))
    };
    _mm256_and_si256(s, _mm256_set1_epi8(0x10))
}

/// (a & 0x0F) | b per byte (b has no bit of 0x0F set).
#[inline(always)]
unsafe fn low_or(a: __m256i, b: __m256i, m4: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_and_si256(a, m4), b)
}

/// 8 rows' 4 products with the column's 4 bytes at `y`, as 16 i16 (pairs).
#[inline(always)]
unsafe fn dot4(w: __m256i, y: *const i8) -> __m256i {
    _mm256_maddubs_epi16(w, dword(y))
}

/// One group's 8 rows of Q4_K (FIVE = false) or Q5_K against C columns over all nb blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_k4<const C: usize, const FIVE: bool>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    sums: &mut Sums,
) {
    let (bs, qs0) = if FIVE {
        (180 * L.r, L.qs(true))
    } else {
        (148 * L.r, L.qs(false))
    };
    // Groups summed in i16 before widening (see the module doc).
    let span = if FIVE { 4 } else { 8 };
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * bs);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm256_setzero_si256(); C];
        for ch in 0..4 {
            let mut lo = [_mm256_setzero_si256(); C];
            let mut hi = [_mm256_setzero_si256(); C];
            let mut lo16 = [_mm256_setzero_si256(); C];
            let mut hi16 = [_mm256_setzero_si256(); C];
            for q in 0..8 {
                let v = line(p.add(qs0 + 32 * (8 * ch + q)));
                let vh = _mm256_srli_epi16::<4>(v);
                let (vl, vh) = if FIVE {
                    let h = line(p.add(L.qh5() + 32 * q));
                    (
                        low_or(v, bit_to_4(h, 2 * ch), m4),
                        low_or(vh, bit_to_4(h, 2 * ch + 1), m4),
                    )
                } else {
                    (_mm256_and_si256(v, m4), _mm256_and_si256(vh, m4))
                };
                for t in 0..C {
                    let qs = yb[t].qs.as_ptr();
                    lo16[t] = _mm256_add_epi16(lo16[t], dot4(vl, qs.add(64 * ch + 4 * q)));
                    hi16[t] = _mm256_add_epi16(hi16[t], dot4(vh, qs.add(64 * ch + 32 + 4 * q)));
                }
                if (q + 1) % span == 0 {
                    for t in 0..C {
                        lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(lo16[t], ones));
                        hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(hi16[t], ones));
                        lo16[t] = _mm256_setzero_si256();
                        hi16[t] = _mm256_setzero_si256();
                    }
                }
            }
            let sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(L.sc() + 16 * ch) as *const _));
            let sh = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(L.sc() + 16 * ch + 8) as *const _));
            for t in 0..C {
                isc[t] = _mm256_add_epi32(
                    isc[t],
                    _mm256_add_epi32(_mm256_mullo_epi32(lo[t], sl), _mm256_mullo_epi32(hi[t], sh)),
                );
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const _));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(L.dmin()) as *const _));
        let mp: [__m256i; 4] = std::array::from_fn(|k| {
            _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(L.mn() + 16 * k) as *const _))
        });
        for t in 0..C {
            let bsum = &yb[t].bsums;
            let mut im = _mm256_setzero_si256();
            for (k, m) in mp.iter().enumerate() {
                let s0 = bsum[4 * k] as i32 + bsum[4 * k + 1] as i32;
                let s1 = bsum[4 * k + 2] as i32 + bsum[4 * k + 3] as i32;
                let pair = _mm256_set1_epi32((s0 & 0xffff) | (s1 << 16));
                im = _mm256_add_epi32(im, _mm256_madd_epi16(*m, pair));
            }
            // d_y * d * isc - d_y * dmin * im, as the scalar reference.
            let dy = _mm256_set1_ps(yb[t].d);
            let a1 = _mm256_mul_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(isc[t]));
            let a2 = _mm256_mul_ps(_mm256_mul_ps(dy, dmin), _mm256_cvtepi32_ps(im));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(a1, a2));
        }
    }
    for t in 0..C {
        _mm256_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}

/// As `group_k4` for Q6_K (the value groups as in the AVX-512 kernel).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_q6<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, sums: &mut Sums) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 212 * L.r);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm256_setzero_si256(); C];
        // Scale pairs as i16 (sc_2k low, sc_2k+1 high in each dword).
        let sp: [__m256i; 8] = std::array::from_fn(|k| {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16 * k) as *const _))
        });
        for n in 0..2 {
            for h in 0..2 {
                let mut a = [[_mm256_setzero_si256(); C]; 4];
                for q in 4 * h..4 * h + 4 {
                    let at = p.add(L.q6(n, q));
                    let (va, vb, vh) = (line(at), line(at.add(32)), line(at.add(64)));
                    let g = [
                        low_or(va, _mm256_and_si256(_mm256_slli_epi16::<4>(vh), m30), m4),
                        low_or(vb, _mm256_and_si256(_mm256_slli_epi16::<2>(vh), m30), m4),
                        low_or(_mm256_srli_epi16::<4>(va), _mm256_and_si256(vh, m30), m4),
                        low_or(
                            _mm256_srli_epi16::<4>(vb),
                            _mm256_and_si256(_mm256_srli_epi16::<2>(vh), m30),
                            m4,
                        ),
                    ];
                    for t in 0..C {
                        let qs = yb[t].qs.as_ptr().add(128 * n + 4 * q);
                        for k in 0..4 {
                            let s = _mm256_madd_epi16(dot4(g[k], qs.add(32 * k)), ones);
                            a[k][t] = _mm256_add_epi32(a[k][t], s);
                        }
                    }
                }
                // Sub-blocks j = 8 n + 2 k + h: scale pair 4 n + k, its low (h = 0) or high i16.
                for k in 0..4 {
                    let pair = sp[4 * n + k];
                    let s = if h == 0 {
                        _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair))
                    } else {
                        _mm256_srai_epi32::<16>(pair)
                    };
                    for t in 0..C {
                        isc[t] = _mm256_add_epi32(isc[t], _mm256_mullo_epi32(a[k][t], s));
                    }
                }
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(p.add(L.d6()) as *const _));
        for t in 0..C {
            // The -32 of every quant: 32 x sum_j sc_j x (sum of sub-block j's activations).
            let bsum = yb[t].bsums.as_ptr();
            let mut corr = _mm256_setzero_si256();
            for (k, s) in sp.iter().enumerate() {
                let pair = std::ptr::read_unaligned(bsum.add(2 * k) as *const i32);
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(*s, _mm256_set1_epi32(pair)));
            }
            let isum = _mm256_sub_epi32(isc[t], _mm256_slli_epi32::<5>(corr));
            // d_y * d * isc, as the scalar reference.
            let dy = _mm256_set1_ps(yb[t].d);
            let v = _mm256_mul_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(isum));
            acc[t] = _mm256_add_ps(acc[t], v);
        }
    }
    for t in 0..C {
        _mm256_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}
