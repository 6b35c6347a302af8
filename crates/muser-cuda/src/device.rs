//! The GPU: context, stream, compiled modules and dispatch counters.

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("NVRTC failed to compile {file}:\n{log}")]
    Compile { file: String, log: String },
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("unsupported on CUDA: {0}")]
    Unsupported(String),
    #[error("kernel {0} is not in any compiled module")]
    NoKernel(String),
}

/// One GPU with every kernel of `kernels/` compiled and loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub arch: &'static str,
    /// Streaming multiprocessors.
    pub sms: usize,
    modules: Vec<Arc<CudaModule>>,
    functions: BTreeMap<String, CudaFunction>,
    dispatches: BTreeMap<String, AtomicU64>,
    /// Handles of the kernels that call `pdl_wait()` first (`pdl_kernel_names`).
    pdl_aware: Vec<usize>,
    /// Chunk values and counters of the split one-column kernels (`split_scratch`).
    pub(crate) split: std::sync::Mutex<crate::matvec::SplitScratch>,
    /// Kernels whose dynamic shared memory limit was raised, and to how much (`kernel_smem`).
    big_smem: std::sync::Mutex<BTreeMap<String, usize>>,
    /// Resident blocks per SM of (kernel, threads, dynamic shared memory), as the driver says
    /// (`blocks_per_sm`).
    occupancy: std::sync::Mutex<BTreeMap<(String, u32, usize), u32>>,
    /// Narrow tensor-core launches split K over blocks (`matvec::mmt_splits`); on unless
    /// `MUSER_CUDA_MMT_SPLIT=0` (H200, llama-glimmer, 32 streams: 1076 against 1056 tokens/s).
    mmt_split: std::sync::atomic::AtomicBool,
    /// Decode groups of `mmv_min` to 16 columns run on `mmv_*` (`matvec::mmv_kernel`), except
    /// those `mmw_*` takes (`matvec::mmw_narrow_min`); on unless `MUSER_CUDA_MMV=0`.
    mmv: std::sync::atomic::AtomicBool,
    /// Decode groups of K-quants on 24- and 32-column tiles run on `mmw_*`, whose stages the
    /// copy engine fills (`matvec::mmw_route`); on unless `MUSER_CUDA_MMW=0`.
    mmw: std::sync::atomic::AtomicBool,
    /// The Q8_K producers of wide groups also write `mmw_*`'s layout (`matvec::Gpu::mmw_prepack`);
    /// on unless `MUSER_CUDA_MMW_PREPACK=0`.
    mmw_prepack: std::sync::atomic::AtomicBool,
    /// A wide group's fused gate+up runs gate and up in blocks of their own
    /// (`mmw_silu_pair_*`); on unless `MUSER_CUDA_MMW_PAIRS=0`.
    mmw_pairs: std::sync::atomic::AtomicBool,
    /// Prefill chunks run on the f16 tensor-core tiles (`mmh::Gpu::mmh_route`); on unless
    /// `MUSER_CUDA_MMH=0`.
    pub(crate) mmh_on: std::sync::atomic::AtomicBool,
    /// One-column launches that fit it run on `mvk_1_whole` (`Gpu::set_mvk_whole`).
    pub(crate) mvk_whole_on: std::sync::atomic::AtomicBool,
    /// One-job launches that fit it run on `mvk_1_spread` (`Gpu::set_mvk_spread`).
    pub(crate) mvk_spread_on: std::sync::atomic::AtomicBool,
    /// The ops being issued belong to a decode step (`CudaBackend::decode_step`).
    pub(crate) decoding: std::sync::atomic::AtomicBool,
    /// The ops being issued must give every row the bits it gets alone (`exact_columns`).
    pub(crate) exact: std::sync::atomic::AtomicBool,
    /// The f16 activation and gate scratch of `mmh` (`mmh::HalfScratch`).
    pub(crate) half: std::sync::Mutex<crate::mmh::HalfScratch>,
    /// The host buffer matrices are reordered in before their copy (`upload_matrix`).
    pub(crate) staging: std::sync::Mutex<Vec<u8>>,
    /// The step trace, when on (`steptrace`, a measuring switch).
    pub trace: Option<crate::steptrace::StepTrace>,
}

