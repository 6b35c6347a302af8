//! The softmax of attention scores and the FFN's SiLU, on one vectorized exp, shared by every
//! path of the CPU backend (decode, decode groups, batched prefill) so that they agree to the
//! bit.
//!
//! `softmax(x)`: x_j <- exp(x_j - max) / sum, with
//! - max over all x_j;
//! - exp by Cody-Waite range reduction and a degree-7 Taylor polynomial in f32 with FMAs
//!   (n = round(x log2 e); r = x - n ln2 in two parts; p(r) = sum r^k / k!; times 2^n), which is
//!   within about 1 ulp of exp; arguments below -87 (results under 2^-126, which cannot change
//!   a sum of at least 1) give 0;
//! - sum in 16 running partial sums (element j into partial j % 16, in order), reduced by a
//!   fixed tree: ((p_l + p_{l+8}) + ...) as written in `tree16`;
//! - then one IEEE division per element.
//!
//! Every step is elementwise or has a fixed order, so the AVX-512, AVX2 and scalar versions
//! give the same bits; the vector versions only run the same arithmetic 16 or 8 lanes at a
//! time.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two: the high part has 16 significant bits, so n * LN2_HI is exact for
/// |n| < 2^8.
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0.693145751953125
/// ln 2 - LN2_HI, rounded to f32 (1.4286068e-6).
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// 1.5 * 2^23: adding it rounds an f32 of magnitude < 2^22 to an integer (nearest, ties to
/// even).
const ROUND: f32 = 12_582_912.0;
/// 1/k! for k = 7 down to 2.
const C: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];
const LOW: f32 = -87.0;
/// exp(89) overflows.
const HIGH: f32 = 89.0;

/// The scalar exp of the shared softmax (the vector versions compute the same per lane).
#[inline(always)]
fn exp_scalar(x: f32, fma: impl Fn(f32, f32, f32) -> f32) -> f32 {
    // Past these bounds the result is 0 or inf anyway; NaN passes.
    let x = if x.is_nan() {
        x
    } else {
        x.clamp(LOW - 17.0, HIGH)
    };
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = fma(-n, LN2_HI, x);
    let r = fma(-n, LN2_LO, r);
    let mut p = C[0];
    for &c in &C[1..] {
        p = fma(p, r, c);
    }
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    // 2^n for n in -126..=127 (x <= 88.7); larger n overflow to inf as exp does.
    let ni = (n as i32).clamp(-126, 128);
    let scale = if ni == 128 {
        f32::INFINITY
    } else {
        f32::from_bits(((ni + 127) as u32) << 23)
    };
    let e = p * scale;
    if x < LOW {
        0.0
    } else {
        e
    }
}

/// The fixed reduction of the 16 partial sums.
#[inline(always)]
fn tree16(p: &[f32; 16]) -> f32 {
    let q: [f32; 8] = std::array::from_fn(|l| p[l] + p[l + 8]);
    let r: [f32; 4] = std::array::from_fn(|l| q[l] + q[l + 4]);
    let s = [r[0] + r[2], r[1] + r[3]];
    s[0] + s[1]
}

fn softmax_scalar(x: &mut [f32], fma: impl Fn(f32, f32, f32) -> f32 + Copy) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p = [0f32; 16];
    for (j, v) in x.iter_mut().enumerate() {
        *v = exp_scalar(*v - max, fma);
        p[j % 16] += *v;
    }
    let sum = tree16(&p);
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// x_j <- exp(x_j - max) / sum (see the module doc).
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx512() {
            // SAFETY: the CPU has the features.
            return unsafe { x86::softmax_avx512(x) };
        }
        if x86::has_fma() {
            // SAFETY: as above.
            return unsafe { x86::softmax_fma(x) };
        }
    }
    softmax_scalar(x, f32::mul_add);
}

/// out_i = silu(g_i) * u_i, with silu(x) = x / (1 + exp(-x)) on the shared exp (the same bits
/// whichever version runs).
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(g.len() == u.len() && g.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx512() {
            // SAFETY: the CPU has the features.
            return unsafe { x86::silu_mul_avx512(g, u, out) };
        }
        if x86::has_fma() {
            // SAFETY: as above.
            return unsafe { x86::silu_mul_fma(g, u, out) };
        }
    }
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + exp_scalar(-g, f32::mul_add)) * u;
    }
}

