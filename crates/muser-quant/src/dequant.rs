//! Dequantization of one row per format, bit-exact with ggml's `dequantize_row_*`: the same f32
//! operations in the same order (e.g. Q4_K forms `d * sc` and `dmin * m` as f32 first, then
//! `y = d1 * q - m1`; Rust never fuses a multiply and an add, and neither does ggml's portable C).
//!
//! `y` must hold exactly the values of `x` (blocks * block size); a mismatch panics with a
//! message. `row.rs` checks lengths and returns typed errors before calling these.

use crate::blocks::*;
use half::{bf16, f16};

fn check_len(what: &str, values: usize, out: usize) {
    assert_eq!(
        values, out,
        "{what}: input holds {values} values, output has room for {out}"
    );
}

pub fn dequantize_row_f16(x: &[f16], y: &mut [f32]) {
    check_len("dequantize_row_f16", x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

pub fn dequantize_row_bf16(x: &[bf16], y: &mut [f32]) {
    check_len("dequantize_row_bf16", x.len(), y.len());
    for (o, &v) in y.iter_mut().zip(x) {
        // bf16 is the top half of an f32: exact, NaN payloads kept.
        *o = f32::from_bits((v.to_bits() as u32) << 16);
    }
}

pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    check_len("dequantize_row_q8_0", x.len() * QK8_0, y.len());
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = b.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    check_len("dequantize_row_q4_k", x.len() * QK_K, y.len());
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            for (i, o) in out.iter_mut().enumerate().skip(32 * j).take(32) {
                *o = d1 * b.quant(i) as f32 - m1;
            }
        }
    }
}

pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    check_len("dequantize_row_q5_k", x.len() * QK_K, y.len());
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        for j in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(j, &b.scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            for (i, o) in out.iter_mut().enumerate().skip(32 * j).take(32) {
                *o = d1 * b.quant(i) as f32 - m1;
            }
        }
    }
}

pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    check_len("dequantize_row_q6_k", x.len() * QK_K, y.len());
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (i, o) in out.iter_mut().enumerate() {
            // ggml: d * sc * q, evaluated left to right.
            *o = d * b.scales[i / 16] as f32 * (b.quant(i) as i32 - 32) as f32;
        }
    }
}

pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    check_len("dequantize_row_q8_k", x.len() * QK_K, y.len());
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}
