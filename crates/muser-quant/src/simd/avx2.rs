//! AVX2 + FMA + F16C dot kernels: one weight row (any length for the float formats, whole blocks
//! for the quantized ones) against one activation row, as called per matrix row by the engine.
//!
//! Quantized dots: the weights' quants are unpacked in registers (nibbles by shift and mask) and
//! multiplied with the int8 activations by `vpmaddubsw` (u8 x i8 -> pairs summed in i16; the
//! largest pair, 2 * 63 * 128 = 16,128 for Q6_K, never saturates), then by the sub-block scales
//! with `vpmaddwd` into i32 lanes. A super-block's i32 sum is converted to f32 once. The integer
//! sums are exactly the scalar reference's; only the f32 order across blocks differs.
//! Q8_0 widens both operands to i16 (exact for every int8 value, -128 included) and keeps the
//! scalar reference's f32 order as well, so its bits are the reference's.
//!
//! Measured 2026-11-29 on the 2-core AMD EPYC CPU machine, rows of 4096, one thread, best of
//! many passes (machine shared with other jobs). GB/s of weights, in L2 (512 KB) / streamed
//! (64 MB): Q4_K 27 / 24, Q5_K 26 / 24, Q6_K 41 / 28, Q8_0 10 / 5, f32 89 / 36, f16 53 / 32.

