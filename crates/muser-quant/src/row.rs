//! Type-dispatched row operations on raw bytes (as they come from a GGUF tensor): dequantize,
//! quantize, and dot against a quantized activation.
//!
//! Every length is checked here and reported as a typed error; the kernels below this layer may
//! assume matching lengths. Byte slices are viewed as block slices without copying when they
//! are aligned (`bytemuck::try_cast_slice`), and copied into an aligned buffer when not (the
//! f16/f32 fields of a block need 2- or 4-byte alignment; a GGUF mapping usually provides it).

use crate::blocks::*;
use crate::simd::Kernels;
use crate::{dequant, quantize, GgmlType};
use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use std::borrow::Cow;

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported by Muser (supported: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K)")]
    Unsupported(GgmlType),
    #[error("{ty}: a row of {n} values is not a multiple of the block size {block}")]
    RowLength {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: {n} values need {expected} bytes, got {got}")]
    ByteLength {
        ty: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("{ty} weights are dotted with a {expected} activation, got a {got} one")]
    ActivationType {
        ty: GgmlType,
        expected: GgmlType,
        got: GgmlType,
    },
}

/// An activation row quantized once for the dot kernels of one weight type.
#[derive(Clone, Debug)]
pub enum Activation {
    F32(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>),
    Q8K(Vec<BlockQ8K>),
}

impl Activation {
    /// The activation's type (F32, Q8_0 or Q8_K).
    pub fn ggml_type(&self) -> GgmlType {
        match self {
            Activation::F32(_) => GgmlType::F32,
            Activation::Q8_0(_) => GgmlType::Q8_0,
            Activation::Q8K(_) => GgmlType::Q8_K,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Activation::F32(v) => v.len(),
            Activation::Q8_0(v) => v.len() * QK8_0,
            Activation::Q8K(v) => v.len() * QK_K,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The activation format the dot kernel of weight type `ty` consumes (F32, Q8_0 or Q8_K).
pub fn activation_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => Ok(F32),
        Q8_0 => Ok(Q8_0),
        Q4_K | Q5_K | Q6_K => Ok(Q8_K),
        other => Err(QuantError::Unsupported(other)),
    }
}

/// Checks that `n` values of `ty` fill whole blocks and that `got` is exactly their byte count.
fn check_bytes(ty: GgmlType, n: usize, got: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::RowLength { ty, n, block });
    }
    let expected = n / block * ty.type_size();
    if got != expected {
        return Err(QuantError::ByteLength {
            ty,
            n,
            expected,
            got,
        });
    }
    Ok(())
}

/// Views `bytes` as `T`s, copying when the slice is misaligned. The length must be a multiple
/// of `size_of::<T>()` (checked by the callers).
fn view<T: Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(copy_aligned(bytes)),
    }
}

/// Copies `bytes` (a whole number of `T`s) into a freshly allocated, aligned `Vec<T>`.
fn copy_aligned<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

/// Dequantizes `src` (the bytes of `dst.len()` values of type `ty`) into `dst`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q8_0 | Q4_K | Q5_K | Q6_K | Q8_K => {}
        other => return Err(QuantError::Unsupported(other)),
    }
    check_bytes(ty, dst.len(), src.len())?;
    match ty {
        F32 => dst.copy_from_slice(&view::<f32>(src)),
        F16 => dequant::dequantize_row_f16(&view::<f16>(src), dst),
        BF16 => dequant::dequantize_row_bf16(&view::<bf16>(src), dst),
        Q8_0 => dequant::dequantize_row_q8_0(&view::<BlockQ8_0>(src), dst),
        Q4_K => dequant::dequantize_row_q4_k(&view::<BlockQ4K>(src), dst),
        Q5_K => dequant::dequantize_row_q5_k(&view::<BlockQ5K>(src), dst),
        Q6_K => dequant::dequantize_row_q6_k(&view::<BlockQ6K>(src), dst),
        Q8_K => dequant::dequantize_row_q8_k(&view::<BlockQ8K>(src), dst),
        _ => unreachable!("filtered above"),
    }
    Ok(())
}

