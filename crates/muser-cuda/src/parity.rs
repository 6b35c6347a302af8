//! Parity of the CUDA kernels with the CPU reference kernels (SPEC section 5): fresh random
//! inputs, NMSE = sum((gpu - cpu)^2) / sum(cpu^2) against the stated thresholds.

use crate::device::{CudaError, Gpu};
use half::f16;
use muser_gguf::GgmlType;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// NMSE threshold for matvec, matmul and attention (SPEC section 5).
pub const MATVEC_NMSE: f64 = 5e-4;
/// NMSE threshold for elementwise ops and norms (SPEC section 5).
pub const ELEMENTWISE_NMSE: f64 = 1e-7;
/// NMSE threshold for whole-model logits (SPEC section 5).
pub const LOGITS_NMSE: f64 = 2e-3;

/// One parity measurement.
#[derive(Debug, Clone)]
pub struct Parity {
    pub kernel: String,
    pub shape: String,
    pub nmse: f64,
    pub threshold: f64,
}

impl Parity {
    /// NaN or one-sided infinities fail; so does an NMSE above the threshold.
    pub fn pass(&self) -> bool {
        self.nmse.is_finite() && self.nmse <= self.threshold
    }
}

/// NMSE of `a` against the reference `b`; NaN when either holds a non-finite value.
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(f64::MIN_POSITIVE)
}

/// Random bytes of a `rows` x `cols` matrix of type `ty` with finite, moderate scales.
pub fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols as u64).expect("row length") as usize;
    let mut out = vec![0u8; rows * row_bytes];
    out.par_chunks_mut(row_bytes)
        .enumerate()
        .for_each(|(r, row)| {
            let mut rng =
                rand::rngs::StdRng::seed_from_u64(seed ^ (r as u64).wrapping_mul(0x9E37_79B9));
            match ty {
                GgmlType::F32 => row
                    .chunks_mut(4)
                    .for_each(|c| c.copy_from_slice(&rng.gen_range(-1.0f32..1.0).to_le_bytes())),
                GgmlType::F16 => row.chunks_mut(2).for_each(|c| {
                    c.copy_from_slice(&f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes())
                }),
                GgmlType::BF16 => row.chunks_mut(2).for_each(|c| {
                    c.copy_from_slice(
                        &half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes(),
                    )
                }),
                _ => {
                    rng.fill(row);
                    let (_, bs) = ty.block_layout();
                    for blk in row.chunks_mut(bs) {
                        let mut scale = |at: usize, rng: &mut rand::rngs::StdRng| {
                            let v = f16::from_f32(rng.gen_range(0.001f32..0.01));
                            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        };
                        match ty {
                            GgmlType::Q8_0 => scale(0, &mut rng),
                            GgmlType::Q4_K | GgmlType::Q5_K => {
                                scale(0, &mut rng);
                                scale(2, &mut rng);
                            }
                            GgmlType::Q6_K => scale(208, &mut rng),
                            _ => unreachable!("random_matrix: unsupported type"),
                        }
                    }
                }
            }
        });
    out
}

/// The CPU reference: each column quantized to the weight type's activation format, each row
/// dotted with muser-quant's kernels. x is [ncols][cols]; the result is [ncols][rows].
pub fn cpu_matvec(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    ncols: usize,
) -> Vec<f32> {
    let row_bytes = ty.row_bytes(cols as u64).expect("row length") as usize;
    let mut y = vec![0f32; ncols * rows];
    for c in 0..ncols {
        let act =
            muser_quant::quantize_activation(ty, &x[c * cols..(c + 1) * cols]).expect("activation");
        y[c * rows..(c + 1) * rows]
            .par_iter_mut()
            .enumerate()
            .for_each(|(r, out)| {
                *out = muser_quant::dot_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &act)
                    .expect("dot");
            });
    }
    y
}

/// Runs the CUDA matvec of `ty` at rows x cols with `ncols` columns against the CPU reference.
pub fn check_matvec(
    gpu: &Gpu,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    ncols: usize,
    seed: u64,
) -> Result<Parity, CudaError> {
    let w = random_matrix(ty, rows, cols, seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(1));
    let x: Vec<f32> = (0..ncols * cols)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let reference = cpu_matvec(ty, &w, rows, cols, &x, ncols);
    let m = gpu.upload_matrix(ty, rows, cols, &w)?;
    let xd = gpu.stream.clone_htod(&x)?;
    let mut yd = gpu.stream.alloc_zeros::<f32>(ncols * rows)?;
    let mut scratch = gpu.act_scratch(ncols * cols)?;
    gpu.matvec(&m, &xd, ncols, &mut scratch, &mut yd)?;
    let y = gpu.stream.clone_dtoh(&yd)?;
    Ok(Parity {
        kernel: format!("matvec {ty}"),
        shape: format!("{rows}x{cols} x{ncols}"),
        nmse: nmse(&y, &reference),
        threshold: MATVEC_NMSE,
    })
}

/// A seeded generator for parity inputs (so callers need no RNG crate of their own).
pub struct Rand(rand::rngs::StdRng);

impl Rand {
    pub fn new(seed: u64) -> Rand {
        Rand(rand::rngs::StdRng::seed_from_u64(seed))
    }
    /// Uniform in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.gen_range(lo..hi)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u32) -> u32 {
        self.0.gen_range(0..n)
    }
    pub fn u64(&mut self) -> u64 {
        self.0.gen()
    }
}
