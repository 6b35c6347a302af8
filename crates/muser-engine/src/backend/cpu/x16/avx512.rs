//! The AVX-512 VNNI kernels of `x16` (16 rows per zmm): lane r is row r of the group.

use super::{Lay, Sums};
use muser_gguf::GgmlType;
use muser_quant::BlockQ8K;
use std::arch::x86_64::*;

const L: Lay = Lay { r: 16 };

/// One group's 16 rows of format `ty` against `c` (1 to 4) columns (`y`: c x nb blocks).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` holds the group's nb blocks.
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
        (GgmlType::Q4_K, 2) => group_k4::<2, false>(w, y, nb, sums),
        (GgmlType::Q4_K, 3) => group_k4::<3, false>(w, y, nb, sums),
        (GgmlType::Q4_K, _) => group_k4::<4, false>(w, y, nb, sums),
        (GgmlType::Q5_K, 1) => group_k4::<1, true>(w, y, nb, sums),
        (GgmlType::Q5_K, 2) => group_k4::<2, true>(w, y, nb, sums),
        (GgmlType::Q5_K, 3) => group_k4::<3, true>(w, y, nb, sums),
        (GgmlType::Q5_K, _) => group_k4::<4, true>(w, y, nb, sums),
        (_, 1) => group_q6::<1>(w, y, nb, sums),
        (_, 2) => group_q6::<2>(w, y, nb, sums),
        (_, 3) => group_q6::<3>(w, y, nb, sums),
        (_, _) => group_q6::<4>(w, y, nb, sums),
    }
}

#[inline(always)]
unsafe fn dword(p: *const i8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

#[inline(always)]
unsafe fn line(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const _)
}

/// Each byte's bit k moved to bit 4, the others cleared.
#[inline(always)]
unsafe fn bit_to_4(x: __m512i, k: usize) -> __m512i {
    let s = if k <= 4 {
        _mm512_sll_epi16(x, _mm_cvtsi32_si128(4 - k as i32))
    } else {
        _mm512_srl_epi16(x, _mm_cvtsi32_si128(k as i32 - 4))
    };
    _mm512_and_si512(s, _mm512_set1_epi8(0x10))
}

/// (a & 0x0F) | b per byte (b has no bit of 0x0F set).
#[inline(always)]
unsafe fn low_or(a: __m512i, b: __m512i, m4: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0xEC>(a, b, m4)
}

/// One group's 16 rows of Q4_K (FIVE = false) or Q5_K against C columns (`y`: C x nb blocks)
/// over all nb blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * bs);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm512_setzero_si512(); C];
        for ch in 0..4 {
            let mut lo = [_mm512_setzero_si512(); C];
            let mut hi = [_mm512_setzero_si512(); C];
            for q in 0..8 {
                let v = line(p.add(qs0 + 64 * (8 * ch + q)));
                let (vl, vh) = if FIVE {
                    // Values 0..31: the nibble and the fifth bit (bit 2 ch / 2 ch + 1 of qh).
                    let h = line(p.add(L.qh5() + 64 * q));
                    let vl = low_or(v, bit_to_4(h, 2 * ch), m4);
                    let vh = low_or(_mm512_srli_epi16::<4>(v), bit_to_4(h, 2 * ch + 1), m4);
                    (vl, vh)
                } else {
                    // The high nibbles as 16 x their values (the sums are scaled back below).
                    (_mm512_and_si512(v, m4), _mm512_andnot_si512(m4, v))
                };
                for t in 0..C {
                    let qs = yb[t].qs.as_ptr();
                    lo[t] = _mm512_dpbusd_epi32(lo[t], vl, dword(qs.add(64 * ch + 4 * q)));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], vh, dword(qs.add(64 * ch + 32 + 4 * q)));
                }
            }
            let sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(L.sc() + 32 * ch) as *const _));
            let sh =
                _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(L.sc() + 32 * ch + 16) as *const _));
            for t in 0..C {
                // Q4_K: hi holds 16 x the exact sums, so the shift is exact.
                let h = if FIVE {
                    hi[t]
                } else {
                    _mm512_srai_epi32::<4>(hi[t])
                };
                isc[t] = _mm512_add_epi32(
                    isc[t],
                    _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl), _mm512_mullo_epi32(h, sh)),
                );
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(L.dmin()) as *const _));
        let mp: [__m512i; 4] = std::array::from_fn(|k| {
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(p.add(L.mn() + 32 * k) as *const _))
        });
        for t in 0..C {
            let bsum = &yb[t].bsums;
            let mut im = _mm512_setzero_si512();
            for (k, m) in mp.iter().enumerate() {
                let s0 = bsum[4 * k] as i32 + bsum[4 * k + 1] as i32;
                let s1 = bsum[4 * k + 2] as i32 + bsum[4 * k + 3] as i32;
                im = _mm512_dpwssd_epi32(im, *m, _mm512_set1_epi32((s0 & 0xffff) | (s1 << 16)));
            }
            // d_y * d * isc - d_y * dmin * im, as the scalar reference.
            let dy = _mm512_set1_ps(yb[t].d);
            let a1 = _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isc[t]));
            let a2 = _mm512_mul_ps(_mm512_mul_ps(dy, dmin), _mm512_cvtepi32_ps(im));
            acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(a1, a2));
        }
    }
    for t in 0..C {
        _mm512_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}

