//! f16 x f32 vector kernels for attention over the f16 KV cache: AVX2+F16C+FMA when the CPU has
//! them (checked at run time), a scalar loop otherwise.

use half::f16;

/// sum_i a[i] * b[i].
pub fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports avx2, fma and f16c (checked above).
        return unsafe { x86::dot_f16_f32(a, b) };
    }
    a.iter().zip(b).map(|(x, y)| x.to_f32() * y).sum()
}

/// out[i] += s * v[i].
pub fn axpy_f16(out: &mut [f32], s: f32, v: &[f16]) {
    debug_assert_eq!(out.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as above.
        return unsafe { x86::axpy_f16(out, s, v) };
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o += s * x.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr() as *const u16, b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let a1 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8) as *const __m128i));
            acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(pb.add(i + 8)), acc1);
            i += 16;
        }
        while i + 8 <= n {
            let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        let mut sum = _mm_cvtss_f32(s1);
        while i < n {
            sum += a[i].to_f32() * b[i];
            i += 1;
        }
        sum
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(out: &mut [f32], s: f32, v: &[f16]) {
        let n = out.len().min(v.len());
        let (po, pv) = (out.as_mut_ptr(), v.as_ptr() as *const u16);
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i) as *const __m128i));
            _mm256_storeu_ps(
                po.add(i),
                _mm256_fmadd_ps(sv, x, _mm256_loadu_ps(po.add(i))),
            );
            i += 8;
        }
        while i < n {
            out[i] += s * v[i].to_f32();
            i += 1;
        }
    }
}
