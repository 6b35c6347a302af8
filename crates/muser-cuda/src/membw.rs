//! The GPU's read bandwidth, measured the way a decode step reads weights: one streaming pass
//! over a buffer far larger than L2 (`kernels/membw.cu`), best of several timed passes.

use crate::device::{CudaError, Gpu};
use cudarc::driver::{LaunchConfig, PushKernelArg};

impl Gpu {
    /// Bytes/s of the best of five passes over a 4 GiB buffer.
    pub fn measure_read_bandwidth(&self) -> Result<f64, CudaError> {
        let n16 = (4usize << 30) / 16;
        let buf = self.stream.alloc_zeros::<u8>(n16 * 16)?;
        let blocks = 4 * self.sms;
        let mut out = self.stream.alloc_zeros::<u32>(blocks)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = n16 as u64;
        let mut best = 0f64;
        for pass in 0..6 {
            let start = self
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = self
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(&self.stream)?;
            let f = self.kernel("read_bandwidth")?;
            let mut b = self.stream.launch_builder(f);
            b.arg(&buf).arg(&n).arg(&mut out);
            // SAFETY: the kernel reads n 16-byte words of `buf` and xors into `blocks` words.
            unsafe { b.launch(cfg) }?;
            end.record(&self.stream)?;
            end.synchronize()?;
            let s = start.elapsed_ms(&end)? as f64 / 1e3;
            if pass > 0 {
                best = best.max((n16 * 16) as f64 / s);
            }
        }
        Ok(best)
    }
}
