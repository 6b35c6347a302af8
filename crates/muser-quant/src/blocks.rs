//! `#[repr(C)]` block structs, byte-for-byte ggml's (ggml-common.h), with compile-time size checks.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Values per Q8_0 block.
pub const QK8_0: usize = 32;

/// Q8_0: 32 values, `d * qs[i]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}

/// Q4_K: 256 values in 8 sub-blocks of 32, `d * sc_j * q - dmin * m_j`, q in 0..15.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed (see SPEC section 8).
    pub scales: [u8; 12],
    /// Per 64 values, 32 bytes: byte l holds value l (low nibble) and l + 32 (high nibble).
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as Q4_K with a fifth bit per value in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 values in 16 sub-blocks of 16, `d * sc_j * (q - 32)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// Q8_K: the activation format of the K-quant dots. `d` is f32; `bsums[j]` is the sum of
/// quants 16j..16j+16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// Sub-block `j` (0..8) of a Q4_K/Q5_K `scales` array: its 6-bit (scale, min), as ggml's
/// `get_scale_min_k4` unpacks them.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl BlockQ5K {
    /// Quant `i` (0..256), 0..=31, from its low nibble in `qs` and its fifth bit in `qh`.
    #[inline]
    pub fn quant(&self, i: usize) -> u8 {
        let (group, l) = (i / 64, i % 64);
        let byte = self.qs[32 * group + l % 32];
        let low = if l < 32 { byte & 0xF } else { byte >> 4 };
        let bit = 2 * group + l / 32;
        low | (((self.qh[l % 32] >> bit) & 1) << 4)
    }
}

impl BlockQ4K {
    /// Quant `i` (0..256), 0..=15.
    #[inline]
    pub fn quant(&self, i: usize) -> u8 {
        let (group, l) = (i / 64, i % 64);
        let byte = self.qs[32 * group + l % 32];
        if l < 32 {
            byte & 0xF
        } else {
            byte >> 4
        }
    }
}

impl BlockQ6K {
    /// Quant `i` (0..256), 0..=63 (the value is `q - 32`).
    #[inline]
    pub fn quant(&self, i: usize) -> u8 {
        let (half, l) = (i / 128, i % 128);
        let ql = &self.ql[64 * half..64 * half + 64];
        let qh = &self.qh[32 * half..32 * half + 32];
        // l in 0..32 -> ql[l] low, 32..64 -> ql[l] low (ql[l-32+32]), 64..96 -> ql[l-64] high,
        // 96..128 -> ql[l-64] high; the high two bits are pair l/32 of qh[l % 32].
        let low = if l < 64 { ql[l] & 0xF } else { ql[l - 64] >> 4 };
        let high = (qh[l % 32] >> (2 * (l / 32))) & 3;
        low | (high << 4)
    }
}
