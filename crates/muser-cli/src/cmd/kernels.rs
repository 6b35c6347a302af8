//! `muser kernels`: compiles the CUDA kernels into the kernel cache ahead of time, with NVRTC and
//! no GPU, so that the first run on a GPU machine (or on one that starts bare every time) loads
//! machine code at once instead of compiling for a minute or more.

use muser_cuda::compile::{cache_dir, kernel_image, ImageSource};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// GPU architecture to compile for (NVRTC's real architectures: sm_80, sm_86, sm_89, sm_90, ...).
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Print each kernel's registers, spills and shared memory (the assembler's report) for
    /// these source files (e.g. matvec.cu) instead of filling the cache.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    resources: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let arch = args.arch.as_str();
    anyhow::ensure!(
        arch.strip_prefix("sm_")
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric())),
        "--arch {arch}: expected a real GPU architecture such as sm_90"
    );
    if !args.resources.is_empty() {
        return resources(&args.resources, arch);
    }
    let dir = cache_dir().ok_or_else(|| {
        anyhow::anyhow!("no kernel cache: set MUSER_KERNEL_CACHE (or HOME) to a writable folder")
    })?;
    anyhow::ensure!(
        muser_cuda::nvrtc_available(),
        "libnvrtc was not found on the loader path (install the CUDA toolkit or the \
         nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH)"
    );
    outln!("kernel cache: {}", dir.display())?;
    let t0 = Instant::now();
    let files = muser_cuda::KERNEL_SOURCES;
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|(file, src)| {
                s.spawn(move || {
                    let t = Instant::now();
                    (kernel_image(file, src, arch), t.elapsed())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((file, src), (image, took)) in files.iter().zip(results) {
        let (image, from) = image?;
        let how = match from {
            ImageSource::Nvrtc => format!("compiled in {:.1} s", took.as_secs_f64()),
            ImageSource::Disk | ImageSource::Process => "already cached".to_string(),
        };
        let path = muser_cuda::compile::cache_path(&dir, file, src, arch);
        anyhow::ensure!(
            path.is_file(),
            "{}: the cache could not be written",
            path.display()
        );
        outln!("{file:>16}  {:>9} bytes  {how}", image.len())?;
    }
    outln!(
        "{} files for {arch} in {:.1} s",
        files.len(),
        t0.elapsed().as_secs_f64()
    )?;
    Ok(())
}

/// `--resources`: the assembler's report for the named sources, a line per kernel.
fn resources(names: &[String], arch: &str) -> anyhow::Result<()> {
    for name in names {
        let (file, src) = muser_cuda::KERNEL_SOURCES
            .iter()
            .find(|(f, _)| f == name || f.trim_end_matches(".cu") == name)
            .ok_or_else(|| {
                let known: Vec<_> = muser_cuda::KERNEL_SOURCES.iter().map(|(f, _)| *f).collect();
                anyhow::anyhow!(
                    "--resources {name}: no such kernel source (known: {})",
                    known.join(", ")
                )
            })?;
        for line in muser_cuda::compile::kernel_resources(file, src, arch)? {
            outln!("{file}: {line}")?;
        }
    }
    Ok(())
}
