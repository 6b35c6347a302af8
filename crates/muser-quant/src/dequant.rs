//! Dequantization of one row per format, bit-exact with ggml's `dequantize_row_*`.

use crate::blocks::*;
use half::{bf16, f16};

pub fn dequantize_row_f16(x: &[f16], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_bf16(x: &[bf16], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    let _ = (x, y);
    todo!()
}
