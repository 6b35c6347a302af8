//! Scalar reference dot products: each weight format against the activation format its fast
//! kernel uses. Short and obviously right; the SIMD kernels in `simd` are tested against these.

use crate::blocks::*;
use half::{bf16, f16};

pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_f16_f32(x: &[f16], y: &[f32]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_bf16_f32(x: &[bf16], y: &[f32]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let _ = (x, y);
    todo!()
}
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let _ = (x, y);
    todo!()
}