use super::{check_len, unpack_scales_mins_k4, KCols, Kernels};
use crate::blocks::*;
use half::{bf16, f16};
use std::arch::x86_64::*;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The AVX2 table. Panics if the CPU lacks the features: the wrappers below are sound only
/// because this check ran.
pub(super) fn kernels() -> Kernels {
    assert!(available(), "the AVX2 kernels need AVX2, FMA and F16C");
    // SAFETY (every wrapper): the CPU has AVX2, FMA and F16C, checked just above.
    Kernels {
        isa: "avx2",
        dot_f32: |x, y| unsafe { dot_f32(x, y) },
        dot_f16_f32: |x, y| unsafe { dot_f16_f32(x, y) },
        dot_bf16_f32: |x, y| unsafe { dot_bf16_f32(x, y) },
        dot_q8_0_q8_0: |x, y| unsafe { dot_q8_0_q8_0(x, y) },
        dot_q4_k_q8_k: |x, y| unsafe { q4_k_cols::<1>(x, [y])[0] },
        dot_q5_k_q8_k: |x, y| unsafe { q5_k_cols::<1>(x, [y])[0] },
        dot_q6_k_q8_k: |x, y| unsafe { q6_k_cols::<1>(x, [y])[0] },
        cols: Some(KCols {
            q4_k2: |x, y| unsafe { q4_k_cols::<2>(x, y) },
            q4_k4: |x, y| unsafe { q4_k_cols::<4>(x, y) },
            q4_k8: |x, y| unsafe { q4_k_cols::<8>(x, y) },
            q5_k2: |x, y| unsafe { q5_k_cols::<2>(x, y) },
            q5_k4: |x, y| unsafe { q5_k_cols::<4>(x, y) },
            q5_k8: |x, y| unsafe { q5_k_cols::<8>(x, y) },
            q6_k2: |x, y| unsafe { q6_k_cols::<2>(x, y) },
            q6_k4: |x, y| unsafe { q6_k_cols::<4>(x, y) },
            q6_k8: |x, y| unsafe { q6_k_cols::<8>(x, y) },
        }),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// 32 bytes at `p` (unaligned).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load256<T>(p: *const T) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

// Eight weights widened to f32, per float format.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8_f32(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8_f16(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}
/// bf16 is the top half of an f32: widen to u32 and shift left 16 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8_bf16(p: *const bf16) -> __m256 {
    let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
}

/// A float dot: four independent 8-lane FMA chains over 32 values per step, then 8 at a time,
/// then a scalar tail.
macro_rules! float_dot {
    ($name:ident, $t:ty, $load8:ident, $to_f32:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(x: &[$t], y: &[f32]) -> f32 {
            check_len(stringify!($name), x.len(), y.len());
            let (n, xp, yp) = (x.len(), x.as_ptr(), y.as_ptr());
            let (mut a0, mut a1, mut a2, mut a3) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut i = 0;
            while i + 32 <= n {
                a0 = _mm256_fmadd_ps($load8(xp.add(i)), _mm256_loadu_ps(yp.add(i)), a0);
                a1 = _mm256_fmadd_ps($load8(xp.add(i + 8)), _mm256_loadu_ps(yp.add(i + 8)), a1);
                a2 = _mm256_fmadd_ps($load8(xp.add(i + 16)), _mm256_loadu_ps(yp.add(i + 16)), a2);
                a3 = _mm256_fmadd_ps($load8(xp.add(i + 24)), _mm256_loadu_ps(yp.add(i + 24)), a3);
                i += 32;
            }
            while i + 8 <= n {
                a0 = _mm256_fmadd_ps($load8(xp.add(i)), _mm256_loadu_ps(yp.add(i)), a0);
                i += 8;
            }
            let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for j in i..n {
                sum += $to_f32(x[j]) * y[j];
            }
            sum
        }
    };
}

float_dot!(dot_f32, f32, load8_f32, |v: f32| v);
float_dot!(dot_f16_f32, f16, load8_f16, |v: f16| v.to_f32());
float_dot!(dot_bf16_f32, bf16, load8_bf16, |v: bf16| v.to_f32());

/// The scalar reference's order (`dot::q8_0_blocks_add`), so its bits: per block the exact
/// integer dot (both int8 halves widened to i16, `vpmaddwd` into 8 i32 lanes), then
/// `sum += float(dot) * (d_x * d_y)` in f32 without fma, block by block. Eight blocks per step:
/// their lanes reduced to one vector of 8 integers (`vphaddd` twice, then the two 128-bit
/// halves; integer adds, exact), their values computed as one vector, added to the sum in block
/// order. The last nb mod 8 blocks by `q8_0_blocks_add` itself.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    check_len("dot_q8_0_q8_0", x.len(), y.len());
    let mut sum = _mm_setzero_ps();
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let (x_tail, y_tail) = (xs.remainder(), ys.remainder());
    for (bx, by) in xs.zip(ys) {
        let lanes: [__m256i; 8] = std::array::from_fn(|k| {
            let (xq, yq) = (
                bx[k].qs.as_ptr() as *const __m128i,
                by[k].qs.as_ptr() as *const __m128i,
            );
            let p0 = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128(xq)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(yq)),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm_loadu_si128(xq.add(1))),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(yq.add(1))),
            );
            _mm256_add_epi32(p0, p1)
        });
        // Per 128-bit lane: the lane sums of blocks 0..4 (a) and 4..8 (b).
        let a = _mm256_hadd_epi32(
            _mm256_hadd_epi32(lanes[0], lanes[1]),
            _mm256_hadd_epi32(lanes[2], lanes[3]),
        );
        let b = _mm256_hadd_epi32(
            _mm256_hadd_epi32(lanes[4], lanes[5]),
            _mm256_hadd_epi32(lanes[6], lanes[7]),
        );
        let dots = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        );
        let d = |b: &[BlockQ8_0]| {
            _mm256_cvtph_ps(_mm_setr_epi16(
                b[0].d.to_bits() as i16,
                b[1].d.to_bits() as i16,
                b[2].d.to_bits() as i16,
                b[3].d.to_bits() as i16,
                b[4].d.to_bits() as i16,
                b[5].d.to_bits() as i16,
                b[6].d.to_bits() as i16,
                b[7].d.to_bits() as i16,
            ))
        };
        let v = _mm256_mul_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(d(bx), d(by)));
        sum = add8_in_order(sum, v);
    }
    crate::dot::q8_0_blocks_add(_mm_cvtss_f32(sum), x_tail, y_tail)
}

/// sum + v[0] + v[1] + .. + v[7], one f32 addition at a time in lane order (the Q8_0 dots'
/// block order), in lane 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn add8_in_order(mut sum: __m128, v: __m256) -> __m128 {
    for h in [_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v)] {
        sum = _mm_add_ss(sum, h);
        sum = _mm_add_ss(sum, _mm_movehdup_ps(h));
        sum = _mm_add_ss(sum, _mm_movehl_ps(h, h));
        sum = _mm_add_ss(sum, _mm_shuffle_ps::<0b11_11_11_11>(h, h));
    }
    sum
}

/// `vpshufb` controls that broadcast i16 lane j of a 128-bit lane to all 8 of its i16 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bcast_i16_ctrl(j: i16) -> __m256i {
    _mm256_set1_epi16(((2 * j + 1) << 8) | (2 * j))
}