/// As `group_k4` for Q6_K. Per half n of a block and dword q of its 32 values: `ql` dwords
/// 16 n + q (A) and 16 n + 8 + q (B), `qh` dword 8 n + q (H) (one triple of lines, `Lay::q6`)
/// make the groups of values
/// 128 n + 4 q + 32 k (k = 0..3): A's low nibbles with H's bits 0-1, B's with bits 2-3, A's high
/// nibbles with bits 4-5, B's with bits 6-7; group k is in sub-block 8 n + 2 k + q / 4.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_q6<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, sums: &mut Sums) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let p = w.as_ptr().add(b * 212 * L.r);
        let yb: [&BlockQ8K; C] = std::array::from_fn(|t| &y[t * nb + b]);
        let mut isc = [_mm512_setzero_si512(); C];
        // Scale pairs as i16 (sc_2k low, sc_2k+1 high in each dword).
        let sp: [__m512i; 8] = std::array::from_fn(|k| {
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(32 * k) as *const _))
        });
        for n in 0..2 {
            for h in 0..2 {
                let mut a = [[_mm512_setzero_si512(); C]; 4];
                for q in 4 * h..4 * h + 4 {
                    let at = p.add(L.q6(n, q));
                    let (va, vb, vh) = (line(at), line(at.add(64)), line(at.add(128)));
                    let g = [
                        low_or(va, _mm512_and_si512(_mm512_slli_epi16::<4>(vh), m30), m4),
                        low_or(vb, _mm512_and_si512(_mm512_slli_epi16::<2>(vh), m30), m4),
                        low_or(_mm512_srli_epi16::<4>(va), _mm512_and_si512(vh, m30), m4),
                        low_or(
                            _mm512_srli_epi16::<4>(vb),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(vh), m30),
                            m4,
                        ),
                    ];
                    for t in 0..C {
                        let qs = yb[t].qs.as_ptr().add(128 * n + 4 * q);
                        for k in 0..4 {
                            a[k][t] = _mm512_dpbusd_epi32(a[k][t], g[k], dword(qs.add(32 * k)));
                        }
                    }
                }
                // Sub-blocks j = 8 n + 2 k + h: scale pair 4 n + k, its low (h = 0) or high i16.
                for k in 0..4 {
                    let pair = sp[4 * n + k];
                    let s = if h == 0 {
                        _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair))
                    } else {
                        _mm512_srai_epi32::<16>(pair)
                    };
                    for t in 0..C {
                        isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(a[k][t], s));
                    }
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(L.d6()) as *const _));
        for t in 0..C {
            // The -32 of every quant: 32 x sum_j sc_j x (sum of sub-block j's activations).
            let bsum = yb[t].bsums.as_ptr();
            let mut corr = _mm512_setzero_si512();
            for (k, s) in sp.iter().enumerate() {
                let pair = std::ptr::read_unaligned(bsum.add(2 * k) as *const i32);
                corr = _mm512_dpwssd_epi32(corr, *s, _mm512_set1_epi32(pair));
            }
            let isum = _mm512_sub_epi32(isc[t], _mm512_slli_epi32::<5>(corr));
            // d_y * d * isc, as the scalar reference.
            let dy = _mm512_set1_ps(yb[t].d);
            let v = _mm512_mul_ps(_mm512_mul_ps(dy, d), _mm512_cvtepi32_ps(isum));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    for t in 0..C {
        _mm512_storeu_ps(sums[t].as_mut_ptr(), acc[t]);
    }
}
