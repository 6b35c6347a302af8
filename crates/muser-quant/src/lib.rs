//! The weight and activation block formats, bit-exact with ggml: block structs, dequantization,
//! the reference quantizers (ggml's `quantize_row_*_ref` algorithms), the scalar reference dot
//! products, and the x86 SIMD dot kernels chosen at run time.
//!
//! Weight formats: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K. Activation formats: Q8_K (for the
//! K-quants), Q8_0 (for Q8_0), f32 (for the float formats).
//!
//! This crate never allocates on a hot path and never knows about files or models.

pub mod blocks;
pub mod dequant;
pub mod dot;
pub mod quantize;
pub mod simd;

mod row;
pub use row::{
    activation_type, dequantize_row, dot_row, quantize_activation, quantize_row, Activation,
    QuantError,
};

pub use blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, BlockQ8_0, QK8_0, QK_K};
pub use muser_gguf::GgmlType;
