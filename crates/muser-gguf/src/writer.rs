//! The GGUF writer: metadata and tensor infos first, then tensor data streamed one tensor at a
//! time, each padded to the alignment.
//!
//! The writer refuses to produce anything the reader would reject: keys and tensor names are
//! checked (empty, duplicate, too long), shapes pass the reader's own shape check, arrays hold
//! only their declared element type, and `general.alignment` must be a power-of-two u32.

use crate::reader::{tensor_n_bytes, MAX_ARRAY_NESTING, MAX_TENSOR_NAME};
use crate::{GgmlType, GgufError, MetaValue, GGUF_MAGIC};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// The GGUF version this writer produces.
pub const GGUF_VERSION: u32 = 3;

/// What the writer needs to know of a tensor before its data: name, dims (innermost first), type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dims: &[u64], ggml_type: GgmlType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type,
        }
    }

    /// Bytes of data this tensor takes, or the shape error the reader would give.
    pub fn n_bytes(&self) -> Result<u64, GgufError> {
        tensor_n_bytes(&self.name, &self.dims, self.ggml_type)
    }
}

/// Streaming GGUF (version 3) writer. The header, metadata and tensor infos are written by
/// `new`; then `write_tensor` is called once per tensor, in the order of `tensors`, and
/// `finish` checks that every tensor was written and flushes.
///
/// ```ignore
/// let mut w = GgufWriter::create(path, &metadata, &specs)?;
/// for bytes in data { w.write_tensor(&bytes)?; }
/// w.finish()?;
/// ```
/// `general.alignment` in `metadata` (a u32), when present, sets the alignment.
pub struct GgufWriter<W: Write> {
    out: W,
    /// Names the sink in I/O errors (the path, or "<stream>").
    label: String,
    tensors: Vec<TensorSpec>,
    /// Bytes of each tensor, in order.
    sizes: Vec<u64>,
    alignment: u64,
    /// Tensors written so far.
    next: usize,
    /// Bytes written so far (to compute padding).
    pos: u64,
}

impl GgufWriter<std::io::BufWriter<std::fs::File>> {
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &[(String, MetaValue)],
        tensors: &[TensorSpec],
    ) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        // Validate before creating the file so a bad spec leaves nothing behind.
        let plan = Plan::new(metadata, tensors)?;
        let file = std::fs::File::create(path).map_err(|error| GgufError::Io {
            path: label.clone(),
            error,
        })?;
        Self::start(
            std::io::BufWriter::new(file),
            label,
            metadata,
            tensors,
            plan,
        )
    }
}

/// The checked facts a writer needs before it writes a byte.
struct Plan {
    sizes: Vec<u64>,
    alignment: u64,
}

impl Plan {
    fn new(metadata: &[(String, MetaValue)], tensors: &[TensorSpec]) -> Result<Plan, GgufError> {
        let mut keys: HashMap<&str, u64> = HashMap::new();
        for (i, (key, value)) in metadata.iter().enumerate() {
            if key.is_empty() {
                return Err(GgufError::EmptyKey {
                    index: i as u64,
                    offset: 0,
                });
            }
            if let Some(&first) = keys.get(key.as_str()) {
                return Err(GgufError::DuplicateKey {
                    key: key.clone(),
                    first,
                    second: i as u64,
                });
            }
            keys.insert(key, i as u64);
            check_value(key, value, 0)?;
        }
        let alignment = crate::reader::alignment_of(metadata)?;
        let mut names: HashMap<&str, u64> = HashMap::new();
        let mut sizes = Vec::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if t.name.is_empty() {
                return Err(GgufError::EmptyTensorName {
                    index: i as u64,
                    offset: 0,
                });
            }
            if t.name.len() as u64 >= MAX_TENSOR_NAME {
                return Err(GgufError::TensorNameTooLong {
                    name: t.name.clone(),
                    len: t.name.len() as u64,
                    max: MAX_TENSOR_NAME - 1,
                });
            }
            if let Some(&first) = names.get(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor {
                    name: t.name.clone(),
                    first,
                    second: i as u64,
                });
            }
            names.insert(&t.name, i as u64);
            sizes.push(t.n_bytes()?);
        }
        Ok(Plan { sizes, alignment })
    }
}

