//! Host side of `kernels/mmh.cu`: prefill chunks of K-quant matrices on Hopper's warpgroup
//! tensor cores (wgmma, sm_90 only). The activation is converted once per matmul to f16
//! (`act_f16`: each column scaled by a power of two, exactly, laid out in the tiles the kernel's
//! bulk copies move), the weights are dequantized to f16 in registers, and each output is one f32
//! sum over K in a fixed order: a column's result depends on that column alone, whatever the chunk's
//! width, the column's place in it or the tile configuration (`mmh_tile`), but it is not the bits
//! of the one-column kernels (the integer kernels' canonical order, matvec.rs). So every prefill
//! chunk runs here (`mmh_min`, 1 by default: a prompt's bits do not depend on how it is cut),
//! never a decode group (`Gpu::mmh_route`: decode stays bit-identical alone and in groups,
//! batch.rs), and the parity command holds these launches to the CPU reference by NMSE and to
//! themselves bit for bit, each column moved within the tile and alone. H200, llama-glimmer, same
//! day (2026-12-01): pp512 5,584-5,592 tokens/s against 3,862 on the integer tiles
//! (`MUSER_CUDA_MMH=0`), pp64 2,671-2,678 against 2,270, pp8 460-463 against 815 (mmh.cu: the
//! narrow configurations; BENCHMARKS.md).

use crate::device::{CudaError, Gpu};
use crate::matvec::{dptr, env_usize, gate_up_shape, mmt_fits, DeviceMatrix, Job, MAX_JOBS};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use muser_gguf::GgmlType;
use std::sync::atomic::Ordering;

/// One tile configuration of `mmh` (`MmhCfg` in mmh.cu): its kernel, the rows (`bm`: every job's
/// rows are padded to it) and columns (`bn`, also the width of `act_f16`'s tiles) a block takes,
/// its threads and its dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmhTile {
    pub name: &'static str,
    pub bm: usize,
    pub bn: usize,
    /// Weight stages (one super-block of `bm` rows each).
    pub ws: usize,
}

impl MmhTile {
    /// Bytes of one activation stage (half a super-block: `bn` columns x 128 f16 values).
    pub const fn xst(&self) -> usize {
        self.bn * 128 * 2
    }
    /// Dynamic shared memory: `ws` weight stages (`bm` rows x 224 bytes, the largest row copy
    /// padded, and `bm` Q6_K d) and four activation stages.
    pub const fn smem(&self) -> usize {
        self.ws * (self.bm * 224 + self.bm * 2) + 4 * self.xst()
    }
    pub const fn threads(&self) -> usize {
        2 * self.bm
    }
}

/// The configurations of mmh.cu: chunks past 192 columns on 128 x 128 tiles (so pp512's weights
/// are re-read by 4 column tiles), narrower ones on 64-row blocks of 64 or 32 columns (twice the
/// row blocks, three weight stages, two or three blocks per SM).
pub const MMH_WIDE: MmhTile = MmhTile {
    name: "mmh",
    bm: 128,
    bn: 128,
    ws: 2,
};
pub const MMH_N64: MmhTile = MmhTile {
    name: "mmh_n64",
    bm: 64,
    bn: 64,
    ws: 3,
};
pub const MMH_N32: MmhTile = MmhTile {
    name: "mmh_n32",
    bm: 64,
    bn: 32,
    ws: 3,
};
// 227 KB of dynamic shared memory per SM on sm_90 (the narrow ones: two and three blocks); bulk
// copies and wgmma descriptors address 16-byte units, so every stage starts on one.
const _: () = assert!(MMH_WIDE.smem() <= 227 * 1024);
const _: () = assert!(2 * (MMH_N64.smem() + 1024) <= 227 * 1024);
const _: () = assert!(3 * (MMH_N32.smem() + 1024) <= 227 * 1024);
const _: () = assert!((MMH_WIDE.bm * 224 + MMH_WIDE.bm * 2).is_multiple_of(16));
const _: () = assert!((MMH_N64.bm * 224 + MMH_N64.bm * 2).is_multiple_of(16));

/// The tile configuration of a chunk of `ncols` columns (`MUSER_CUDA_MMH_TILE=128`, `64` or `32`
/// forces one, for A/B runs: every configuration gives a column the same bits).
pub fn mmh_tile(ncols: usize) -> MmhTile {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    match FORCED.get_or_init(|| env_usize("MUSER_CUDA_MMH_TILE")) {
        Some(128) => MMH_WIDE,
        Some(64) => MMH_N64,
        Some(32) => MMH_N32,
        _ if ncols <= 32 => MMH_N32,
        // Up to three 64-column tiles: from 65 to 192 columns the 128 x 128 tiles' 156 row
        // blocks of an FFN matrix (52 of ffn_down) leave SMs idle. H200, llama-glimmer,
        // tokens/s (2026-12-03, one call, 64 x 64 forced against the default of then, which
        // took 128 x 128 past 64): pp96 3,690 against 2,585, pp128 4,813 against 3,368, pp192
        // 4,825 against 4,157; pp256 5,188 against 5,365 and pp512 5,530 against ~5,780 stay on
        // 128 x 128.
        _ if ncols <= 192 => MMH_N64,
        _ => MMH_WIDE,
    }
}

