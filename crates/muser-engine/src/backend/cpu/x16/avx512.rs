//! The AVX-512 VNNI level of `x16`: 16 rows per zmm, `vpdpbusd` for the 4-value products and
//! `vpdpwssd` for the scaled sums.

use super::kernels::{group_k4, group_q6, Level};
use super::{Ahead, Sums};
use muser_gguf::GgmlType;
use muser_quant::BlockQ8K;
use std::arch::x86_64::*;

pub(super) struct Avx512;

impl Level for Avx512 {
    const R: usize = 16;
    const HI16: bool = true;
    const SPAN4: usize = 8;
    const SPAN5: usize = 8;
    type I = __m512i;
    type F = __m512;
    type Acc = __m512i;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat8(b: i8) -> __m512i {
        _mm512_set1_epi8(b)
    }
    #[inline(always)]
    unsafe fn line(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }
    #[inline(always)]
    unsafe fn andnot(a: __m512i, b: __m512i) -> __m512i {
        _mm512_andnot_si512(a, b)
    }
    #[inline(always)]
    unsafe fn low_or(a: __m512i, b: __m512i, m4: __m512i) -> __m512i {
        _mm512_ternarylogic_epi32::<0xEC>(a, b, m4)
    }
    #[inline(always)]
    unsafe fn srli16<const N: u32>(a: __m512i) -> __m512i {
        _mm512_srli_epi16::<N>(a)
    }
    #[inline(always)]
    unsafe fn slli16<const N: u32>(a: __m512i) -> __m512i {
        _mm512_slli_epi16::<N>(a)
    }
    #[inline(always)]
    unsafe fn bit_to_4(x: __m512i, k: usize) -> __m512i {
        let s = if k <= 4 {
            _mm512_sll_epi16(x, _mm_cvtsi32_si128(4 - k as i32))
        } else {
            _mm512_srl_epi16(x, _mm_cvtsi32_si128(k as i32 - 4))
        };
        _mm512_and_si512(s, _mm512_set1_epi8(0x10))
    }
    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn mullo(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn srai4(a: __m512i) -> __m512i {
        _mm512_srai_epi32::<4>(a)
    }
    #[inline(always)]
    unsafe fn slli5(a: __m512i) -> __m512i {
        _mm512_slli_epi32::<5>(a)
    }
    #[inline(always)]
    unsafe fn lo16(a: __m512i) -> __m512i {
        _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(a))
    }
    #[inline(always)]
    unsafe fn hi16(a: __m512i) -> __m512i {
        _mm512_srai_epi32::<16>(a)
    }
    #[inline(always)]
    unsafe fn u8s(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const _))
    }
    #[inline(always)]
    unsafe fn u8_pairs(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const _))
    }
    #[inline(always)]
    unsafe fn i8_pairs(p: *const u8) -> __m512i {
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(p as *const _))
    }
    #[inline(always)]
    unsafe fn madd_pairs(acc: __m512i, a: __m512i, pair: i32) -> __m512i {
        _mm512_dpwssd_epi32(acc, a, _mm512_set1_epi32(pair))
    }
    #[inline(always)]
    unsafe fn acc_zero() -> __m512i {
        _mm512_setzero_si512()
    }
    #[inline(always)]
    unsafe fn acc_add(acc: __m512i, w: __m512i, y: *const i8) -> __m512i {
        _mm512_dpbusd_epi32(
            acc,
            w,
            _mm512_set1_epi32(std::ptr::read_unaligned(y as *const i32)),
        )
    }
    #[inline(always)]
    unsafe fn acc_flush(acc: __m512i) -> __m512i {
        acc
    }
    #[inline(always)]
    unsafe fn acc_i32(acc: __m512i) -> __m512i {
        acc
    }
    #[inline(always)]
    unsafe fn f16s(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _))
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn to_f(a: __m512i) -> __m512 {
        _mm512_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub_f(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, a: __m512) {
        _mm512_storeu_ps(p, a)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k4<const C: usize, const FIVE: bool>(
    w: &[u8],
    y: &[BlockQ8K],
    nb: usize,
    s: &mut Sums,
    pf: Ahead,
) {
    group_k4::<Avx512, C, FIVE>(w, y, nb, s, pf)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6<const C: usize>(w: &[u8], y: &[BlockQ8K], nb: usize, s: &mut Sums, pf: Ahead) {
    group_q6::<Avx512, C>(w, y, nb, s, pf)
}

/// One group's 16 rows of format `ty` against `c` (1 to 8) columns (`y`: c x nb blocks).
///
/// `pf`: how to ask for the weight lines ahead (`super::AheadPlan`).
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` holds the group's nb blocks.
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
        (GgmlType::Q4_K, 2) => k4::<2, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, 3) => k4::<3, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, 4) => k4::<4, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, 5) => k4::<5, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, 6) => k4::<6, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, 7) => k4::<7, false>(w, y, nb, s, pf),
        (GgmlType::Q4_K, _) => k4::<8, false>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 1) => k4::<1, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 2) => k4::<2, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 3) => k4::<3, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 4) => k4::<4, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 5) => k4::<5, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 6) => k4::<6, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, 7) => k4::<7, true>(w, y, nb, s, pf),
        (GgmlType::Q5_K, _) => k4::<8, true>(w, y, nb, s, pf),
        (_, 1) => q6::<1>(w, y, nb, s, pf),
        (_, 2) => q6::<2>(w, y, nb, s, pf),
        (_, 3) => q6::<3>(w, y, nb, s, pf),
        (_, 4) => q6::<4>(w, y, nb, s, pf),
        (_, 5) => q6::<5>(w, y, nb, s, pf),
        (_, 6) => q6::<6>(w, y, nb, s, pf),
        (_, 7) => q6::<7>(w, y, nb, s, pf),
        (_, _) => q6::<8>(w, y, nb, s, pf),
    }
}