/// The (scales, mins) of a Q4_K/Q5_K block as i16 vectors: each 128-bit lane of the first
/// holds the eight scales; the second the eight mins, each twice (lane 2j and 2j+1: sub-block j),
/// for `vpmaddwd` with the Q8_K sums per 16 (`mins_dot`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_scales_mins(scales: &[u8; 12]) -> (__m256i, __m256i) {
    let (sc, m) = unpack_scales_mins_k4(scales);
    let sm = _mm_set_epi64x(m as i64, sc as i64);
    // Mins (bytes 8..16 of sm) each repeated twice, widened to 16 i16 lanes.
    let dup = _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
    (_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm)), mins)
}

/// The mins dotted with a column's Q8_K sums per 16: 8 i32 lanes, sub-block j in lane j:
/// m_j * (bsums[2j] + bsums[2j+1]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mins_dot(mins: __m256i, bsums: &[i16; 16]) -> __m256i {
    _mm256_madd_epi16(mins, load256(bsums.as_ptr()))
}

/// Block b of each of the C columns.
#[inline(always)]
unsafe fn col_blocks<const C: usize>(y: &[*const BlockQ8K; C], b: usize) -> [&BlockQ8K; C] {
    std::array::from_fn(|c| &*y[c].add(b))
}

/// The columns' first blocks, each checked to have `nb` blocks.
fn col_ptrs<const C: usize>(what: &str, nb: usize, y: &[&[BlockQ8K]; C]) -> [*const BlockQ8K; C] {
    std::array::from_fn(|c| {
        check_len(what, nb, y[c].len());
        y[c].as_ptr()
    })
}

/// Per column the f32 step of a Q4_K/Q5_K block: acc += sumi * (d_y * d), acc_m += mins * (d_y *
/// dmin), lane by lane (the one-column kernel's order).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn k4_step<const C: usize>(
    d: f16,
    dmin: f16,
    mins: __m256i,
    by: &[&BlockQ8K; C],
    sumi: &[__m256i; C],
    acc: &mut [__m256; C],
    acc_m: &mut [__m256; C],
) {
    let (xd, xm) = (f16_to_f32(d), f16_to_f32(dmin));
    for c in 0..C {
        let md = mins_dot(mins, &by[c].bsums);
        acc[c] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(sumi[c]),
            _mm256_set1_ps(by[c].d * xd),
            acc[c],
        );
        acc_m[c] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(md),
            _mm256_set1_ps(by[c].d * xm),
            acc_m[c],
        );
    }
}

/// Sub-blocks 2g (lo) and 2g + 1 (hi) of a Q4_K/Q5_K block against C columns: sumi[c] +=
/// sc_2g * (lo . y_c) + sc_2g+1 * (hi . y_c), the products of u8 quants and i8 activations
/// summed in i16 pairs (`vpmaddubsw`), then by the scales into i32 lanes (`vpmaddwd`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k4_group<const C: usize>(
    g: usize,
    lo: __m256i,
    hi: __m256i,
    scales: __m256i,
    by: &[&BlockQ8K; C],
    sumi: &mut [__m256i; C],
) {
    let slo = _mm256_shuffle_epi8(scales, bcast_i16_ctrl(2 * g as i16));
    let shi = _mm256_shuffle_epi8(scales, bcast_i16_ctrl(2 * g as i16 + 1));
    for c in 0..C {
        let plo = _mm256_maddubs_epi16(lo, load256(by[c].qs.as_ptr().add(64 * g)));
        let phi = _mm256_maddubs_epi16(hi, load256(by[c].qs.as_ptr().add(64 * g + 32)));
        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(plo, slo));
        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(phi, shi));
    }
}

/// Q4_K against C columns: per group of 64 values, the 32 qs bytes give sub-block 2g (low
/// nibbles) and 2g+1 (high nibbles) against 32 activations each. Each block's quants and scales
/// are unpacked once for the C columns; per column the arithmetic is the one-column dot's
/// (C = 1), lane for lane, so every column gets its bits whatever C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_cols<const C: usize>(x: &[BlockQ4K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    let yp = col_ptrs("dot_q4_k_q8_k", x.len(), &y);
    let m4 = _mm256_set1_epi8(0x0f);
    let (mut acc, mut acc_m) = ([_mm256_setzero_ps(); C], [_mm256_setzero_ps(); C]);
    for (b, bx) in x.iter().enumerate() {
        let by = col_blocks(&yp, b);
        let (scales, mins) = k4_scales_mins(&bx.scales);
        let mut sumi = [_mm256_setzero_si256(); C];
        for g in 0..4 {
            let q = load256(bx.qs.as_ptr().add(32 * g));
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            k4_group(g, lo, hi, scales, &by, &mut sumi);
        }
        k4_step(bx.d, bx.dmin, mins, &by, &sumi, &mut acc, &mut acc_m);
    }
    std::array::from_fn(|c| hsum_ps(_mm256_sub_ps(acc[c], acc_m[c])))
}