/// The fewest columns of a prefill chunk that run on `mmh`: 1 (every prefill chunk, so a prompt's
/// bits do not depend on how it is cut), or `MUSER_CUDA_MMH_MIN` (a value past every chunk keeps
/// prefill on the integer tiles).
pub fn mmh_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| env_usize("MUSER_CUDA_MMH_MIN").unwrap_or(1).max(1))
}

/// Whether narrow chunks run gate and up as one launch (`MUSER_CUDA_MMH_PAIR=0`: two launches,
/// the up launch's epilogue taking the gate's outputs). H200, llama-glimmer, alternated in one
/// call (2026-12-03): pp16 991.47 / 994.48 tokens/s against 936.50 / 932.53, pp64 3,322.06 /
/// 3,332.92 against 2,887.05 / 2,877.35; the same bits (`mmh_silu_mul` is the epilogue's float
/// expression).
pub fn mmh_pair() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| env_usize("MUSER_CUDA_MMH_PAIR").is_none_or(|v| v != 0))
}

/// Whether `ncols` columns of a `ty` matrix of width `k` can run on `mmh` (at least `min`
/// columns of a K-quant whose rows are whole super-blocks).
pub fn mmh_fits(ty: GgmlType, ncols: usize, k: usize, min: usize) -> bool {
    ncols >= min.max(1)
        && k > 0
        && k.is_multiple_of(256)
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// The launch of `tile` over `ncols` columns and `rows` rows (padded).
pub fn mmh_launch(tile: MmhTile, ncols: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            ncols.div_ceil(tile.bn) as u32,
            rows.div_ceil(tile.bm) as u32,
            1,
        ),
        block_dim: (tile.threads() as u32, 1, 1),
        shared_mem_bytes: tile.smem() as u32,
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

    /// Whether prefill chunks run on `mmh` at all (an sm_90 GPU, on).
    pub fn mmh_prefill(&self) -> bool {
        self.arch == "sm_90" && self.mmh()
    }
    /// Whether a matmul of `ncols` columns of a `ty` matrix of width `k` runs on `mmh` now:
    /// `mmh_prefill`, not in a decode step, and `mmh_fits` with `mmh_min`. Under exact columns
    /// (`set_exact`) only when every width goes there (`mmh_min` 1): a column's bits must not
    /// depend on the chunk's width.
    pub fn mmh_route(&self, ty: GgmlType, ncols: usize, k: usize) -> bool {
        self.mmh_prefill()
            && !self.decoding.load(Ordering::Relaxed)
            && (mmh_min() == 1 || !self.exact.load(Ordering::Relaxed))
            && mmh_fits(ty, ncols, k, mmh_min())
    }
    /// Whether the matmuls issued now run on `mmh` wherever their matrices fit it (`mmh_route`
    /// less `mmh_fits`): prefill chunks on sm_90.
    pub fn prefill_on_mmh(&self) -> bool {
        self.mmh_prefill()
            && !self.decoding.load(Ordering::Relaxed)
            && (mmh_min() == 1 || !self.exact.load(Ordering::Relaxed))
    }
    /// Marks the ops issued from now on as needing every row's bits independent of the pass
    /// (`true`) or not (`exact_columns`).
    pub fn set_exact(&self, on: bool) {
        self.exact.store(on, Ordering::Relaxed);
    }

    /// Converts `ncols` columns of `k` f32 values at address `x` to the f16 activation of `mmh`
    /// in tiles of `tn` columns; returns the addresses of the values and of the column scales.
    pub fn half_act(
        &self,
        x: u64,
        ncols: usize,
        k: usize,
        tn: usize,
    ) -> Result<(u64, u64), CudaError> {
        if !k.is_multiple_of(256) {
            return Err(CudaError::Unsupported(format!(
                "f16 activation of width {k} (a multiple of 256 needed)"
            )));
        }
        // Whole tiles of tn columns (the last one's columns past ncols are never written).
        let mut s = self.half.lock().unwrap();
        let xh = grow(self, &mut s.xh, ncols.div_ceil(tn) * tn * k)?;
        let xs = grow(self, &mut s.xs, ncols)?;
        let cfg = LaunchConfig {
            grid_dim: (ncols as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (k_i, tn_i) = (k as i32, tn as i32);
        let mut b = self.stream.launch_builder(self.kernel("act_f16")?);
        b.arg(&x).arg(&xh).arg(&xs).arg(&k_i).arg(&tn_i);
        // SAFETY: x holds ncols * k f32 values; xh whole tiles of tn columns x k f16 values and
        // xs ncols floats.
        unsafe { b.launch(cfg) }?;
        Ok((xh, xs))
    }

    /// y_j = W_j x for up to MAX_JOBS K-quant matrices on `mmh`'s `tile`, x the f16 activation at
    /// `act` (`half_act` in tiles of `tile.bn`) of `ncols` columns of width `k`; `gate` (or 0):
    /// y = silu(gate) * W x.
    fn mmh_launch_jobs(
        &self,
        tile: MmhTile,
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
        let (mj, total) = self.jobs_struct(group, k, tile.bm)?;
        if total == 0 || ncols == 0 {
            return Ok(());
        }
        if self.arch != "sm_90" {
            return Err(CudaError::Unsupported(format!(
                "the f16 prefill tiles need sm_90 (warpgroup MMAs), not {}",
                self.arch
            )));
        }
        let cfg = mmh_launch(tile, ncols, total);
        let f = self.kernel_smem(tile.name, tile.smem())?;
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
        let tile = mmh_tile(ncols);
        let act = self.half_act(x, ncols, k, tile.bn)?;
        let refs: Vec<&Job> = jobs.iter().collect();
        for group in refs.chunks(MAX_JOBS) {
            self.mmh_launch_jobs(tile, group, act, k, ncols, 0)?;
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
        let tile = mmh_tile(ncols);
        let act = self.half_act(x, ncols, k, tile.bn)?;
        let g = {
            let mut s = self.half.lock().unwrap();
            grow(self, &mut s.gate, ncols * rows)?
        };
        if tile != MMH_WIDE && mmh_pair() {
            // Narrow chunks: the row blocks are most of the launch's parallelism, so gate and
            // up go as one launch (twice the blocks), and `mmh_silu_mul` after it.
            self.mmh_launch_jobs(
                tile,
                &[&Job::new(gate, g), &Job::new(up, y)],
                act,
                k,
                ncols,
                0,
            )?;
            let n = ncols * rows;
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let n_i = i32::try_from(n).map_err(|_| {
                CudaError::Unsupported(format!("{n} gate+up outputs in one launch"))
            })?;
            let mut b = self.stream.launch_builder(self.kernel("mmh_silu_mul")?);
            b.arg(&g).arg(&y).arg(&n_i);
            // SAFETY: g and y each hold ncols * rows floats (the gate scratch grown above; y the
            // caller's output).
            unsafe { b.launch(cfg) }?;
            return Ok(());
        }
        self.mmh_launch_jobs(tile, &[&Job::new(gate, g)], act, k, ncols, 0)?;
        self.mmh_launch_jobs(tile, &[&Job::new(up, y)], act, k, ncols, g)
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
        for (ncols, rows) in [
            (1, 128),
            (5, 4608),
            (32, 19968),
            (33, 6656),
            (64, 256),
            (65, 4608),
            (512, 19968),
            (129, 6656),
            (700, 256),
        ] {
            let tile = mmh_tile(ncols);
            assert!(
                ncols <= 3 * tile.bn || tile == MMH_WIDE,
                "{ncols}: {tile:?}"
            );
            let c = mmh_launch(tile, ncols, rows);
            let (gx, gy) = (c.grid_dim.0 as usize, c.grid_dim.1 as usize);
            assert!(
                gx * tile.bn >= ncols && (gx - 1) * tile.bn < ncols,
                "{ncols} columns"
            );
            assert!(
                gy * tile.bm >= rows && (gy - 1) * tile.bm < rows,
                "{rows} rows"
            );
            assert_eq!(c.block_dim.0 as usize, tile.threads());
            assert_eq!(c.shared_mem_bytes as usize, tile.smem());
        }
    }

    #[test]
    fn narrow_chunks_take_narrow_tiles() {
        assert_eq!(mmh_tile(1), MMH_N32);
        assert_eq!(mmh_tile(32), MMH_N32);
        assert_eq!(mmh_tile(33), MMH_N64);
        assert_eq!(mmh_tile(64), MMH_N64);
        assert_eq!(mmh_tile(192), MMH_N64);
        assert_eq!(mmh_tile(193), MMH_WIDE);
        // The wide tile keeps pp512's shared memory: two weight stages of 128 rows and four
        // activation stages of 32 KB.
        assert_eq!(MMH_WIDE.smem(), 2 * (128 * 226) + 4 * 32768);
    }
}
