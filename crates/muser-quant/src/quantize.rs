//! Reference quantizers following ggml's `quantize_row_*_ref` algorithms step by step, so a file
//! quantized here carries the same bytes as one `llama-quantize --pure` makes.

use crate::blocks::*;
use half::{bf16, f16};

pub fn quantize_row_f16(x: &[f32], y: &mut [f16]) {
    let _ = (x, y);
    todo!()
}
/// ggml's f32 -> bf16 (round to nearest even, NaN kept quiet).
pub fn quantize_row_bf16(x: &[f32], y: &mut [bf16]) {
    let _ = (x, y);
    todo!()
}
pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    let _ = (x, y);
    todo!()
}
pub fn quantize_row_q4_k_ref(x: &[f32], y: &mut [BlockQ4K]) {
    let _ = (x, y);
    todo!()
}
pub fn quantize_row_q5_k_ref(x: &[f32], y: &mut [BlockQ5K]) {
    let _ = (x, y);
    todo!()
}
pub fn quantize_row_q6_k_ref(x: &[f32], y: &mut [BlockQ6K]) {
    let _ = (x, y);
    todo!()
}
/// Activation quantization (ggml's `quantize_row_q8_K_ref`), bsums included.
pub fn quantize_row_q8_k_ref(x: &[f32], y: &mut [BlockQ8K]) {
    let _ = (x, y);
    todo!()
}