/// Q5_K against C columns: as Q4_K; the fifth bit of group g's low (high) half is bit 2g (2g+1)
/// of `qh`, moved to bit 4. `qh` is shifted right by 2 per group, so bits 0 and 1 of each byte
/// are always the current pair (the 16-bit shift pulls neighbour bits only into bits 6-7, never
/// read).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_cols<const C: usize>(x: &[BlockQ5K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    let yp = col_ptrs("dot_q5_k_q8_k", x.len(), &y);
    let (m4, bit4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
    let (mut acc, mut acc_m) = ([_mm256_setzero_ps(); C], [_mm256_setzero_ps(); C]);
    for (b, bx) in x.iter().enumerate() {
        let by = col_blocks(&yp, b);
        let (scales, mins) = k4_scales_mins(&bx.scales);
        let mut qh = load256(bx.qh.as_ptr());
        let mut sumi = [_mm256_setzero_si256(); C];
        for g in 0..4 {
            let q = load256(bx.qs.as_ptr().add(32 * g));
            let lo = _mm256_or_si256(
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4),
            );
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4),
            );
            qh = _mm256_srli_epi16(qh, 2);
            k4_group(g, lo, hi, scales, &by, &mut sumi);
        }
        k4_step(bx.d, bx.dmin, mins, &by, &sumi, &mut acc, &mut acc_m);
    }
    std::array::from_fn(|c| hsum_ps(_mm256_sub_ps(acc[c], acc_m[c])))
}

/// Q6_K against C columns: per half of 128 values, ql[0..32] holds values 0..32 (low nibbles)
/// and 64..96 (high), ql[32..64] values 32..64 and 96..128, qh bit pairs 0-1, 2-3, 4-5, 6-7 the
/// top bits of values l, l+32, l+64, l+96. The quants are used unsigned (0..63): sum(sc * (q -
/// 32) * y) = sum(sc * q * y) - 32 * sum_j sc_j * bsums_j, the Q8_K bsums being per 16, Q6_K's
/// sub-block. Unpacked once per block for the C columns; per column the one-column dot's
/// arithmetic (C = 1), so its bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_cols<const C: usize>(x: &[BlockQ6K], y: [&[BlockQ8K]; C]) -> [f32; C] {
    let yp = col_ptrs("dot_q6_k_q8_k", x.len(), &y);
    let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    // Chunk k of a half covers sub-blocks 2k (low 128-bit lane) and 2k+1 (high lane).
    let ctrl = |k: i16| {
        _mm256_set_m128i(
            _mm256_castsi256_si128(bcast_i16_ctrl(2 * k + 1)),
            _mm256_castsi256_si128(bcast_i16_ctrl(2 * k)),
        )
    };
    let ctrls = [ctrl(0), ctrl(1), ctrl(2), ctrl(3)];
    let mut acc = [_mm256_setzero_ps(); C];
    for (b, bx) in x.iter().enumerate() {
        let by = col_blocks(&yp, b);
        let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr() as *const __m128i));
        let mut sumi = [_mm256_setzero_si256(); C];
        for h in 0..2 {
            let sc = _mm256_broadcastsi128_si256(if h == 0 {
                _mm256_castsi256_si128(s16)
            } else {
                _mm256_extracti128_si256(s16, 1)
            });
            let ql = bx.ql.as_ptr().add(64 * h);
            let (a0, a1) = (load256(ql), load256(ql.add(32)));
            let qh = load256(bx.qh.as_ptr().add(32 * h));
            let v = [
                _mm256_or_si256(
                    _mm256_and_si256(a0, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(a1, m4),
                    _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(a0, 4), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(a1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                ),
            ];
            for k in 0..4 {
                let s = _mm256_shuffle_epi8(sc, ctrls[k]);
                for c in 0..C {
                    let q = by[c].qs.as_ptr().add(128 * h + 32 * k);
                    let p = _mm256_maddubs_epi16(v[k], load256(q));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p, s));
                }
            }
        }
        let xd = f16_to_f32(bx.d);
        for c in 0..C {
            let bias = _mm256_madd_epi16(s16, load256(by[c].bsums.as_ptr()));
            let si = _mm256_sub_epi32(sumi[c], _mm256_slli_epi32(bias, 5));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(by[c].d * xd), acc[c]);
        }
    }
    std::array::from_fn(|c| hsum_ps(acc[c]))
}