/// uo_i = silu(g_i) * uo_i: `silu_mul` with the up projection read from and the result
/// written to the same slice.
pub fn silu_mul_in_place(g: &[f32], uo: &mut [f32]) {
    assert_eq!(g.len(), uo.len());
    let mut buf = [0f32; 64];
    for (g, uo) in g.chunks(64).zip(uo.chunks_mut(64)) {
        let u = &mut buf[..g.len()];
        u.copy_from_slice(uo);
        silu_mul(g, u, uo);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    pub fn has_avx512() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx512f") && has_fma())
    }
    pub fn has_fma() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2"))
    }

    /// A vector type's operations, so one exp serves 16 and 8 lanes.
    macro_rules! vexp {
        ($name:ident, $v:ty, $vi:ty, $set1:ident, $mul:ident, $add:ident, $sub:ident, $fmadd:ident,
         $fnmadd:ident, $cvt:ident, $min:ident, $max:ident, $set1i:ident, $addi:ident, $slli:ident,
         $cast:ident, $setz:ident, $cmplt:expr, $min_ps:ident, $max_ps:ident, $feat:literal) => {
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn $name(x: $v) -> $v {
                // The scalar clamp: max/min return their second operand when one is NaN.
                let x = $min_ps($set1(HIGH), $max_ps($set1(LOW - 17.0), x));
                let t = $add($mul(x, $set1(LOG2E)), $set1(ROUND));
                let n = $sub(t, $set1(ROUND));
                let r = $fnmadd(n, $set1(LN2_HI), x);
                let r = $fnmadd(n, $set1(LN2_LO), r);
                let mut p = $set1(C[0]);
                for &c in &C[1..] {
                    p = $fmadd(p, r, $set1(c));
                }
                p = $fmadd(p, r, $set1(1.0));
                p = $fmadd(p, r, $set1(1.0));
                // n is integral, so the conversion is exact; clamp as the scalar version.
                let ni = $min($max($cvt(n), $set1i(-126)), $set1i(128));
                let bits = $slli($addi(ni, $set1i(127)), 23);
                // ni == 128 gives exponent 255 with a zero mantissa: +inf, as the scalar version.
                let e = $mul(p, $cast(bits));
                $cmplt(x, e, $setz())
            }
        };
    }

    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn low512(x: __m512, e: __m512, z: __m512) -> __m512 {
        let m = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(LOW));
        _mm512_mask_blend_ps(m, e, z)
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn low256(x: __m256, e: __m256, z: __m256) -> __m256 {
        let m = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LOW));
        _mm256_blendv_ps(e, z, m)
    }

    vexp!(
        exp512,
        __m512,
        __m512i,
        _mm512_set1_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_fmadd_ps,
        _mm512_fnmadd_ps,
        _mm512_cvtps_epi32,
        _mm512_min_epi32,
        _mm512_max_epi32,
        _mm512_set1_epi32,
        _mm512_add_epi32,
        _mm512_slli_epi32,
        _mm512_castsi512_ps,
        _mm512_setzero_ps,
        low512,
        _mm512_min_ps,
        _mm512_max_ps,
        "avx512f,fma"
    );
    vexp!(
        exp256,
        __m256,
        __m256i,
        _mm256_set1_ps,
        _mm256_mul_ps,
        _mm256_add_ps,
        _mm256_sub_ps,
        _mm256_fmadd_ps,
        _mm256_fnmadd_ps,
        _mm256_cvtps_epi32,
        _mm256_min_epi32,
        _mm256_max_epi32,
        _mm256_set1_epi32,
        _mm256_add_epi32,
        _mm256_slli_epi32,
        _mm256_castsi256_ps,
        _mm256_setzero_ps,
        low256,
        _mm256_min_ps,
        _mm256_max_ps,
        "avx2,fma"
    );

    /// Lanes 8..16 of x.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn hi256(x: __m512) -> __m256 {
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn softmax_avx512(x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let tail = |i: usize| -> __mmask16 {
            if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            }
        };
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..n).step_by(16) {
            let v = _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), tail(i), p.add(i));
            m = _mm512_max_ps(m, v);
        }
        // The scalar fold's max (max is exact; with no NaN the order does not matter), across
        // the lanes in registers.
        let m8 = _mm256_max_ps(_mm512_castps512_ps256(m), hi256(m));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
        let mv = _mm512_broadcastss_ps(m1);
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            let k = tail(i);
            let v = _mm512_maskz_loadu_ps(k, p.add(i));
            let e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(v, mv)));
            _mm512_mask_storeu_ps(p.add(i), k, e);
            acc = _mm512_add_ps(acc, e);
        }
        // `tree16` in registers: l + l+8, then m + m+4, then [0+2, 1+3], then 0+1.
        let s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi256(acc));
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
        let sv = _mm512_broadcastss_ps(s1);
        for i in (0..n).step_by(16) {
            let k = tail(i);
            let v = _mm512_maskz_loadu_ps(k, p.add(i));
            _mm512_mask_storeu_ps(p.add(i), k, _mm512_div_ps(v, sv));
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn silu_mul_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = g.len();
        let one = _mm512_set1_ps(1.0);
        for i in (0..n).step_by(16) {
            let k: __mmask16 = if n - i >= 16 {
                0xffff
            } else {
                (1u16 << (n - i)) - 1
            };
            let gv = _mm512_maskz_loadu_ps(k, g.as_ptr().add(i));
            let uv = _mm512_maskz_loadu_ps(k, u.as_ptr().add(i));
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            let s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), k, _mm512_mul_ps(s, uv));
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul_fma(g: &[f32], u: &[f32], out: &mut [f32]) {
        let n = g.len();
        let one = _mm256_set1_ps(1.0);
        let (mut gb, mut ub) = ([0f32; 8], [0f32; 8]);
        for i in (0..n).step_by(8) {
            let len = (n - i).min(8);
            gb[..len].copy_from_slice(&g[i..i + len]);
            ub[..len].copy_from_slice(&u[i..i + len]);
            let gv = _mm256_loadu_ps(gb.as_ptr());
            let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(
                gb.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(ub.as_ptr())),
            );
            out[i..i + len].copy_from_slice(&gb[..len]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_fma(x: &mut [f32]) {
        let n = x.len();
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mv = _mm256_set1_ps(max);
        // Partial sums 0..8 and 8..16: the same 16 partials as the AVX-512 version.
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut buf = [0f32; 8];
        for i in (0..n).step_by(8) {
            let len = (n - i).min(8);
            buf[..len].copy_from_slice(&x[i..i + len]);
            let v = _mm256_loadu_ps(buf.as_ptr());
            let e = exp256(_mm256_sub_ps(v, mv));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
            buf[len..].fill(0.0);
            x[i..i + len].copy_from_slice(&buf[..len]);
            let a = &mut acc[(i / 8) % 2];
            *a = _mm256_add_ps(*a, _mm256_loadu_ps(buf.as_ptr()));
        }
        let mut lanes = [0f32; 16];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        let sum = tree16(&lanes);
        for v in x.iter_mut() {
            *v /= sum;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn vector_exps_equal_the_scalar_exp() {
            if !has_avx512() {
                return;
            }
            let fma = |a: f32, b: f32, c: f32| a.mul_add(b, c);
            let mut x = -100.0f32;
            while x < 1.0 {
                let xs: [f32; 16] = std::array::from_fn(|l| x + l as f32 * 1e-3);
                let mut got = [0f32; 16];
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp512(_mm512_loadu_ps(xs.as_ptr()))) };
                let mut got8 = [0f32; 16];
                unsafe {
                    _mm256_storeu_ps(got8.as_mut_ptr(), exp256(_mm256_loadu_ps(xs.as_ptr())));
                    _mm256_storeu_ps(
                        got8.as_mut_ptr().add(8),
                        exp256(_mm256_loadu_ps(xs.as_ptr().add(8))),
                    );
                }
                for l in 0..16 {
                    let want = exp_scalar(xs[l], fma);
                    assert_eq!(got[l].to_bits(), want.to_bits(), "exp({})", xs[l]);
                    assert_eq!(got8[l].to_bits(), want.to_bits(), "exp({})", xs[l]);
                    if xs[l] >= LOW {
                        let exact = (xs[l] as f64).exp();
                        let err = ((want as f64 - exact) / exact).abs();
                        assert!(err < 2.5e-7, "exp({}) = {want}, {exact}: {err}", xs[l]);
                    }
                }
                x += 0.0137;
            }
        }

        #[test]
        fn every_silu_version_gives_the_same_bits() {
            if !has_avx512() {
                return;
            }
            let g: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.37).collect();
            let u: Vec<f32> = (0..1001).map(|i| 1.0 + i as f32 * 1e-3).collect();
            let (mut a, mut b) = (vec![0f32; g.len()], vec![0f32; g.len()]);
            unsafe {
                silu_mul_avx512(&g, &u, &mut a);
                silu_mul_fma(&g, &u, &mut b);
            }
            for i in 0..g.len() {
                let want = g[i] / (1.0 + exp_scalar(-g[i], f32::mul_add)) * u[i];
                assert_eq!(a[i].to_bits(), want.to_bits(), "silu({})", g[i]);
                assert_eq!(b[i].to_bits(), want.to_bits(), "silu({})", g[i]);
                let exact = g[i] as f64 / (1.0 + (-g[i] as f64).exp()) * u[i] as f64;
                assert!(
                    (want as f64 - exact).abs() <= 1e-6 * exact.abs().max(1e-30),
                    "silu({})",
                    g[i]
                );
            }
        }

        #[test]
        fn every_softmax_version_gives_the_same_bits() {
            if !has_avx512() {
                return;
            }
            let mut s = 0x9e37_79b9u32;
            for n in [1usize, 2, 7, 8, 15, 16, 17, 31, 33, 100, 513] {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        (s >> 8) as f32 / (1 << 24) as f32 * 40.0 - 20.0
                    })
                    .collect();
                let (mut a, mut b, mut c) = (x.clone(), x.clone(), x.clone());
                unsafe {
                    softmax_avx512(&mut a);
                    softmax_fma(&mut b);
                }
                softmax_scalar(&mut c, f32::mul_add);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&c), "n = {n}");
                assert_eq!(bits(&b), bits(&c), "n = {n}");
                let sum: f32 = c.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5);
            }
        }
    }
}
