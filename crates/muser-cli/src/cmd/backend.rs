//! Backend selection for the commands that run a model (`run`, `logits`, `bench`,
//! `perplexity`): `--backend auto` takes the GPU when one is usable and the CPU otherwise;
//! `--backend cuda` makes a missing GPU an error.

use anyhow::Context;
use muser_cuda::{CudaBackend, CudaError};
use muser_engine::{Backend, CpuBackend, LoadOptions, Model};
use muser_gguf::GgufFile;
use std::path::Path;
use std::sync::Arc;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// CUDA when a GPU is usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// What the CLI needs of a backend beyond running the graph.
pub trait CliBackend: Backend {
    /// "CPU (avx512)", "CUDA (NVIDIA H200, sm_90)".
    fn label(&self) -> String;
    /// The read bandwidth this machine reaches now, bytes/s.
    fn read_bandwidth(&self) -> anyhow::Result<f64>;
    /// Every compiled kernel with the times it was dispatched so far; None for a backend
    /// without kernels of its own.
    fn dispatch_counts(&self) -> Option<Vec<(String, u64)>> {
        None
    }
    /// How the last recorded decode step runs (a CUDA graph and its edges), if it was recorded.
    fn step_note(&self) -> Option<String> {
        None
    }
    /// The memory the backend's K/V caches and buffers come from, bytes, when known: what
    /// `bench` checks a planned run against before allocating.
    fn memory_bytes(&self) -> Option<u64>;
    /// Opens or closes a profiler's capture range (`CudaBackend::profiler_range`); nothing for a
    /// backend no profiler attaches to.
    fn profiler_range(&self, _on: bool) -> anyhow::Result<()> {
        Ok(())
    }
}

impl CliBackend for CpuBackend {
    fn label(&self) -> String {
        format!("CPU ({})", self.isa())
    }
    fn read_bandwidth(&self) -> anyhow::Result<f64> {
        super::bench::measure_read_bandwidth(self.threads())
    }
    /// The memory the OS reports available now (else its total), from /proc/meminfo.
    fn memory_bytes(&self) -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = |key: &str| -> Option<u64> {
            let rest = info.lines().find_map(|l| l.strip_prefix(key))?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        };
        kib("MemAvailable:")
            .or_else(|| kib("MemTotal:"))
            .and_then(|k| k.checked_mul(1024))
    }
}

impl CliBackend for CudaBackend {
    fn label(&self) -> String {
        let graphs = match (self.graphs(), self.pdl()) {
            (true, true) => ", graphs+PDL",
            (true, false) => ", graphs",
            _ => "",
        };
        format!("CUDA ({}, {}{graphs})", self.gpu.name, self.gpu.arch)
    }
    fn read_bandwidth(&self) -> anyhow::Result<f64> {
        Ok(self.gpu.measure_read_bandwidth()?)
    }
    fn dispatch_counts(&self) -> Option<Vec<(String, u64)>> {
        Some(self.gpu.dispatch_counts())
    }
    /// The GPU's free memory now (the model's weights are already there).
    fn memory_bytes(&self) -> Option<u64> {
        self.gpu
            .ctx
            .mem_get_info()
            .ok()
            .map(|(free, _)| free as u64)
    }
    fn step_note(&self) -> Option<String> {
        self.last_graph().map(|(k, e, p)| {
            format!("one CUDA graph of {k} kernels; {p} of its {e} kernel-to-kernel edges programmatic (PDL)")
        })
    }
    fn profiler_range(&self, on: bool) -> anyhow::Result<()> {
        CudaBackend::profiler_range(self, on).map_err(anyhow::Error::msg)
    }
}

/// What a command does with a loaded model, whichever backend holds it.
pub trait ModelJob {
    fn run<B: CliBackend>(self, model: Model<B>) -> anyhow::Result<()>;
}

/// Loads `path` on the chosen backend and runs `job` with it.
pub fn with_model(
    path: &Path,
    kind: BackendKind,
    threads: Option<usize>,
    job: impl ModelJob,
) -> anyhow::Result<()> {
    let load_cpu = || {
        Model::load(
            path,
            &LoadOptions {
                threads,
                progress: true,
            },
        )
        .with_context(|| format!("loading {}", path.display()))
    };
    let cuda = match kind {
        BackendKind::Cpu => return job.run(load_cpu()?),
        BackendKind::Cuda => CudaBackend::new(0)?,
        BackendKind::Auto => match CudaBackend::new(0) {
            Ok(be) => be,
            Err(CudaError::Unavailable(_)) => return job.run(load_cpu()?),
            Err(e) => return Err(e).context("--backend auto found a GPU but could not use it"),
        },
    };
    let file = Arc::new(GgufFile::open(path)?);
    // A progress bar (on a terminal) while the weights upload.
    let weight_bytes: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let model = Model::from_gguf(file, cuda.with_upload_progress(weight_bytes))
        .with_context(|| format!("loading {}", path.display()))?;
    job.run(model)
}
