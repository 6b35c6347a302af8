//! The AVX2 level of `x16`: 8 rows per ymm. Without VNNI a 4-value group's products go through
//! `vpmaddubsw` (pairs summed in i16) and `vpmaddwd` by ones (pairs of pairs in i32). The i16 sums
//! never saturate: a pair is at most 2 x 63 x 128 = 16,128, and Q4_K sums 8 groups in i16 (30,720
//! at most), Q5_K 4 (31,744) and Q6_K 1 before moving them to i32.

use super::kernels::{group_k4, group_q6, Level};
use super::{Ahead, Sums};
use muser_gguf::GgmlType;
use muser_quant::BlockQ8K;
use std::arch::x86_64::*;

/// Whether this CPU runs these kernels (AVX2, FMA, F16C).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(super) struct Avx2;

impl Level for Avx2 {
    const R: usize = 8;
    const HI16: bool = false;
    const SPAN4: usize = 8;
    const SPAN5: usize = 4;
    type I = __m256i;
    type F = __m256;
    /// (the i16 stage, the i32 sums)
    type Acc = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat8(b: i8) -> __m256i {
        _mm256_set1_epi8(b)
    }
    #[inline(always)]
    unsafe fn line(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const _)
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        _mm256_and_si256(a, b)
    }
    #[inline(always)]
    unsafe fn andnot(a: __m256i, b: __m256i) -> __m256i {
        _mm256_andnot_si256(a, b)
    }
    #[inline(always)]
    unsafe fn low_or(a: __m256i, b: __m256i, m4: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_and_si256(a, m4), b)
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m256i) -> __m256i {
        _mm256_srl_epi16(a, _mm_cvtsi32_si128(N as i32))
    }
    #[inline(always)]
    unsafe fn slli16<const N: u32>(a: __m256i) -> __m256i {
        _mm256_sll_epi16(a, _mm_cvtsi32_si128(N as i32))
    }
    #[inline(always)]
    unsafe fn bit_to_4(x: __m256i, k: usize) -> __m256i {
        let s = if k <= 4 {
            _mm256_sll_epi16(x, _mm_cvtsi32_si128(4 - k as i32))
        } else {
            _mm256_srl_epi16(x, _mm_cvtsi32_si128(k as i32 - 4))
        };
        _mm256_and_si256(s, _mm256_set1_epi8(0x10))
    }
    #[inline(always)]
    unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256i, b: __m256i) -> __m256i {
        _mm256_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mullo(a: __m256i, b: __m256i) -> __m256i {
        _mm256_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn srai4(a: __m256i) -> __m256i {
        _mm256_srai_epi32::<4>(a)
    }
    #[inline(always)]
    unsafe fn slli5(a: __m256i) -> __m256i {
        _mm256_slli_epi32::<5>(a)
    }
    #[inline(always)]
    unsafe fn lo16(a: __m256i) -> __m256i {
        _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(a))
    }
    #[inline(always)]
    unsafe fn hi16(a: __m256i) -> __m256i {
        _mm256_srai_epi32::<16>(a)
    }
    #[inline(always)]
    unsafe fn u8s(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const _))
    }
    #[inline(always)]
    unsafe fn u8_pairs(p: *const u8) -> __m256i {
        _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const _))
    }
    #[inline(always)]
    unsafe fn i8_pairs(p: *const u8) -> __m256i {
        _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const _))
    }
    #[inline(always)]
    unsafe fn madd_pairs(acc: __m256i, a: __m256i, pair: i32) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, _mm256_set1_epi32(pair)))
    }
    #[inline(always)]
    unsafe fn acc_zero() -> (__m256i, __m256i) {
        (_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn acc_add(acc: (__m256i, __m256i), w: __m256i, y: *const i8) -> (__m256i, __m256i) {
        let yv = _mm256_set1_epi32(std::ptr::read_unaligned(y as *const i32));
        (_mm256_add_epi16(acc.0, _mm256_maddubs_epi16(w, yv)), acc.1)
    }
    #[inline(always)]
    unsafe fn acc_flush(acc: (__m256i, __m256i)) -> (__m256i, __m256i) {
        (_mm256_setzero_si256(), Self::acc_i32(acc))
    }
    #[inline(always)]
    unsafe fn acc_i32(acc: (__m256i, __m256i)) -> __m256i {
        _mm256_add_epi32(acc.1, _mm256_madd_epi16(acc.0, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const _))
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn to_f(a: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add_f(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, a: __m256) {
        _mm256_storeu_ps(p, a)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4<const C: usize, const FIVE: bool>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    s: &mut Sums,
    pf: Ahead,
) {
    group_k4::<Avx2, C, FIVE>(w, y, nb, s, pf)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, s: &mut Sums, pf: Ahead) {
    group_q6::<Avx2, C>(w, y, nb, s, pf)
}

/// One group's 8 rows of format `ty` against `c` (1 or 2) columns (`y`: c x nb blocks).
///
/// `pf`: how to ask for the weight lines ahead (`super::AheadPlan`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds the group's nb blocks.
pub(super) unsafe fn group(
    ty: GgmlType,
    c: usize,
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    s: &mut Sums,
    pf: Ahead,
) {
    match (ty, c) {
        (GgmlType::Q4_K, 1) => k4::<1, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, _) => k4::<2, false>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 1) => k4::<1, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, _) => k4::<2, true>(w, y, nb, s, pf),
        (_, 1) => q6::<1>(w, y, nb, s, pf),
        (_, _) => q6::<2>(w, y, nb, s, pf),
    }
}