/// Runs `f` on `dst` viewed as `T`s; when `dst` is misaligned, on an aligned buffer that is
/// copied back afterwards.
fn with_blocks_mut<T: Pod>(dst: &mut [u8], f: impl FnOnce(&mut [T])) {
    match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut tmp: Vec<T> = copy_aligned(dst);
            f(&mut tmp);
            dst.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
}

/// Quantizes `src` into `dst` (exactly `ty.row_bytes(src.len())` bytes) with the reference
/// quantizer of `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 | Q8_0 | Q4_K | Q5_K | Q6_K | Q8_K => {}
        other => return Err(QuantError::Unsupported(other)),
    }
    check_bytes(ty, src.len(), dst.len())?;
    match ty {
        F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        F16 => with_blocks_mut(dst, |y| quantize::quantize_row_f16(src, y)),
        BF16 => with_blocks_mut(dst, |y| quantize::quantize_row_bf16(src, y)),
        Q8_0 => with_blocks_mut(dst, |y| quantize::quantize_row_q8_0_ref(src, y)),
        Q4_K => with_blocks_mut(dst, |y| quantize::quantize_row_q4_k_ref(src, y)),
        Q5_K => with_blocks_mut(dst, |y| quantize::quantize_row_q5_k_ref(src, y)),
        Q6_K => with_blocks_mut(dst, |y| quantize::quantize_row_q6_k_ref(src, y)),
        Q8_K => with_blocks_mut(dst, |y| quantize::quantize_row_q8_k_ref(src, y)),
        _ => unreachable!("filtered above"),
    }
    Ok(())
}

/// Quantizes an activation row for the dot kernels of weight type `ty`.
pub fn quantize_activation(ty: GgmlType, x: &[f32]) -> Result<Activation, QuantError> {
    let act_ty = activation_type(ty)?;
    let block = act_ty.block_size();
    if !x.len().is_multiple_of(block) {
        return Err(QuantError::RowLength {
            ty: act_ty,
            n: x.len(),
            block,
        });
    }
    Ok(match act_ty {
        GgmlType::Q8_0 => {
            let mut y = vec![BlockQ8_0::zeroed(); x.len() / QK8_0];
            quantize::quantize_row_q8_0_ref(x, &mut y);
            Activation::Q8_0(y)
        }
        GgmlType::Q8_K => {
            let mut y = vec![BlockQ8K::zeroed(); x.len() / QK_K];
            quantize::quantize_row_q8_k_ref(x, &mut y);
            Activation::Q8K(y)
        }
        _ => Activation::F32(x.to_vec()),
    })
}

/// Dot of one weight row (raw bytes of type `ty`) with an activation quantized for `ty`, using
/// the detected SIMD kernels.
pub fn dot_row(ty: GgmlType, w: &[u8], act: &Activation) -> Result<f32, QuantError> {
    let act_ty = activation_type(ty)?;
    if act.ggml_type() != act_ty {
        return Err(QuantError::ActivationType {
            ty,
            expected: act_ty,
            got: act.ggml_type(),
        });
    }
    check_bytes(ty, act.len(), w.len())?;
    let k = Kernels::detect();
    use GgmlType::*;
    Ok(match (ty, act) {
        (F32, Activation::F32(a)) => (k.dot_f32)(&view::<f32>(w), a),
        (F16, Activation::F32(a)) => (k.dot_f16_f32)(&view::<f16>(w), a),
        (BF16, Activation::F32(a)) => (k.dot_bf16_f32)(&view::<bf16>(w), a),
        (Q8_0, Activation::Q8_0(a)) => (k.dot_q8_0_q8_0)(&view::<BlockQ8_0>(w), a),
        (Q4_K, Activation::Q8K(a)) => (k.dot_q4_k_q8_k)(&view::<BlockQ4K>(w), a),
        (Q5_K, Activation::Q8K(a)) => (k.dot_q5_k_q8_k)(&view::<BlockQ5K>(w), a),
        (Q6_K, Activation::Q8K(a)) => (k.dot_q6_k_q8_k)(&view::<BlockQ6K>(w), a),
        _ => unreachable!("activation type checked above"),
    })
}
