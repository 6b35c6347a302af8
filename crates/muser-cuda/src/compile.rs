//! NVRTC compilation of the kernel sources in `kernels/`. `common.cuh` is prepended to every
//! source, `kq_mma.cuh` (the integer tensor-core pieces) to mmk.cu and mmt.cu (NVRTC has no
//! file system include path for our headers).

use crate::device::CudaError;
use cudarc::nvrtc::{result, sys, Ptx};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The shared header: block structs and helpers.
pub const COMMON_HEADER: &str = include_str!("../kernels/common.cuh");

/// Every kernel source file, by name. CI compiles each with NVRTC for sm_90.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("matvec.cu", include_str!("../kernels/matvec.cu")),
    (
        "mmk.cu",
        concat!(
            include_str!("../kernels/kq_mma.cuh"),
            include_str!("../kernels/mmk.cu")
        ),
    ),
    (
        "mmt.cu",
        concat!(
            include_str!("../kernels/kq_mma.cuh"),
            include_str!("../kernels/mmt.cu")
        ),
    ),
    ("mmh.cu", include_str!("../kernels/mmh.cu")),
    ("embed.cu", include_str!("../kernels/embed.cu")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    ("rope.cu", include_str!("../kernels/rope.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("argmax.cu", include_str!("../kernels/argmax.cu")),
    ("membw.cu", include_str!("../kernels/membw.cu")),
];

/// True when libnvrtc can be loaded (cudarc would panic otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Machine code already compiled or read in this process, by cache file name (`cache_path`: the
/// file, the architecture and the sources' hash): every backend opened after the first (`muser
/// check` opens several) skips the cache and NVRTC.
static IMAGES: std::sync::Mutex<Vec<(PathBuf, Vec<u8>)>> = std::sync::Mutex::new(Vec::new());

/// Where compiled kernels are kept between processes: `MUSER_KERNEL_CACHE` (empty or `off`:
/// nowhere), else `$XDG_CACHE_HOME/muser/kernels`, else `~/.cache/muser/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("MUSER_KERNEL_CACHE") {
        return (!d.is_empty() && d != "off").then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("muser").join("kernels"))
}

/// The cache file of one source for `arch`: named by the file, the architecture and a hash of
/// everything NVRTC is given (the headers, the source, the options), so an edited kernel is
/// compiled again.
pub fn cache_path(dir: &Path, name: &str, src: &str, arch: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (COMMON_HEADER, name, src, arch, NVRTC_OPTIONS).hash(&mut h);
    if crate::steptrace::on() {
        "MUSER_STEP_TRACE".hash(&mut h);
    }
    let stem = name.trim_end_matches(".cu");
    dir.join(format!("{stem}-{arch}-{:016x}.cubin", h.finish()))
}

/// Where a kernel image came from (`kernel_image`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource {
    /// Already in this process.
    Process,
    /// Read from the kernel cache.
    Disk,
    /// Compiled now by NVRTC (and written to the cache when there is one).
    Nvrtc,
}

/// Machine code (CUBIN) of one kernel source for `arch`: from this process, the kernel cache, or
/// NVRTC (then stored in the cache; a cache that cannot be written is only skipped).
pub fn kernel_image(
    name: &str,
    src: &str,
    arch: &str,
) -> Result<(Vec<u8>, ImageSource), CudaError> {
    let key = cache_path(Path::new(""), name, src, arch);
    let known = |images: &Vec<(PathBuf, Vec<u8>)>| {
        images
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, i)| i.clone())
    };
    if let Some(image) = known(&IMAGES.lock().unwrap()) {
        return Ok((image, ImageSource::Process));
    }
    let path = cache_dir().map(|d| d.join(&key));
    let (image, from) = match path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        Some(image) if !image.is_empty() => (image, ImageSource::Disk),
        _ => {
            let image = compile_cubin(name, src, arch)?;
            if let Some(p) = &path {
                store(p, &image);
            }
            (image, ImageSource::Nvrtc)
        }
    };
    let mut images = IMAGES.lock().unwrap();
    if known(&images).is_none() {
        images.push((key, image.clone()));
    }
    Ok((image, from))
}

