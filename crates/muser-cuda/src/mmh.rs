//! Host side of `kernels/mmh.cu`: prefill chunks of K-quant matrices on Hopper's warpgroup
//! tensor cores (wgmma, sm_90 only). The activation is converted once per matmul to f16
//! (`act_f16`: each column scaled by a power of two, exactly, laid out in the tiles the kernel's
//! bulk copies move), the weights are dequantized to f16 in registers, and each output is one f32
//! sum over K in a fixed order: a column's result depends on that column alone, whatever the
//! chunk's width or the column's place in it, but it is not the bits of the one-column kernels
//! (the integer kernels' canonical order, matvec.rs). So only prefill chunks of `mmh_min` columns
//! or more run here, never a decode group (`Gpu::mmh_route`: decode stays bit-identical alone and
//! in groups, batch.rs), and the parity command holds these launches to the CPU reference by NMSE
//! and to themselves bit for bit with the columns moved within the tile. H200, llama-glimmer,
//! same call: pp512 5709 tokens/s against 3878 on the integer tiles (`MUSER_CUDA_MMH=0`).

use crate::device::{CudaError, Gpu};
use crate::matvec::{dptr, env_usize, gate_up_shape, mmt_fits, DeviceMatrix, Job, MAX_JOBS};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use muser_gguf::GgmlType;
use std::sync::atomic::Ordering;

/// Rows one `mmh` block takes (MMH_BM in mmh.cu); every job's rows are padded to it.
pub const MMH_BM: usize = 128;
/// Columns one `mmh` block takes (MMH_BN).
pub const MMH_BN: usize = 128;
/// Bytes of one activation stage of `mmh` (MMG_XST in mmh.cu), and of one tile of `act_f16`'s
/// layout: 128 columns x 128 f16 values.
pub const MMH_XST: usize = MMH_BN * 128 * 2;
/// Dynamic shared memory of an `mmh` launch: two weight stages (128 rows x 224 bytes, the largest
/// row copy padded, and 128 Q6_K d) and four activation stages.
pub const MMH_SMEM: usize = 2 * (MMH_BM * 224 + MMH_BM * 2) + 4 * MMH_XST;
// 227 KB of dynamic shared memory per block on sm_90; bulk copies and wgmma descriptors address
// 16-byte units, so every stage starts on one.
const _: () = assert!(MMH_SMEM <= 227 * 1024);
const _: () = assert!((MMH_BM * 224 + MMH_BM * 2).is_multiple_of(16) && MMH_XST.is_multiple_of(16));

/// The fewest columns of a prefill chunk that run on `mmh`: 64, or `MUSER_CUDA_MMH_MIN` (a value
/// past every chunk keeps prefill on the integer tiles).
pub fn mmh_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| env_usize("MUSER_CUDA_MMH_MIN").unwrap_or(64))
}

/// Whether `ncols` columns of a `ty` matrix of width `k` can run on `mmh` (at least `min`
/// columns of a K-quant whose rows are whole super-blocks).
pub fn mmh_fits(ty: GgmlType, ncols: usize, k: usize, min: usize) -> bool {
    ncols >= min.max(1)
        && k > 0
        && k.is_multiple_of(256)
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// The launch of `mmh` over `ncols` columns and `rows` rows (padded).
pub fn mmh_launch(ncols: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            ncols.div_ceil(MMH_BN) as u32,
            rows.div_ceil(MMH_BM) as u32,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: MMH_SMEM as u32,
    }
}

/// The f16 activation (`act_f16`'s output), its column scales and the gate's outputs of a fused
/// gate+up+SiLU, grown on demand.
#[derive(Default)]
pub struct HalfScratch {
    xh: Option<CudaSlice<u16>>,
    xs: Option<CudaSlice<f32>>,
    gate: Option<CudaSlice<f32>>,
}

fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    s: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<u64, CudaError> {
    if s.as_ref().is_none_or(|b| b.len() < n) {
        *s = Some(gpu.stream.alloc_zeros::<T>(n.max(1).next_power_of_two())?);
    }
    Ok(dptr(gpu, s.as_ref().expect("allocated above")))
}

impl Gpu {
    /// Whether prefill chunks run on `mmh` (`MUSER_CUDA_MMH=0`: off, for A/B runs and the
    /// parity command's integer-tile checks).
    pub fn mmh(&self) -> bool {
        self.mmh_on.load(Ordering::Relaxed)
    }
    pub fn set_mmh(&self, on: bool) {
        self.mmh_on.store(on, Ordering::Relaxed);
    }
    /// Marks the ops issued from now on as a decode step (`true`) or not: decode groups never run
    /// on `mmh`.
    pub fn set_decoding(&self, on: bool) {
        self.decoding.store(on, Ordering::Relaxed);
    }

    /// Whether a matmul of `ncols` columns of a `ty` matrix of width `k` runs on `mmh` now: an
    /// sm_90 GPU (the warpgroup MMAs), on, not in a decode step, and `mmh_fits` with `mmh_min`.
    pub fn mmh_route(&self, ty: GgmlType, ncols: usize, k: usize) -> bool {
        self.arch == "sm_90"
            && self.mmh()
            && !self.decoding.load(Ordering::Relaxed)
            && mmh_fits(ty, ncols, k, mmh_min())
    }