/// Checks that arrays hold only their declared type and are not nested deeper than the reader
/// accepts.
fn check_value(key: &str, value: &MetaValue, depth: u32) -> Result<(), GgufError> {
    if let MetaValue::Array(declared, items) = value {
        if depth >= MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.into(),
                depth: depth + 1,
                max: MAX_ARRAY_NESTING,
                offset: 0,
            });
        }
        for (i, item) in items.iter().enumerate() {
            if item.meta_type() != *declared {
                return Err(GgufError::ArrayElementType {
                    key: key.into(),
                    declared: *declared,
                    found: item.meta_type(),
                    index: i as u64,
                });
            }
            check_value(key, item, depth + 1)?;
        }
    }
    Ok(())
}

impl<W: Write> GgufWriter<W> {
    pub fn new(
        out: W,
        metadata: &[(String, MetaValue)],
        tensors: &[TensorSpec],
    ) -> Result<Self, GgufError> {
        let plan = Plan::new(metadata, tensors)?;
        Self::start(out, "<stream>".into(), metadata, tensors, plan)
    }

    fn start(
        out: W,
        label: String,
        metadata: &[(String, MetaValue)],
        tensors: &[TensorSpec],
        plan: Plan,
    ) -> Result<Self, GgufError> {
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut head, key);
            head.extend_from_slice(&value.meta_type().id().to_le_bytes());
            put_value(&mut head, value);
        }
        let mut offset = 0u64;
        for (t, &size) in tensors.iter().zip(&plan.sizes) {
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += pad_len(size, plan.alignment) + size;
        }
        let mut w = GgufWriter {
            out,
            label,
            tensors: tensors.to_vec(),
            sizes: plan.sizes,
            alignment: plan.alignment,
            next: 0,
            pos: 0,
        };
        w.put(&head)?;
        w.pad()?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.out.write_all(bytes).map_err(|error| GgufError::Io {
            path: self.label.clone(),
            error,
        })?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zeros up to the next multiple of the alignment.
    fn pad(&mut self) -> Result<(), GgufError> {
        let zeros = vec![0u8; pad_len(self.pos, self.alignment) as usize];
        self.put(&zeros)
    }

    /// Writes the next tensor's bytes; their length must equal the spec's byte size.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let (Some(spec), Some(&expected)) =
            (self.tensors.get(self.next), self.sizes.get(self.next))
        else {
            return Err(GgufError::TooManyTensorWrites {
                calls: self.next as u64 + 1,
                count: self.tensors.len() as u64,
            });
        };
        if data.len() as u64 != expected {
            return Err(GgufError::WrongDataLength {
                tensor: spec.name.clone(),
                ggml_type: spec.ggml_type,
                dims: spec.dims.clone(),
                expected,
                got: data.len() as u64,
            });
        }
        self.put(data)?;
        self.pad()?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every tensor was written, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(spec) = self.tensors.get(self.next) {
            return Err(GgufError::TensorsNotWritten {
                written: self.next as u64,
                count: self.tensors.len() as u64,
                next: spec.name.clone(),
            });
        }
        self.out.flush().map_err(|error| GgufError::Io {
            path: self.label.clone(),
            error,
        })?;
        Ok(self.out)
    }
}

fn pad_len(pos: u64, alignment: u64) -> u64 {
    (alignment - pos % alignment) % alignment
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.push(*v as u8),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(t, items) => {
            out.extend_from_slice(&t.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            // A nested array element is written as its element type, count and items, with no
            // value type of its own (it is the outer array's element type): gguf-py's layout.
            for item in items {
                put_value(out, item);
            }
        }
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// Writes a whole file from in-memory tensors (tests and small models).
pub fn write_file(
    path: impl AsRef<Path>,
    metadata: &[(String, MetaValue)],
    tensors: &[(TensorSpec, Vec<u8>)],
) -> Result<(), GgufError> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::create(path, metadata, &specs)?;
    for (_, data) in tensors {
        w.write_tensor(data)?;
    }
    w.finish()?;
    Ok(())
}

/// Writes a whole file into memory (tests, and files built to be parsed again at once).
pub fn write_to_vec(
    metadata: &[(String, MetaValue)],
    tensors: &[(TensorSpec, Vec<u8>)],
) -> Result<Vec<u8>, GgufError> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(Vec::new(), metadata, &specs)?;
    for (_, data) in tensors {
        w.write_tensor(data)?;
    }
    w.finish()
}
