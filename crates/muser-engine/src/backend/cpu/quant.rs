//! Activation quantization to Q8_K with AVX-512: the same bytes as muser-quant's
//! `quantize_row_q8_k_ref` (the first value of largest magnitude sets the scale; quants by the
//! same f32 multiply and round-to-nearest trick; the same sums), 16 values at a time. Blocks
//! holding a NaN or an infinity go to the reference.

use muser_quant::quantize::quantize_row_q8_k_ref;
use muser_quant::{BlockQ8K, QK_K};

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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use muser_quant::BlockQ8K;
    use std::arch::x86_64::*;

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
