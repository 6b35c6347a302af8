//! GGUF files: the reader (one read-only memory map, full validation, zero-copy tensor views)
//! and the writer (streaming, so multi-gigabyte files never sit in memory).
//!
//! This crate owns the file format and the table of ggml tensor types (ids, block sizes, bytes
//! per block). It never interprets tensor bytes: that is `muser-quant`'s job.

mod error;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo, MAX_ARRAY_NESTING, MAX_DIMS, MAX_TENSOR_NAME};
pub use types::GgmlType;
pub use value::{MetaType, MetaValue};
pub use writer::{write_file, write_to_vec, GgufWriter, TensorSpec, GGUF_VERSION};

/// Default `general.alignment` when the key is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