    /// Converts `ncols` columns of `k` f32 values at address `x` to the f16 activation of `mmh`;
    /// returns the addresses of the values and of the column scales.
    pub fn half_act(&self, x: u64, ncols: usize, k: usize) -> Result<(u64, u64), CudaError> {
        if !k.is_multiple_of(256) {
            return Err(CudaError::Unsupported(format!(
                "f16 activation of width {k} (a multiple of 256 needed)"
            )));
        }
        // Whole tiles of 128 columns (the last one's columns past ncols are never written).
        let mut s = self.half.lock().unwrap();
        let xh = grow(self, &mut s.xh, ncols.div_ceil(MMH_BN) * MMH_BN * k)?;
        let xs = grow(self, &mut s.xs, ncols)?;
        let cfg = LaunchConfig {
            grid_dim: (ncols as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let k_i = k as i32;
        let mut b = self.stream.launch_builder(self.kernel("act_f16")?);
        b.arg(&x).arg(&xh).arg(&xs).arg(&k_i);
        // SAFETY: x holds ncols * k f32 values; xh whole tiles of 128 columns x k f16 values and
        // xs ncols floats.
        unsafe { b.launch(cfg) }?;
        Ok((xh, xs))
    }

    /// y_j = W_j x for up to MAX_JOBS K-quant matrices on `mmh`, x the f16 activation at `act`
    /// (`half_act`) of `ncols` columns of width `k`; `gate` (or 0): y = silu(gate) * W x.
    fn mmh_launch_jobs(
        &self,
        group: &[&Job],
        act: (u64, u64),
        k: usize,
        ncols: usize,
        gate: u64,
    ) -> Result<(), CudaError> {
        for j in group {
            mmt_fits(j.m.data.len())?;
            if !mmh_fits(j.m.ty, ncols, k, 1) {
                return Err(CudaError::Unsupported(format!(
                    "{} matrix of width {k} on the f16 prefill tiles",
                    j.m.ty
                )));
            }
        }
        let (mj, total) = self.jobs_struct(group, k, MMH_BM)?;
        if total == 0 || ncols == 0 {
            return Ok(());
        }
        if self.arch != "sm_90" {
            return Err(CudaError::Unsupported(format!(
                "the f16 prefill tiles need sm_90 (warpgroup MMAs), not {}",
                self.arch
            )));
        }
        let cfg = mmh_launch(ncols, total);
        let f = self.kernel_smem("mmh", MMH_SMEM)?;
        let (k_i, n_i) = (k as i32, ncols as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&mj)
            .arg(&act.0)
            .arg(&act.1)
            .arg(&k_i)
            .arg(&n_i)
            .arg(&gate);
        // SAFETY: each job reads its rows' K-quant blocks (32-bit offsets: mmt_fits) and writes
        // ncols * rows outputs; the activation holds ncols * k f16 values and ncols scales; gate
        // (when set) ncols * rows floats laid out as the output.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y_j[c][r] = W_j x[c] for every job on `mmh`: `ncols` columns of width `k` at address `x`
    /// (f32), converted to f16 once for all of them.
    pub fn mmh_jobs(&self, jobs: &[Job], x: u64, k: usize, ncols: usize) -> Result<(), CudaError> {
        let act = self.half_act(x, ncols, k)?;
        let refs: Vec<&Job> = jobs.iter().collect();
        for group in refs.chunks(MAX_JOBS) {
            self.mmh_launch_jobs(group, act, k, ncols, 0)?;
        }
        Ok(())
    }

    /// y[c][r] = silu(G[r] . x[c]) * (U[r] . x[c]) on `mmh`: the gate's launch writes its outputs
    /// to scratch, the up launch multiplies them in.
    pub fn mmh_silu(
        &self,
        gate: &DeviceMatrix,
        up: &DeviceMatrix,
        x: u64,
        ncols: usize,
        y: u64,
    ) -> Result<(), CudaError> {
        let (k, rows) = gate_up_shape(gate, up)?;
        let act = self.half_act(x, ncols, k)?;
        let g = {
            let mut s = self.half.lock().unwrap();
            grow(self, &mut s.gate, ncols * rows)?
        };
        self.mmh_launch_jobs(&[&Job { m: gate, y: g }], act, k, ncols, 0)?;
        self.mmh_launch_jobs(&[&Job { m: up, y }], act, k, ncols, g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmh_takes_prefill_widths_of_k_quants_only() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            assert!(mmh_fits(ty, 64, 6656, 64));
            assert!(mmh_fits(ty, 512, 19968, 64));
            assert!(!mmh_fits(ty, 63, 6656, 64), "{ty}: below the minimum");
            assert!(
                !mmh_fits(ty, 64, 6656 + 32, 64),
                "{ty}: a partial super-block"
            );
        }
        for ty in [GgmlType::Q8_0, GgmlType::F16, GgmlType::F32] {
            assert!(!mmh_fits(ty, 512, 6656, 64), "{ty} has no f16 tile kernel");
        }
    }

    #[test]
    fn mmh_launch_covers_every_row_and_column_once() {
        for (ncols, rows) in [(64, 128), (65, 4608), (512, 19968), (129, 6656), (700, 256)] {
            let c = mmh_launch(ncols, rows);
            let (gx, gy) = (c.grid_dim.0 as usize, c.grid_dim.1 as usize);
            assert!(
                gx * MMH_BN >= ncols && (gx - 1) * MMH_BN < ncols,
                "{ncols} columns"
            );
            assert!(
                gy * MMH_BM >= rows && (gy - 1) * MMH_BM < rows,
                "{rows} rows"
            );
        }
    }
}
