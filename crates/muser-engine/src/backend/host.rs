//! Host memory for values a backend reads back at every step: a sequence's logits
//! (`Backend::host_buf`). The engine sees a slice of f32 either way; a backend may hand out memory
//! of its own kind (the CUDA backend's is page-locked, so a read lands in it by DMA with no
//! staging copy on the host).

use std::ops::{Deref, DerefMut};

/// Memory a backend provides for `HostBuf`: `n` f32 values it owns and frees when dropped.
pub trait HostMem: Send + Sync {
    fn values(&self) -> &[f32];
    fn values_mut(&mut self) -> &mut [f32];
}

/// f32 values on the host, in a `Vec` or in memory a backend provided (`HostMem`); a slice to
/// everyone who reads or writes them.
pub struct HostBuf(Inner);

enum Inner {
    Vec(Vec<f32>),
    Mem(Box<dyn HostMem>),
}

impl HostBuf {
    /// `n` zeros in a `Vec`: what a backend without memory of its own hands out.
    pub fn zeros(n: usize) -> HostBuf {
        HostBuf(Inner::Vec(vec![0.0; n]))
    }

    /// Values in memory a backend provides.
    pub fn from_mem(mem: Box<dyn HostMem>) -> HostBuf {
        HostBuf(Inner::Mem(mem))
    }

    /// Whether the values live in backend-provided memory (not a `Vec`).
    pub fn is_backend_mem(&self) -> bool {
        matches!(self.0, Inner::Mem(_))
    }
}

impl Default for HostBuf {
    fn default() -> HostBuf {
        HostBuf::zeros(0)
    }
}

impl Deref for HostBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match &self.0 {
            Inner::Vec(v) => v,
            Inner::Mem(m) => m.values(),
        }
    }
}

impl DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.0 {
            Inner::Vec(v) => v,
            Inner::Mem(m) => m.values_mut(),
        }
    }
}

impl std::fmt::Debug for HostBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf")
            .field("len", &self.len())
            .field("backend_mem", &self.is_backend_mem())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Backend memory that counts its drops.
    struct Counted(Vec<f32>, Arc<AtomicUsize>);
    impl HostMem for Counted {
        fn values(&self) -> &[f32] {
            &self.0
        }
        fn values_mut(&mut self) -> &mut [f32] {
            &mut self.0
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn both_kinds_read_and_write_as_slices_and_backend_memory_is_freed_once() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let n = 1000 + (next().abs() * 100.0) as usize;
        let vals: Vec<f32> = (0..n).map(|_| next()).collect();
        let drops = Arc::new(AtomicUsize::new(0));
        let mut a = HostBuf::zeros(n);
        let mut b = HostBuf::from_mem(Box::new(Counted(vec![1.0; n], drops.clone())));
        assert!(a.iter().all(|&x| x == 0.0) && !a.is_backend_mem());
        assert!(b.is_backend_mem() && b.len() == n);
        a.copy_from_slice(&vals);
        b[..].copy_from_slice(&vals);
        assert_eq!(&a[..], &vals[..]);
        assert_eq!(&b[..], &a[..]);
        // Taken out and put back, as a prefill does with a session's logits.
        let taken = std::mem::take(&mut b);
        assert_eq!(b.len(), 0);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        b = taken;
        assert_eq!(b[n - 1], vals[n - 1]);
        drop(b);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
