//! Every way a GGUF file can be rejected, each naming the key or tensor and the numbers involved.

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("I/O error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
}
