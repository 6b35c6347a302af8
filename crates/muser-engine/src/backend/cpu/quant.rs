//! Activation quantization to Q8_K with AVX-512: the same bytes as muser-quant's
//! `quantize_row_q8_k_ref` (the first value of largest magnitude sets the scale; quants by the
//! same f32 multiply and round-to-nearest trick; the same sums), 16 values at a time. The same
//! for Q8_0 (`quantize_row_q8_0_ref`: the same scalar scale, the same f32 multiply, C's `roundf`
//! done exactly). Blocks holding a NaN or an infinity go to the reference.

use muser_quant::quantize::{quantize_row_q8_0_ref, quantize_row_q8_k_ref};
use muser_quant::{BlockQ8K, BlockQ8_0, QK8_0, QK_K};

/// As `quantize_row_q8_k_ref(x, y)`, bit for bit.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() && x.len() == y.len() * QK_K {
        for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
            // SAFETY: the CPU has AVX-512F/BW; xs holds QK_K values.
            if !unsafe { x86::block(xs, b) } {
                quantize_row_q8_k_ref(xs, std::slice::from_mut(b));
            }
        }
        return;
    }
    quantize_row_q8_k_ref(x, y)
}

/// As `quantize_row_q8_0_ref(x, y)`, bit for bit.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() && x.len() == y.len() * QK8_0 {
        for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK8_0)) {
            // SAFETY: the CPU has AVX-512F/BW; xs holds QK8_0 values.
            if !unsafe { x86::block_q8_0(xs, b) } {
                quantize_row_q8_0_ref(xs, std::slice::from_mut(b));
            }
        }
        return;
    }
    quantize_row_q8_0_ref(x, y)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use muser_quant::quantize::fp32_to_fp16;
    use muser_quant::{BlockQ8K, BlockQ8_0};
    use std::arch::x86_64::*;

    /// One Q8_0 block of 32; false (nothing written) if it holds a NaN or an infinity.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn block_q8_0(xs: &[f32], b: &mut BlockQ8_0) -> bool {
        let v = [
            _mm512_loadu_ps(xs.as_ptr()),
            _mm512_loadu_ps(xs.as_ptr().add(16)),
        ];
        let a = v.map(|v| _mm512_abs_ps(v));
        let inf = _mm512_set1_ps(f32::INFINITY);
        if _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a[0], inf) & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a[1], inf)
            != 0xffff
        {
            return false;
        }
        // The reference's scalar scale: the maximum magnitude (all finite), / 127, inverted.
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a[0], a[1]));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        let one = _mm512_set1_ps(1.0);
        let half = _mm512_set1_ps(0.5);
        for (k, v) in v.iter().enumerate() {
            let p = _mm512_mul_ps(*v, _mm512_set1_ps(id));
            // roundf: p's integer part, plus one away from zero where the fraction (p - t,
            // exact: |p| <= 127.5 and t its truncation) is at least a half.
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(p, t)), half);
            let step = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_castps_si512(one),
                _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32(i32::MIN)),
            ));
            let r = _mm512_mask_add_ps(t, away, t, step);
            _mm_storeu_si128(
                b.qs.as_mut_ptr().add(16 * k) as *mut __m128i,
                _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)),
            );
        }
        true
    }

    pub fn available() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
        })
    }

    /// One block of 256; false (nothing written) if it holds a NaN or an infinity.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn block(xs: &[f32], b: &mut BlockQ8K) -> bool {
        let p = xs.as_ptr();
        let v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(p.add(16 * j)));
        let inf = _mm512_set1_ps(f32::INFINITY);
        let mut amax = _mm512_setzero_ps();
        let mut finite: __mmask16 = 0xffff;
        for vj in &v {
            let a = _mm512_abs_ps(*vj);
            finite &= _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, inf);
            amax = _mm512_max_ps(amax, a);
        }
        if finite != 0xffff {
            return false;
        }
        let amax = _mm512_reduce_max_ps(amax);
        if amax == 0.0 {
            *b = bytemuck::Zeroable::zeroed();
            return true;
        }
        // The first value whose magnitude is the maximum (the reference's strict `>` scan).
        let am = _mm512_set1_ps(amax);
        let mut max = 0.0f32;
        for (j, vj) in v.iter().enumerate() {
            let m = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*vj), am);
            if m != 0 {
                max = xs[16 * j + m.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let is = _mm512_set1_ps(iscale);
        let magic = _mm512_set1_ps(12_582_912.0);
        let (mask, off, top) = (
            _mm512_set1_epi32(0x007f_ffff),
            _mm512_set1_epi32(0x0040_0000),
            _mm512_set1_epi32(127),
        );
        for (j, vj) in v.iter().enumerate() {
            // nearest_int(iscale * v): (bits(iscale * v + 1.5 * 2^23) & 0x7fffff) - 0x400000.
            let t = _mm512_add_ps(_mm512_mul_ps(is, *vj), magic);
            let q = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(t), mask), off);
            let q = _mm512_min_epi32(q, top);
            _mm_storeu_si128(
                b.qs.as_mut_ptr().add(16 * j) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
            b.bsums[j] = _mm512_reduce_add_epi32(q) as i16;
        }
        b.d = 1.0 / iscale;
        true
    }
}
