//! Type-dispatched row operations on raw bytes (as they come from a GGUF tensor): dequantize,
//! quantize, and dot against a quantized activation.

use crate::blocks::*;
use crate::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported by Muser (supported: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K)")]
    Unsupported(GgmlType),
    #[error("{ty}: a row of {n} values is not a multiple of the block size {block}")]
    RowLength { ty: GgmlType, n: usize, block: usize },
    #[error("{ty}: {n} values need {expected} bytes, got {got}")]
    ByteLength { ty: GgmlType, n: usize, expected: usize, got: usize },
}

/// An activation row quantized once for the dot kernels of one weight type.
#[derive(Clone, Debug)]
pub enum Activation {
    F32(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>),
    Q8K(Vec<BlockQ8K>),
}

/// The activation format the dot kernel of weight type `ty` consumes (F32, Q8_0 or Q8_K).
pub fn activation_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    let _ = ty;
    todo!()
}

/// Dequantizes `src` (the bytes of `dst.len()` values of type `ty`) into `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// Quantizes `src` into `dst` (exactly `ty.row_bytes(src.len())` bytes) with the reference
/// quantizer of `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// Quantizes an activation row for the dot kernels of weight type `ty`.
pub fn quantize_activation(ty: GgmlType, x: &[f32]) -> Result<Activation, QuantError> {
    let _ = (ty, x);
    todo!()
}

/// Dot of one weight row (raw bytes of type `ty`) with an activation quantized for `ty`, using
/// the detected SIMD kernels.
pub fn dot_row(ty: GgmlType, w: &[u8], act: &Activation) -> Result<f32, QuantError> {
    let _ = (ty, w, act);
    todo!()
}
