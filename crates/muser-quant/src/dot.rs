//! Scalar reference dot products: each weight format against the activation format its fast
//! kernel uses. Short and obviously right; the SIMD kernels in `simd` are tested against these.
//!
//! The float dots accumulate in f64 (as ggml's scalar `ggml_vec_dot_f32` does with
//! `ggml_float`). The quantized dots compute, per block, exact integer sums per sub-block, scale
//! them by the sub-block scales as integers, and only then convert: one f32 multiply-add per block
//! (ggml's `vec_dot_*_generic` in concept). The slices must hold the same number of blocks
//! (values); callers (`row.rs`) check lengths, and a mismatch here panics with a message.

use crate::blocks::*;
use half::{bf16, f16};

fn check_len(what: &str, a: usize, b: usize) {
    assert_eq!(
        a, b,
        "{what}: weight and activation lengths differ ({a} vs {b})"
    );
}

pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    check_len("vec_dot_f32", x.len(), y.len());
    x.iter()
        .zip(y)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum::<f64>() as f32
}

pub fn vec_dot_f16_f32(x: &[f16], y: &[f32]) -> f32 {
    check_len("vec_dot_f16_f32", x.len(), y.len());
    x.iter()
        .zip(y)
        .map(|(&a, &b)| a.to_f64() * b as f64)
        .sum::<f64>() as f32
}

pub fn vec_dot_bf16_f32(x: &[bf16], y: &[f32]) -> f32 {
    check_len("vec_dot_bf16_f32", x.len(), y.len());
    x.iter()
        .zip(y)
        .map(|(&a, &b)| a.to_f64() * b as f64)
        .sum::<f64>() as f32
}

/// sum over blocks of `d_x * d_y * sum(qx * qy)`.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    check_len("vec_dot_q8_0_q8_0", x.len(), y.len());
    q8_0_blocks_add(0.0, x, y)
}

/// `sum` plus, block by block in order, `sum(qx * qy) * (d_x * d_y)` (f32, one rounding per
/// step): the scalar dot, and the tail of the SIMD ones (blocks past their last full step).
pub fn q8_0_blocks_add(mut sum: f32, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    for (bx, by) in x.iter().zip(y) {
        let sumi: i32 = bx
            .qs
            .iter()
            .zip(&by.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
        sum += sumi as f32 * (bx.d.to_f32() * by.d.to_f32());
    }
    sum
}

/// Per block: `d_y * (d * sum_j sc_j * sum(q * q8) - dmin * sum_j m_j * sum(q8 of sub-block j))`,
/// the second sum taken from the Q8_K `bsums`.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    check_len("vec_dot_q4_k_q8_k", x.len(), y.len());
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (sumi, summ) = k_sums(&bx.scales, by, |i| bx.quant(i) as i32);
        sum += by.d * bx.d.to_f32() * sumi as f32 - by.d * bx.dmin.to_f32() * summ as f32;
    }
    sum
}

/// As Q4_K with 5-bit quants.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    check_len("vec_dot_q5_k_q8_k", x.len(), y.len());
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (sumi, summ) = k_sums(&bx.scales, by, |i| bx.quant(i) as i32);
        sum += by.d * bx.d.to_f32() * sumi as f32 - by.d * bx.dmin.to_f32() * summ as f32;
    }
    sum
}

/// Per block: `d_y * d * sum_j sc_j * sum((q - 32) * q8)` over 16 sub-blocks of 16.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    check_len("vec_dot_q6_k_q8_k", x.len(), y.len());
    let mut sum = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            let sub: i32 = (16 * j..16 * j + 16)
                .map(|i| (bx.quant(i) as i32 - 32) * by.qs[i] as i32)
                .sum();
            sumi += bx.scales[j] as i32 * sub;
        }
        sum += by.d * bx.d.to_f32() * sumi as f32;
    }
    sum
}

/// For Q4_K/Q5_K: (sum_j sc_j * sum_{i in j} q_i * q8_i, sum_j m_j * sum_{i in j} q8_i), eight
/// sub-blocks of 32; the second from the Q8_K block sums (two per sub-block).
fn k_sums(scales: &[u8; 12], y: &BlockQ8K, quant: impl Fn(usize) -> i32) -> (i32, i32) {
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, scales);
        let sub: i32 = (32 * j..32 * j + 32)
            .map(|i| quant(i) * y.qs[i] as i32)
            .sum();
        sumi += sc as i32 * sub;
        summ += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    (sumi, summ)
}
