//! NVRTC compilation of the kernel sources in `kernels/`. `common.cuh` is prepended to every
//! source, `kq_mma.cuh` (the integer tensor-core pieces) to mmk.cu and mmt.cu (NVRTC has no
//! file system include path for our headers).

use crate::device::CudaError;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

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

/// PTX already compiled in this process, by (file, arch): every backend opened after the first
/// (`muser check` opens several) skips NVRTC.
static COMPILED: std::sync::Mutex<Vec<(String, &'static str, Ptx)>> =
    std::sync::Mutex::new(Vec::new());

/// `compile_source`, once per (file, arch) and process.
pub fn compile_cached(name: &str, src: &str, arch: &'static str) -> Result<Ptx, CudaError> {
    if let Some((_, _, ptx)) = COMPILED
        .lock()
        .unwrap()
        .iter()
        .find(|(n, a, _)| n == name && *a == arch)
    {
        return Ok(ptx.clone());
    }
    let ptx = compile_source(name, src, arch)?;
    COMPILED
        .lock()
        .unwrap()
        .push((name.to_string(), arch, ptx.clone()));
    Ok(ptx)
}

/// Compiles one source (with the common header) to PTX for `arch` (e.g. "sm_90").
pub fn compile_source(name: &str, src: &str, arch: &'static str) -> Result<Ptx, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::Unavailable(
            "libnvrtc was not found on the loader path (install the CUDA toolkit or the \
             nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let full = format!("{COMMON_HEADER}\n#line 1 \"{name}\"\n{src}");
    let opts = CompileOptions {
        arch: Some(arch),
        name: Some(name.to_string()),
        options: vec!["--std=c++17".into()],
        include_paths: include_paths(),
        ..Default::default()
    };
    compile_ptx_with_opts(full, opts).map_err(|e| CudaError::Compile {
        file: name.to_string(),
        log: format!("{e:?}"),
    })
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
