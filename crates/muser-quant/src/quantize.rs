//! Reference quantizers following ggml's `quantize_row_*_ref` algorithms step by step, so a file
//! quantized here carries the same bytes as one `llama-quantize --pure` makes.
//!
//! Bit-exactness rests on doing the same IEEE f32 operations in the same order as ggml's C
//! (compiled without FMA contraction: ggml-quants.c lives in ggml-base, built for the baseline
//! ISA): every intermediate below is f32 unless marked, int -> f32 conversions happen where C's
//! usual arithmetic conversions put them, and sums run in index order. Comments name the ggml
//! function each step mirrors. `y` must hold exactly the blocks of `x`; a mismatch panics with a
//! message (`row.rs` checks lengths and returns typed errors first).

use crate::blocks::*;
use half::{bf16, f16};

/// ggml's `GROUP_MAX_EPS`: a group whose largest |value| is below this quantizes to zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

fn check_len(what: &str, values: usize, blocks: usize, block: usize) {
    assert_eq!(
        values,
        blocks * block,
        "{what}: {values} input values for {blocks} output blocks of {block}"
    );
}

/// ggml's `nearest_int`: adding 1.5 * 2^23 pushes the fraction bits out of an f32's mantissa, so
/// the FPU's own rounding (to nearest, ties to even) does the work; the low 22 mantissa bits then
/// hold the integer plus 2^22. Exact for |x| <= 4194303; outside that (and for NaN) it returns
/// the same garbage ggml's does, bit for bit.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0f32;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `GGML_FP32_TO_FP16`: IEEE round to nearest even (as `half`), but every NaN becomes the
/// canonical quiet NaN 0x7E00 with its sign, as ggml's bit-trick conversion produces.
#[inline]
pub fn fp32_to_fp16(x: f32) -> f16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        f16::from_bits(sign | 0x7E00)
    } else {
        f16::from_f32(x)
    }
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even on the bits; a NaN keeps its top 16 bits
/// with the quiet bit forced.
#[inline]
pub fn fp32_to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

pub fn quantize_row_f16(x: &[f32], y: &mut [f16]) {
    check_len("quantize_row_f16", x.len(), y.len(), 1);
    for (o, &v) in y.iter_mut().zip(x) {
        *o = fp32_to_fp16(v);
    }
}

/// ggml's f32 -> bf16 (round to nearest even, NaN kept quiet).
pub fn quantize_row_bf16(x: &[f32], y: &mut [bf16]) {
    check_len("quantize_row_bf16", x.len(), y.len(), 1);
    for (o, &v) in y.iter_mut().zip(x) {
        *o = fp32_to_bf16(v);
    }
}

/// ggml's C `MAX(a, b)`: `a > b ? a : b` (so a NaN `b` wins, a NaN `a` loses).
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// C's `int8_t q = f` as x86 code compiled from ggml runs it: exact for -128..=127; outside
/// (undefined in C) the conversion to int32 yields 0x80000000 for NaN, infinities and
/// out-of-range values, and the store keeps the low byte. Only reachable in Q8_0 when a block's
/// max is so small (below ~1e-36) that 1/d overflows to infinity; d is then 0 in f16 anyway.
#[inline]
fn c_float_to_i8(f: f32) -> i8 {
    let i = if f.is_finite() && (-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    };
    i as i8
}

pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    check_len("quantize_row_q8_0_ref", x.len(), y.len(), QK8_0);
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK8_0)) {
        let amax = xs.iter().fold(0.0f32, |m, &v| c_max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = fp32_to_fp16(d);
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            // C `roundf` (halves away from zero) = Rust `f32::round`.
            *q = c_float_to_i8((v * id).round());
        }
    }
}

