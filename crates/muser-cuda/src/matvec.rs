//! Host side of `kernels/matvec.cu`: weight upload, activation quantization, launches for any
//! number of columns (in groups of up to 8, the kernels' widest instantiation).

use crate::device::{CudaError, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use muser_gguf::GgmlType;

/// A weight matrix on the GPU, in its GGUF block layout: `rows` rows of `cols` values.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<u8>,
}

/// Scratch for one quantized activation of up to `cap` values (columns x K).
pub struct ActScratch {
    q: CudaSlice<i8>,
    ds: CudaSlice<f32>,
    cap: usize,
}

/// Columns one kernel launch handles at most.
pub const MAX_COLS: usize = 8;

/// The kernel-name suffix of a weight type, or an error for a type with no CUDA matvec.
pub fn kernel_format(ty: GgmlType) -> Result<&'static str, CudaError> {
    Ok(match ty {
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::F16 => "f16",
        GgmlType::F32 => "f32",
        other => return Err(CudaError::Unsupported(format!("no CUDA matvec for {other}"))),
    })
}

/// Whether the kernel of `ty` reads an int8-quantized activation.
pub fn uses_q8_activation(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_0)
}

impl Gpu {
    /// Uploads `rows` x `cols` weights of type `ty` (raw GGUF bytes).
    pub fn upload_matrix(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, CudaError> {
        kernel_format(ty)?;
        let row_bytes = ty.row_bytes(cols as u64).ok_or_else(|| {
            CudaError::Unsupported(format!("{ty}: row of {cols} is not a multiple of the block"))
        })? as usize;
        if bytes.len() != rows * row_bytes {
            return Err(CudaError::Unsupported(format!(
                "{ty} matrix {rows}x{cols} needs {} bytes, got {}",
                rows * row_bytes,
                bytes.len()
            )));
        }
        Ok(DeviceMatrix { ty, rows, cols, data: self.stream.clone_htod(bytes)? })
    }

    /// Scratch for activations of up to `cap` values.
    pub fn act_scratch(&self, cap: usize) -> Result<ActScratch, CudaError> {
        Ok(ActScratch {
            q: self.stream.alloc_zeros::<i8>(cap)?,
            ds: self.stream.alloc_zeros::<f32>(cap / 32 * 2)?,
            cap,
        })
    }

    /// y[c][r] = W x[c] for `ncols` columns: x is [ncols][cols], y is [ncols][rows].
    pub fn matvec(
        &self,
        m: &DeviceMatrix,
        x: &CudaSlice<f32>,
        ncols: usize,
        scratch: &mut ActScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        let k = m.cols;
        assert!(x.len() >= ncols * k && y.len() >= ncols * m.rows, "matvec buffers too small");
        let fmt = kernel_format(m.ty)?;
        let grid = (m.rows as u32).div_ceil(4);
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let (rows_i, k_i) = (m.rows as i32, k as i32);
        if uses_q8_activation(m.ty) {
            if ncols * k > scratch.cap {
                return Err(CudaError::Unsupported(format!(
                    "activation of {ncols}x{k} exceeds the scratch of {}",
                    scratch.cap
                )));
            }
            let n_blocks = (ncols * k / 32) as i32;
            let f = self.kernel("quantize_q8_1")?;
            let qcfg = LaunchConfig {
                grid_dim: ((n_blocks as u32).div_ceil(4), 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream.launch_builder(f);
            b.arg(x).arg(&mut scratch.q).arg(&mut scratch.ds).arg(&n_blocks);
            // SAFETY: x holds ncols*k f32; q and ds hold at least that many blocks.
            unsafe { b.launch(qcfg) }?;
        }
        let mut c0 = 0;
        while c0 < ncols {
            let n = (ncols - c0).min(MAX_COLS);
            let f = self.kernel(&format!("matvec_{fmt}_{n}"))?;
            let mut b = self.stream.launch_builder(f);
            let mut y_part = y.slice_mut(c0 * m.rows..(c0 + n) * m.rows);
            b.arg(&m.data);
            let xq;
            let xds;
            let xf;
            if uses_q8_activation(m.ty) {
                xq = scratch.q.slice(c0 * k..(c0 + n) * k);
                xds = scratch.ds.slice(c0 * k / 16..(c0 + n) * k / 16);
                b.arg(&xq).arg(&xds);
            } else {
                xf = x.slice(c0 * k..(c0 + n) * k);
                b.arg(&xf);
            }
            b.arg(&mut y_part).arg(&rows_i).arg(&k_i);
            // SAFETY: the kernel reads rows*row_bytes weight bytes, n*k activations, and writes
            // n*rows outputs, all within the slices passed.
            unsafe { b.launch(cfg) }?;
            c0 += n;
        }
        Ok(())
    }
}
