//! Every kernel source compiles with NVRTC to sm_90 machine code, through the kernel cache the
//! backend uses. Skipped (with a message) where libnvrtc is absent, unless MUSER_REQUIRE_NVRTC=1
//! (set by CI), which makes its absence a failure.

use muser_cuda::compile::{cache_path, kernel_image, ImageSource};

#[test]
fn every_kernel_source_compiles_for_sm_90_into_the_kernel_cache() {
    if !muser_cuda::nvrtc_available() {
        assert!(
            std::env::var("MUSER_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "MUSER_REQUIRE_NVRTC=1 but libnvrtc is not on the loader path"
        );
        eprintln!("skipped: libnvrtc not found");
        return;
    }
    // A cache of this test's own (this test binary is its own process).
    let dir = std::env::temp_dir().join(format!("muser-kernel-cache-{}", std::process::id()));
    std::env::set_var("MUSER_KERNEL_CACHE", &dir);
    let files = muser_cuda::KERNEL_SOURCES;
    let images: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|(file, src)| s.spawn(move || kernel_image(file, src, "sm_90")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((file, src), image) in files.iter().zip(images) {
        let names = muser_cuda::device::kernel_names(src);
        assert!(!names.is_empty(), "{file} defines no extern \"C\" kernel");
        let (image, from) = image.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(from, ImageSource::Nvrtc, "{file}: the cache was empty");
        // An ELF image, and the same bytes in the cache file.
        assert_eq!(&image[..4], b"\x7fELF", "{file}");
        let cached = std::fs::read(cache_path(&dir, file, src, "sm_90")).unwrap();
        assert_eq!(cached, image, "{file}");
        // Asked again: this process's copy.
        let (again, from) = kernel_image(file, src, "sm_90").unwrap();
        assert_eq!((again == image, from), (true, ImageSource::Process));
        // An edited source has another cache file.
        let edited = format!("{src}\n// edited\n");
        assert_ne!(
            cache_path(&dir, file, &edited, "sm_90"),
            cache_path(&dir, file, src, "sm_90")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
