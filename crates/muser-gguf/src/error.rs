//! Every way a GGUF file can be rejected, each naming the key or tensor and the numbers involved.
//!
//! Offsets in messages are absolute byte offsets in the file unless they say "data offset"
//! (relative to the start of the data section, as stored in a tensor info).

use crate::{GgmlType, MetaType};

/// Formats an integer with thousands separators ("1,720,320"), for messages.
pub(crate) struct Num(pub u64);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.0.to_string();
        let mut out = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        f.write_str(&out)
    }
}

fn n(v: &u64) -> Num {
    Num(*v)
}

fn dims_str(d: &[u64]) -> String {
    let parts: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    // `error` is not marked as the source: the message already carries it, and a source would
    // print it twice in an error chain ("...: No such file or directory: No such file ...").
    #[error("I/O error on {path}: {error}")]
    Io { path: String, error: std::io::Error },

    // ---- header ----
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: Vec<u8> },
    #[error("GGUF version {version} is not supported (this reader reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "GGUF version {version} (0x{version:08x}) looks byte-swapped: the file is probably big-endian, \
         only little-endian files are read"
    )]
    WrongEndianness { version: u32 },
    #[error(
        "{what} at offset {} needs {} bytes; the file has {} left",
        n(offset),
        n(need),
        n(left)
    )]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        left: u64,
    },
    #[error(
        "the header says {} tensors, but each tensor info takes at least {min_each} bytes and only {} \
         bytes are left after offset {}",
        n(count), n(left), n(offset)
    )]
    TooManyTensors {
        count: u64,
        min_each: u64,
        offset: u64,
        left: u64,
    },
    #[error(
        "the header says {} metadata keys, but each takes at least {min_each} bytes and only {} bytes \
         are left after offset {}",
        n(count), n(left), n(offset)
    )]
    TooManyKeys {
        count: u64,
        min_each: u64,
        offset: u64,
        left: u64,
    },

    // ---- metadata ----
    #[error(
        "{what}: string of {} bytes at offset {}; the file has {} left",
        n(len),
        n(offset),
        n(left)
    )]
    StringTooLong {
        what: String,
        len: u64,
        offset: u64,
        left: u64,
    },
    #[error(
        "key {key}: array of {} {elem_type:?} elements needs at least {} bytes at offset {}; the file \
         has {} left",
        n(len), n(need), n(offset), n(left)
    )]
    ArrayTooLong {
        key: String,
        len: u64,
        elem_type: MetaType,
        need: u64,
        offset: u64,
        left: u64,
    },
    #[error("{what} at offset {} is not valid UTF-8", n(offset))]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key {index} (at offset {}) is empty", n(offset))]
    EmptyKey { index: u64, offset: u64 },
    #[error("duplicate metadata key {key}: keys {first} and {second}")]
    DuplicateKey {
        key: String,
        first: u64,
        second: u64,
    },
    #[error(
        "key {key}: unknown metadata value type {type_id} at offset {} (known: 0..=12)",
        n(offset)
    )]
    UnknownMetaType {
        key: String,
        type_id: u32,
        offset: u64,
    },
    #[error(
        "key {key}: arrays nested {depth} deep at offset {} (at most {max} allowed)",
        n(offset)
    )]
    NestingTooDeep {
        key: String,
        depth: u32,
        max: u32,
        offset: u64,
    },
    #[error(
        "key {key}: bool byte at offset {} is {value}, expected 0 or 1",
        n(offset)
    )]
    InvalidBool { key: String, value: u8, offset: u64 },
    #[error("key general.alignment must be a u32, found {found:?}")]
    AlignmentNotU32 { found: MetaType },
    #[error("general.alignment is {alignment}: it must be a non-zero power of two")]
    BadAlignment { alignment: u64 },

    // ---- tensor infos ----
    #[error("tensor info {index} (at offset {}) has an empty name", n(offset))]
    EmptyTensorName { index: u64, offset: u64 },
    #[error("tensor {name}: name is {len} bytes long; ggml allows at most {max}")]
    TensorNameTooLong { name: String, len: u64, max: u64 },
    #[error("duplicate tensor name {name}: tensor infos {first} and {second}")]
    DuplicateTensor {
        name: String,
        first: u64,
        second: u64,
    },
    #[error("tensor {tensor}: {n_dims} dimensions; at most {max} allowed")]
    TooManyDims {
        tensor: String,
        n_dims: u32,
        max: u32,
    },
    #[error("tensor {tensor}: dimension {dim} is {value} (negative as ggml's int64 ne)")]
    NegativeDim {
        tensor: String,
        dim: u32,
        value: i64,
    },
    #[error(
        "tensor {tensor}: dims {} hold more than i64::MAX elements",
        dims_str(dims)
    )]
    ElementCountOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor {tensor}: unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error(
        "tensor {tensor}: row length {} is not a multiple of {ggml_type}'s block size {block_size}",
        n(row_len)
    )]
    RowNotBlockMultiple {
        tensor: String,
        ggml_type: GgmlType,
        row_len: u64,
        block_size: u64,
    },
    #[error(
        "tensor {tensor}: {ggml_type} dims {} take more than u64::MAX bytes",
        dims_str(dims)
    )]
    ByteSizeOverflow {
        tensor: String,
        ggml_type: GgmlType,
        dims: Vec<u64>,
    },

    // ---- data section ----
    #[error(
        "the data section would start at offset {} (tensor infos end at {}, aligned to {alignment}); \
         the file is {} bytes",
        n(data_offset), n(infos_end), n(file_len)
    )]
    DataSectionPastEnd {
        data_offset: u64,
        infos_end: u64,
        alignment: u64,
        file_len: u64,
    },
    #[error(
        "tensor {tensor}: data offset {} is not a multiple of the alignment {alignment}",
        n(offset)
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {tensor}: data offset {} overlaps the data before it, which runs (padded) to {}",
        n(offset),
        n(expected)
    )]
    TensorOverlap {
        tensor: String,
        offset: u64,
        expected: u64,
    },
    #[error(
        "tensor {tensor}: data offset {} leaves a gap; the previous tensors end (padded) at {}",
        n(offset),
        n(expected)
    )]
    TensorGap {
        tensor: String,
        offset: u64,
        expected: u64,
    },
    #[error(
        "tensor {tensor} needs {} bytes at offset {}; the file has {} left",
        n(need),
        n(offset),
        n(left)
    )]
    TensorPastEnd {
        tensor: String,
        need: u64,
        offset: u64,
        left: u64,
    },
    #[error(
        "tensor {tensor}: data section size overflows after {} + {} bytes",
        n(sum),
        n(size)
    )]
    DataSizeOverflow { tensor: String, sum: u64, size: u64 },

    // ---- typed getters ----
    #[error("metadata key {key} is missing")]
    MissingKey { key: String },
    #[error("metadata key {key}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {key}: value {value} does not fit in {target}")]
    ValueOutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("tensor {name} is missing")]
    MissingTensor { name: String },

    // ---- writer ----
    #[error("key {key}: array declared as {declared:?} holds a {found:?} at index {index}")]
    ArrayElementType {
        key: String,
        declared: MetaType,
        found: MetaType,
        index: u64,
    },
    #[error(
        "tensor {tensor}: got {} bytes of data, its spec ({ggml_type} {}) needs {}",
        n(got),
        dims_str(dims),
        n(expected)
    )]
    WrongDataLength {
        tensor: String,
        ggml_type: GgmlType,
        dims: Vec<u64>,
        expected: u64,
        got: u64,
    },
    #[error(
        "write_tensor called {} times but the writer was given {} tensors",
        n(calls),
        n(count)
    )]
    TooManyTensorWrites { calls: u64, count: u64 },
    #[error(
        "finish called after {} of {} tensors; next unwritten tensor is {next}",
        n(written),
        n(count)
    )]
    TensorsNotWritten {
        written: u64,
        count: u64,
        next: String,
    },
}