/// Compiles one source again, replacing its image in this process and in the cache (a cached
/// image the driver refused to load).
pub fn recompile_image(name: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let image = compile_cubin(name, src, arch)?;
    let key = cache_path(Path::new(""), name, src, arch);
    if let Some(d) = cache_dir() {
        store(&d.join(&key), &image);
    }
    let mut images = IMAGES.lock().unwrap();
    images.retain(|(k, _)| *k != key);
    images.push((key, image.clone()));
    Ok(image)
}

/// Writes a cache file whole or not at all (a temporary file renamed into place).
fn store(path: &Path, image: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && std::fs::write(&tmp, image).is_ok()
        && std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Options given to NVRTC besides the architecture and include paths.
const NVRTC_OPTIONS: &[&str] = &["--std=c++17"];

/// Compiles one source (with the common header) to PTX for `arch` (e.g. "sm_90"): for reading
/// the code NVRTC makes (tools); the backend loads `compile_cubin`'s machine code.
pub fn compile_source(name: &str, src: &str, arch: &str) -> Result<Ptx, CudaError> {
    // SAFETY: the program is valid until nvrtc() destroys it, after this returns.
    let ptx = nvrtc(name, src, arch, &[], |p| {
        unsafe { result::get_ptx(p) }.map(to_bytes)
    })?;
    Ok(Ptx::from_src(
        String::from_utf8_lossy(&ptx).trim_end_matches('\0'),
    ))
}

/// Compiles one source (with the common header) to machine code (CUBIN) for the real
/// architecture `arch` (e.g. "sm_90"): loading it needs no translation by the driver.
pub fn compile_cubin(name: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    nvrtc(name, src, arch, &[], |p| {
        let mut size = 0usize;
        // SAFETY: p is a compiled program (nvrtc() calls this after compiling); the buffer holds
        // the size NVRTC reports.
        unsafe {
            sys::nvrtcGetCUBINSize(p, &mut size).result()?;
            let mut image = vec![0u8; size];
            sys::nvrtcGetCUBIN(p, image.as_mut_ptr().cast()).result()?;
            Ok(image)
        }
    })
}

/// Each kernel's resources in one source compiled for `arch` (tools: `muser kernels
/// --resources`): a line per kernel with its registers, spill stores and loads, stack and static
/// shared memory, from the assembler's report.
pub fn kernel_resources(name: &str, src: &str, arch: &str) -> Result<Vec<String>, CudaError> {
    // SAFETY: nvrtc() calls this on a compiled program, before destroying it.
    let log = nvrtc(name, src, arch, &["--ptxas-options=-v"], |p| {
        unsafe { result::get_program_log(p) }.map(to_bytes)
    })?;
    Ok(parse_resources(&String::from_utf8_lossy(&log)))
}

/// The assembler's verbose report (`ptxas -v` through NVRTC) as a line per kernel: "name: N bytes
/// stack frame, ... spill loads; Used R registers, ...".
fn parse_resources(log: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut kernel = String::new();
    let mut parts: Vec<String> = Vec::new();
    for line in log.lines() {
        let line = line.trim().trim_start_matches("ptxas info    :").trim();
        if let Some(rest) = line.strip_prefix("Compiling entry function '") {
            kernel = rest.split('\'').next().unwrap_or("").to_string();
            parts.clear();
        } else if !kernel.is_empty() {
            // Stack lines come as "ptxas . N bytes stack frame, ..." (a continuation).
            let line = line
                .trim_start_matches("ptxas")
                .trim_start()
                .trim_start_matches('.');
            let line = line.trim();
            if line.contains("stack frame") || line.starts_with("Used ") {
                parts.push(line.to_string());
            }
            if line.starts_with("Used ") {
                out.push(format!("{kernel}: {}", parts.join("; ")));
                kernel.clear();
            }
        }
    }
    out
}

fn to_bytes(v: Vec<std::ffi::c_char>) -> Vec<u8> {
    v.into_iter().map(|c| c as u8).collect()
}

/// Runs NVRTC on `src` with the common header for `arch` and returns `output` of the compiled
/// program; a compile error carries NVRTC's log.
fn nvrtc(
    name: &str,
    src: &str,
    arch: &str,
    extra: &[&str],
    output: impl FnOnce(sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError>,
) -> Result<Vec<u8>, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::Unavailable(
            "libnvrtc was not found on the loader path (install the CUDA toolkit or the \
             nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let fail = |log: String| CudaError::Compile {
        file: name.to_string(),
        log,
    };
    let full = CString::new(format!("{COMMON_HEADER}\n#line 1 \"{name}\"\n{src}"))
        .map_err(|_| fail("a NUL byte in the source".into()))?;
    let cname = CString::new(name).map_err(|_| fail("a NUL byte in the name".into()))?;
    let mut options: Vec<String> = include_paths()
        .into_iter()
        .map(|p| format!("--include-path={p}"))
        .collect();
    options.push(format!("--gpu-architecture={}", file_arch(name, arch)));
    options.extend(NVRTC_OPTIONS.iter().chain(extra).map(|o| o.to_string()));
    if crate::steptrace::on() {
        options.push("-DMUSER_STEP_TRACE".into());
    }
    let prog = result::create_program(&full, Some(&cname)).map_err(|e| fail(format!("{e:?}")))?;
    // SAFETY: prog was created above and is destroyed once, at the end.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Ok(()) => output(prog).map_err(|e| fail(format!("{e:?}"))),
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(to_bytes)
                    .unwrap_or_default();
                let log = String::from_utf8_lossy(&log);
                Err(fail(format!("{e:?}\n{}", log.trim_end_matches('\0'))))
            }
        }
    };
    // SAFETY: prog is valid and not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The architecture a file is compiled for: mmh.cu's warpgroup MMAs (`wgmma`) need Hopper's