impl Gpu {
    /// Opens device `ordinal`, compiling every kernel for its architecture. No driver, no
    /// device or no NVRTC is a clear error.
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        // SAFETY: only tries to dlopen libcuda by its candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "no CUDA driver (libcuda.so) on this machine; use --backend cpu".into(),
            ));
        }
        let n = CudaContext::device_count().map_err(|e| {
            CudaError::Unavailable(format!("the CUDA driver found no usable device ({e})"))
        })?;
        if ordinal as i32 >= n {
            return Err(CudaError::Unavailable(format!(
                "device {ordinal} requested, {n} CUDA device(s) present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: everything runs on the one stream below, which orders every access; cudarc's
        // per-buffer events would only add a record/wait pair to each launch.
        unsafe { ctx.disable_event_tracking() };
        let sms = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )? as usize;
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream()?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_name(major, minor)?;
        let mut gpu = Gpu {
            name: ctx.name()?,
            ctx,
            stream,
            arch,
            sms,
            modules: Vec::new(),
            functions: BTreeMap::new(),
            dispatches: BTreeMap::new(),
            pdl_aware: Vec::new(),
            split: Default::default(),
            big_smem: Default::default(),
            occupancy: Default::default(),
            mmv: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMV").map_or(true, |v| v != "0"),
            ),
            mmt_split: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMT_SPLIT").map_or(true, |v| v != "0"),
            ),
            mmw: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMW").map_or(true, |v| v != "0"),
            ),
            mmw_prepack: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMW_PREPACK").map_or(true, |v| v != "0"),
            ),
            mmw_pairs: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMW_PAIRS").map_or(true, |v| v != "0"),
            ),
            mmh_on: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MMH").map_or(true, |v| v != "0"),
            ),
            mvk_whole_on: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MVK_WHOLE").map_or(true, |v| v != "0"),
            ),
            mvk_spread_on: std::sync::atomic::AtomicBool::new(
                std::env::var("MUSER_CUDA_MVK_SPREAD").map_or(true, |v| v != "0"),
            ),
            decoding: Default::default(),
            exact: Default::default(),
            half: Default::default(),
            staging: Default::default(),
            trace: None,
        };
        if crate::steptrace::on() {
            gpu.trace = Some(crate::steptrace::StepTrace::new(&gpu.stream)?);
        }
        // Each file's machine code for this architecture: from the kernel cache (`cache_dir`),
        // else compiled by NVRTC (the files in parallel) and stored there. On a machine's first
        // run that is the slow part (H200 machine, 16 cores, files one after the other: NVRTC
        // 58-102 s, then 27-41 s of the driver translating the PTX it was given then).
        let files = crate::compile::KERNEL_SOURCES;
        let pb = indicatif::ProgressBar::new(files.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "compiling CUDA kernels for {msg} {bar:30} {pos}/{len} files ({elapsed})",
            )
            .expect("valid template"),
        );
        pb.set_message(arch);
        let t0 = std::time::Instant::now();
        let images: Vec<_> = files
            .par_iter()
            .map(|(file, src)| {
                let image = crate::compile::kernel_image(file, src, arch);
                pb.inc(1);
                image
            })
            .collect();
        pb.finish_and_clear();
        let t_compile = t0.elapsed().as_secs_f64();
        let mut compiled = 0;
        for ((file, src), image) in files.iter().zip(images) {
            let (image, from) = image?;
            compiled += usize::from(from == crate::compile::ImageSource::Nvrtc);
            let load = |image: Vec<u8>| gpu.ctx.load_module(Ptx::from_binary(image));
            let module = match load(image) {
                Ok(m) => m,
                Err(refused) => {
                    // A cached image the driver refuses (damaged, or from a newer toolkit than
                    // the driver's) is compiled again; machine code it refuses from this NVRTC
                    // too, it gets as PTX to translate itself.
                    let fresh = if from == crate::compile::ImageSource::Nvrtc {
                        None
                    } else {
                        compiled += 1;
                        load(crate::compile::recompile_image(file, src, arch)?).ok()
                    };
                    match fresh {
                        Some(m) => m,
                        None => {
                            let ptx = crate::compile::compile_source(file, src, arch)?;
                            gpu.ctx.load_module(ptx).map_err(|_| refused)?
                        }
                    }
                }
            };
            let aware = pdl_kernel_names(src);
            if let Some(t) = gpu.trace.as_mut() {
                t.attach(&module, &gpu.stream, &aware)?;
            }
            for name in kernel_names(src) {
                let f = module.load_function(&name)?;
                if aware.contains(&name) {
                    gpu.pdl_aware.push(f.cu_function() as usize);
                }
                gpu.dispatches.insert(name.clone(), AtomicU64::new(0));
                gpu.functions.insert(name, f);
            }
            gpu.modules.push(module);
        }
        let total = t0.elapsed().as_secs_f64();
        if total > 5.0 {
            let cache = crate::compile::cache_dir().map_or("no kernel cache".to_string(), |d| {
                format!("cache {}", d.display())
            });
            eprintln!(
                "CUDA kernels for {arch}: {compiled} of {} files compiled by NVRTC in {t_compile:.1} s, \
                 loaded in {:.1} s ({cache})",
                files.len(),
                total - t_compile
            );
        }
        Ok(gpu)
    }

    /// The kernel `name`, counting one dispatch.
    pub fn kernel(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| CudaError::NoKernel(name.into()))?;
        if let Some(c) = self.dispatches.get(name) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = &self.trace {
            t.launched(name);
        }
        Ok(f)
    }

    /// The formats of the matrices the kernel launched last reads, in the step trace (when on).
    pub fn trace_formats(&self, types: impl IntoIterator<Item = muser_gguf::GgmlType>) {
        if let Some(t) = &self.trace {
            let mut names: Vec<String> = types.into_iter().map(|t| t.to_string()).collect();
            names.sort();
            names.dedup();
            t.note(&names.join("+"));
        }
    }

    /// Whether decode groups of `matvec::mmv_min` (2) to 16 columns run on `mmv_*` (else `mmk_*`).
    pub fn mmv(&self) -> bool {
        self.mmv.load(Ordering::Relaxed)
    }
    pub fn set_mmv(&self, on: bool) {
        self.mmv.store(on, Ordering::Relaxed);
    }

    /// Whether decode groups of K-quants on 24- and 32-column tiles run on `mmw_*` (bulk
    /// copies: Hopper and newer; `matvec::mmw_route`).
    pub fn mmw(&self) -> bool {
        self.mmw.load(Ordering::Relaxed) && self.cc() >= 90
    }
    pub fn set_mmw(&self, on: bool) {
        self.mmw.store(on, Ordering::Relaxed);
    }
    /// Whether the Q8_K producers of wide groups also write `mmw_*`'s activation layout.
    pub fn mmw_prepack_on(&self) -> bool {
        self.mmw_prepack.load(Ordering::Relaxed)
    }
    pub fn set_mmw_prepack(&self, on: bool) {
        self.mmw_prepack.store(on, Ordering::Relaxed);
    }
    /// Whether a wide group's fused gate+up on `mmw_*` runs gate and up in blocks of their own.
    pub fn mmw_pairs(&self) -> bool {
        self.mmw_pairs.load(Ordering::Relaxed)
    }
    pub fn set_mmw_pairs(&self, on: bool) {
        self.mmw_pairs.store(on, Ordering::Relaxed);
    }

    /// The compute capability as major * 10 + minor (sm_90: 90).
    pub fn cc(&self) -> u32 {
        self.arch.trim_start_matches("sm_").parse().unwrap_or(0)
    }

    /// Whether narrow tensor-core launches split K over blocks (`matvec::mmt_splits`).
    pub fn mmt_split(&self) -> bool {
        self.mmt_split.load(Ordering::Relaxed)
    }
    pub fn set_mmt_split(&self, on: bool) {
        self.mmt_split.store(on, Ordering::Relaxed);
    }

    /// `kernel(name)` for a launch with `smem` bytes of dynamic shared memory: the kernel's limit is
    /// raised past the default 48 KB where needed (once per size).
    pub fn kernel_smem(&self, name: &str, smem: usize) -> Result<&CudaFunction, CudaError> {
        let f = self.kernel(name)?;
        if smem > 48 * 1024 {
            let mut set = self.big_smem.lock().unwrap();
            if set.get(name).is_none_or(|&s| s < smem) {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )?;
                set.insert(name.to_string(), smem);
            }
        }
        Ok(f)
    }

    /// How many blocks of `threads` threads and `smem` bytes of dynamic shared memory of kernel
    /// `name` one SM holds (the driver's occupancy calculator, asked once per configuration).
    pub fn blocks_per_sm(&self, name: &str, threads: u32, smem: usize) -> Result<u32, CudaError> {
        let key = (name.to_string(), threads, smem);
        if let Some(&n) = self.occupancy.lock().unwrap().get(&key) {
            return Ok(n);
        }
        let n = self
            .kernel_smem(name, smem)?
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)?;
        self.occupancy.lock().unwrap().insert(key, n);
        Ok(n)
    }

    /// Counts `n` more dispatches of each kernel of `counts` (kernels a replayed graph launches).
    pub fn add_dispatches(&self, counts: &[(String, u64)]) {
        for (name, n) in counts {
            if let Some(c) = self.dispatches.get(name) {
                c.fetch_add(*n, Ordering::Relaxed);
            }
        }
    }

    /// Whether `f` is a kernel that waits for its programmatic predecessor (`graph.rs`).
    pub fn is_pdl_aware(&self, f: cudarc::driver::sys::CUfunction) -> bool {
        self.pdl_aware.contains(&(f as usize))
    }

    /// Every compiled kernel with its dispatch count so far.
    pub fn dispatch_counts(&self) -> Vec<(String, u64)> {
        self.dispatches
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect()
    }
}

