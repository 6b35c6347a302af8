//! The CUDA backend: device discovery (never a crash without a driver or GPU), the kernels of
//! `kernels/` compiled by NVRTC to machine code for the device's architecture (kept in a kernel
//! cache on disk between runs), and per-kernel dispatch counters for the audit.
//!
//! cudarc is built with dynamic loading: this crate builds and its CPU-side tests run on
//! machines with no CUDA at all. cudarc panics when a library is missing, so every entry point
//! checks for the library first and returns `CudaError::Unavailable` instead.

pub mod backend;
pub mod compile;
pub mod device;
pub mod graph;
pub mod matvec;
pub mod membw;
pub mod mmh;
pub mod parity;
pub mod steptrace;

pub use backend::{CudaBackend, CudaBuf, CudaKv, CudaWeight};
pub use compile::{compile_cubin, compile_source, nvrtc_available, KERNEL_SOURCES};
pub use device::{CudaError, Gpu};