/// architecture-specific target, so on sm_90 it gets sm_90a (the other files keep sm_90).
pub fn file_arch<'a>(name: &str, arch: &'a str) -> &'a str {
    if name == "mmh.cu" && arch == "sm_90" {
        "sm_90a"
    } else {
        arch
    }
}

/// Where NVRTC finds `cuda_fp16.h`: CUDA_HOME/include or the nvidia-cuda-runtime wheel.
fn include_paths() -> Vec<String> {
    let mut v = Vec::new();
    for var in ["MUSER_CUDA_INCLUDE", "CUDA_HOME", "CUDA_PATH"] {
        if let Ok(p) = std::env::var(var) {
            let inc = if var == "MUSER_CUDA_INCLUDE" {
                p
            } else {
                format!("{p}/include")
            };
            v.push(inc);
        }
    }
    v.push("/usr/local/cuda/include".into());
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn resources_one_line_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'mvk_1' for 'sm_90'\n\
                   ptxas info    : Function properties for mvk_1\n\
                   ptxas         .     144 bytes stack frame, 60 bytes spill stores, 44 bytes spill loads\n\
                   ptxas info    : Used 128 registers, used 0 barriers, 144 bytes cumulative stack size\n\
                   ptxas info    : Compiling entry function 'rmsnorm' for 'sm_90'\n\
                   ptxas info    : Function properties for rmsnorm\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 32 registers, used 1 barriers, 128 bytes smem\n";
        assert_eq!(
            super::parse_resources(log),
            vec![
                "mvk_1: 144 bytes stack frame, 60 bytes spill stores, 44 bytes spill loads; Used 128 \
                 registers, used 0 barriers, 144 bytes cumulative stack size",
                "rmsnorm: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads; Used 32 \
                 registers, used 1 barriers, 128 bytes smem",
            ]
        );
    }
}