/// "sm_90" for compute capability 9.0.
fn arch_name(major: i32, minor: i32) -> Result<&'static str, CudaError> {
    Ok(match (major, minor) {
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => {
            return Err(CudaError::Unavailable(format!(
                "compute capability {major}.{minor} is not supported (need 8.0 or newer)"
            )))
        }
    })
}

/// The `extern "C" __global__` kernel names a source defines (the name on the declaration's
/// first line; attributes such as `__launch_bounds__(..)` and `__cluster_dims__(..)` before it
/// are skipped).
pub fn kernel_names(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("extern \"C\" __global__"))
        .filter_map(|mut rest| {
            // Skip `__attr__(..)` groups until the first parenthesis is the parameter list's.
            loop {
                let open = rest.find('(')?;
                let word = rest[..open].split_whitespace().last()?;
                if word.starts_with("__") && word.ends_with("__") {
                    rest = &rest[open + rest[open..].find(')')? + 1..];
                } else {
                    return Some(word.to_string());
                }
            }
        })
        .collect()
}

/// The kernels of `src` whose body begins with `pdl_wait()` or a `pdl_wait_*` variant (one that
/// prefetches weights first, see matvec.cu), called alone or as the value of the first
/// statement (`const T v = pdl_wait_x(..);`), see common.cuh: only those may be launched as
/// programmatic dependents.
pub fn pdl_kernel_names(src: &str) -> Vec<String> {
    let decl = "extern \"C\" __global__";
    src.match_indices(decl)
        .filter_map(|(at, _)| {
            let def = &src[at..];
            let name = kernel_names(def.lines().next()?).into_iter().next()?;
            let body = def[def.find('{')? + 1..].trim_start();
            let first = &body[..body.find(';')?];
            let call = first.split_once('=').map_or(first, |(_, v)| v).trim_start();
            call.starts_with("pdl_wait").then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_names_skip_launch_bounds() {
        let src = "extern \"C\" __global__ void __launch_bounds__(128) matvec_1(MatvecJobs j) {}\n\
                   extern \"C\" __global__ void kv_store(const float* k,\n\
                   extern \"C\" __global__ void __cluster_dims__(1, 1, N) __launch_bounds__(128) fin(int x,\n";
        assert_eq!(
            super::kernel_names(src),
            vec!["matvec_1", "kv_store", "fin"]
        );
    }

    #[test]
    fn pdl_aware_kernels_are_those_that_wait_first() {
        let src = "extern \"C\" __global__ void a(int x) { pdl_wait(); f(x); }\n\
                   extern \"C\" __global__ void __launch_bounds__(128) b(int x,\n int y) {\n    pdl_wait();\n}\n\
                   extern \"C\" __global__ void c(int x) { if (x) return; pdl_wait(); }\n\
                   extern \"C\" __global__ void d(int x) { pdl_wait_prefetch_rows(x); f(x); }\n\
                   extern \"C\" __global__ void e(int x) { const int2 r = pdl_wait_span(x); f(r); }\n\
                   extern \"C\" __global__ void g(int x) { const int2 r = span(x); pdl_wait(); }\n";
        assert_eq!(super::pdl_kernel_names(src), vec!["a", "b", "d", "e"]);
    }

    #[test]
    fn every_kernel_of_the_decode_chain_waits_first() {
        // Every kernel but the bandwidth probe can be launched as a programmatic dependent; a
        // kernel added without pdl_wait() first would silently lose the overlap.
        for (file, src) in crate::KERNEL_SOURCES {
            if *file == "membw.cu" {
                continue;
            }
            let all = super::kernel_names(src);
            assert_eq!(super::pdl_kernel_names(src), all, "{file}");
        }
    }

    #[test]
    fn every_source_names_distinct_kernels() {
        let mut all: Vec<String> = crate::KERNEL_SOURCES
            .iter()
            .flat_map(|(_, s)| super::kernel_names(s))
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a kernel name is defined twice");
        assert!(!all.iter().any(|k| k.starts_with("__")), "{all:?}");
    }
}