/// ggml's `make_qkx2_quants`: an asymmetric (scale, min) fit of `x` with weights, trying
/// `nstep + 1` scales around `nmax / (max - min)` and keeping the best weighted squared error.
/// Writes the levels to `l` (0..=nmax) and returns (scale, the_min) where value ~ scale * l - the_min.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` as Q6_K calls it (`rmse_type` 1, `qw` NULL): a symmetric fit of
/// `x` to levels -nmax..nmax-1 (stored as l + nmax), trying 18 scales around `-nmax / max`
/// (max = the signed value of largest magnitude) and keeping the best by the weighted
/// least-squares criterion with weights x^2.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let weight = |v: f32| v * v;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(x[i]);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in &x[..n] {
            let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            let w = weight(xi);
            let lf = l as f32;
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Packs eight 6-bit (scale, min) pairs into Q4_K/Q5_K's 12 bytes (inverse of `scale_min_k4`).
fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The shared body of `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` for one super-block:
/// per sub-block of 32 a `make_qkx2_quants` fit with weights `av_x + |x|`; scales and mins
/// quantized to 6 bits against their maxima; d and dmin rounded to f16; then every value
/// re-quantized against the f16-rounded effective scale and min. Returns (d, dmin, scales,
/// levels 0..=nmax).
fn quantize_k_superblock(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0.0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            rdelta,
            nstep,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        // C: `uint8_t ls = nearest_int(...)` truncates to 8 bits before the MIN with 63.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scales_k4(&ls, &lm);
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            // ggml keeps the levels of the sub-block fit here.
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

pub fn quantize_row_q4_k_ref(x: &[f32], y: &mut [BlockQ4K]) {
    check_len("quantize_row_q4_k_ref", x.len(), y.len(), QK_K);
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (d, dmin, scales, l) = quantize_k_superblock(xs, 15, -1.0, 0.1, 20);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        for g in 0..QK_K / 64 {
            for i in 0..32 {
                b.qs[32 * g + i] = l[64 * g + i] | (l[64 * g + i + 32] << 4);
            }
        }
    }
}

pub fn quantize_row_q5_k_ref(x: &[f32], y: &mut [BlockQ5K]) {
    check_len("quantize_row_q5_k_ref", x.len(), y.len(), QK_K);
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (d, dmin, scales, l) = quantize_k_superblock(xs, 31, -0.5, 0.1, 15);
        b.d = d;
        b.dmin = dmin;
        b.scales = scales;
        b.qh = [0; QK_K / 8];
        for g in 0..QK_K / 64 {
            for i in 0..32 {
                let (lo, hi) = (l[64 * g + i], l[64 * g + i + 32]);
                b.qs[32 * g + i] = (lo & 0xF) | ((hi & 0xF) << 4);
                b.qh[i] |= ((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1));
            }
        }
    }
}

pub fn quantize_row_q6_k_ref(x: &[f32], y: &mut [BlockQ6K]) {
    check_len("quantize_row_q6_k_ref", x.len(), y.len(), QK_K);
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        // Levels are stored as l + 32 (0..=63).
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; QK_K / 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(
                32,
                &xs[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
            );
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        b.d = fp32_to_fp16(1.0 / iscale);
        for (bs, &s) in b.scales.iter_mut().zip(&scales) {
            *bs = nearest_int(iscale * s).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = b.d.to_f32() * b.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(xs[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..QK_K / 128 {
            let (ql, qh) = (
                &mut b.ql[64 * h..64 * h + 64],
                &mut b.qh[32 * h..32 * h + 32],
            );
            let lv = |k: usize| l[128 * h + k] as u8;
            for i in 0..32 {
                ql[i] = (lv(i) & 0xF) | ((lv(i + 64) & 0xF) << 4);
                ql[i + 32] = (lv(i + 32) & 0xF) | ((lv(i + 96) & 0xF) << 4);
                qh[i] = (lv(i) >> 4)
                    | ((lv(i + 32) >> 4) << 2)
                    | ((lv(i + 64) >> 4) << 4)
                    | ((lv(i + 96) >> 4) << 6);
            }
        }
    }
}

/// Activation quantization (ggml's `quantize_row_q8_K_ref`), bsums included.
pub fn quantize_row_q8_k_ref(x: &[f32], y: &mut [BlockQ8K]) {
    check_len("quantize_row_q8_k_ref", x.len(), y.len(), QK_K);
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves bsums untouched here; zero is what they sum to.
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        // -127, not -128: ggml changed it so that every quant fits the AVX sign tricks.
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            b.bsums[j] = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}
