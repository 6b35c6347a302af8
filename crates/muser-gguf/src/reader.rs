//! The GGUF reader: parses and validates the header, metadata and tensor infos of a file held in
//! one read-only memory map; tensor data are zero-copy slices of that map.
//!
//! Layout (GGUF v2/v3, little-endian):
//!   magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
//!   n_kv x (key: string, type u32, value)          string = u64 length + bytes
//!   n_tensors x (name: string, n_dims u32, dims u64[n_dims], type u32, offset u64)
//!   padding to `general.alignment` | data section (each tensor padded to the alignment)
//!
//! Every count and length read from the file is checked against the bytes left before anything
//! is allocated from it. The checks are at least those of ggml's own loader (`gguf.cpp`).
//! This module must never panic on any input bytes.

use crate::error::Num;
use crate::{GgmlType, GgufError, MetaType, MetaValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use std::collections::HashMap;
use std::path::Path;

/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// ggml's `GGML_MAX_NAME`: a tensor name must be shorter than this.
pub const MAX_TENSOR_NAME: u64 = 64;
/// Deepest nesting of arrays accepted (ggml accepts none; gguf-py writes any).
pub const MAX_ARRAY_NESTING: u32 = 8;
/// Smallest tensor info: name length + 1 byte of name + n_dims + type + offset.
const MIN_TENSOR_INFO: u64 = 8 + 1 + 4 + 4 + 8;
/// Smallest key/value: key length + 1 byte of key + type + a 1-byte value.
const MIN_KV: u64 = 8 + 1 + 4 + 1;

/// One tensor's description from the file's tensor info table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, innermost first (ggml's ne: `dims[0]` is the row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data (validated: fits in the file, no overflow).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (`dims[0]`).
    pub fn n_cols(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
    /// Number of rows: the product of every dimension but the first.
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// Where the file's bytes live: one read-only map of the file, or a buffer the caller gave.
enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A validated GGUF file. Metadata are kept in file order.
pub struct GgufFile {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section in the file.
    pub data_offset: u64,
    storage: Storage,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens and validates a file through one read-only memory map.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |error| GgufError::Io {
            path: path.display().to_string(),
            error,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // A directory opens on Linux; its map would fail with "No such device".
        if meta.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a GGUF file",
            )));
        }
        let len = meta.len();
        // mmap of an empty file fails on some systems; an empty file is simply truncated.
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only. As with every mmap-based loader, another process
            // truncating or rewriting the file while it is mapped is outside what we can guard.
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        Self::parse(storage)
    }

    /// Parses and validates an in-memory file (tests build corrupt files this way).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<GgufFile, GgufError> {
        let parsed = parse_layout(storage.bytes())?;
        let key_index = parsed
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            storage,
            key_index,
            tensor_index,
        })
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes: a zero-copy view into the map. `t` must come from this file's
    /// `tensors` (those are validated to fit); a `TensorInfo` that does not fit this file gives
    /// an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) => self.bytes().get(s as usize..e as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The bytes of the tensor named `name`, or an error naming it when it is absent.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor { name: name.into() })?;
        Ok(self.tensor_data(t))
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Tells the OS that this process no longer needs bytes `start .. start + len` of a
    /// memory-mapped file in memory (the whole pages inside that range): they leave the process's
    /// resident set, stay in the file (and in the page cache while the OS keeps them there), and
    /// are read again if touched. For weights a backend has copied into a layout of its own.
    /// Does nothing for a file read into a buffer, or where the OS does not take the advice.
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let Storage::Mmap(m) = &self.storage {
            let page = 4096;
            let (a, b) = (
                start.next_multiple_of(page),
                (start + len).min(m.len()) / page * page,
            );
            if a < b {
                // SAFETY: the map is a read-only shared map of the file (`Mmap::map`), which the
                // loader requires to stay unchanged while mapped: after MADV_DONTNEED the pages
                // are filled again from the file on the next access, with the same bytes, so
                // every slice borrowed from the map still reads what it read before.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a)
                };
            }
        }
        let _ = (start, len);
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }

    fn integer(&self, key: &str, target: &'static str) -> Result<i128, GgufError> {
        let v = self.require(key)?;
        v.as_integer().ok_or_else(|| wrong_type(key, target, v))
    }

    // Typed getters: a missing key or a value of another type is an error naming the key,
    // the expected type and the type found. Integer getters accept any integer type whose value
    // fits.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let i = self.integer(key, "an integer (u32)")?;
        u32::try_from(i).map_err(|_| out_of_range(key, i, "u32"))
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let i = self.integer(key, "an integer (u64)")?;
        u64::try_from(i).map_err(|_| out_of_range(key, i, "u64"))
    }
    /// An f32 (an f64 is narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            MetaValue::F32(v) => Ok(*v),
            MetaValue::F64(v) => Ok(*v as f32),
            v => Err(wrong_type(key, "f32", v)),
        }
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(wrong_type(key, "bool", v)),
        }
    }
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            v => Err(wrong_type(key, "str", v)),
        }
    }
    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaType::String, items) => {
                Ok(items.iter().filter_map(MetaValue::as_str).collect())
            }
            v => Err(wrong_type(key, "array of str", v)),
        }
    }
    /// An array of numbers converted to f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let v = self.require(key)?;
        let items = match v {
            MetaValue::Array(t, items) if is_numeric(*t) => items,
            _ => return Err(wrong_type(key, "array of numbers", v)),
        };
        Ok(items
            .iter()
            .filter_map(MetaValue::as_f64)
            .map(|x| x as f32)
            .collect())
    }
    /// An array of integers converted to i64 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.require(key)?;
        let items = match v {
            MetaValue::Array(t, items) if is_numeric(*t) && !is_float(*t) => items,
            _ => return Err(wrong_type(key, "array of integers", v)),
        };
        items
            .iter()
            .filter_map(MetaValue::as_integer)
            .map(|i| i64::try_from(i).map_err(|_| out_of_range(key, i, "i64")))
            .collect()
    }
}

fn is_float(t: MetaType) -> bool {
    matches!(t, MetaType::F32 | MetaType::F64)
}

fn is_numeric(t: MetaType) -> bool {
    !matches!(t, MetaType::Bool | MetaType::String | MetaType::Array)
}

fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
    GgufError::WrongType {
        key: key.into(),
        expected,
        found: found.type_description(),
    }
}

fn out_of_range(key: &str, value: i128, target: &'static str) -> GgufError {
    GgufError::ValueOutOfRange {
        key: key.into(),
        value: value.to_string(),
        target,
    }
}

/// Everything `GgufFile` holds except the storage.
struct Layout {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian cursor over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                need: n,
                left: self.left(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("{} (length)", what()))?;
        let offset = self.offset();
        if len > self.left() {
            return Err(GgufError::StringTooLong {
                what: what(),
                len,
                offset,
                left: self.left(),
            });
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }
}

fn parse_layout(buf: &[u8]) -> Result<Layout, GgufError> {
    let mut c = Cursor { buf, pos: 0 };

    // ---- header ----
    let magic_len = buf.len().min(4);
    if buf[..magic_len] != GGUF_MAGIC[..magic_len] {
        return Err(GgufError::BadMagic {
            found: buf[..magic_len].to_vec(),
        });
    }
    c.take(4, &|| "magic".into())?;
    let version = c.u32(&|| "version".into())?;
    if version == 0 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    // A version-3 file written big-endian reads as 0x03000000 here.
    if version & 0xFFFF == 0 {
        return Err(GgufError::WrongEndianness { version });
    }
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata key count".into())?;
    if n_kv > c.left() / MIN_KV {
        return Err(GgufError::TooManyKeys {
            count: n_kv,
            min_each: MIN_KV,
            offset: c.offset(),
            left: c.left(),
        });
    }
    // The tensor infos come after the metadata, so the keys' minimum size counts too.
    let left_for_tensors = c.left() - n_kv * MIN_KV;
    if n_tensors > left_for_tensors / MIN_TENSOR_INFO {
        return Err(GgufError::TooManyTensors {
            count: n_tensors,
            min_each: MIN_TENSOR_INFO,
            offset: c.offset(),
            left: left_for_tensors,
        });
    }

    // ---- metadata ----
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(n_kv as usize);
    let mut seen: HashMap<String, u64> = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_offset = c.offset();
        let key = c.string(&|| format!("metadata key {i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey {
                index: i,
                offset: key_offset,
            });
        }
        if let Some(&first) = seen.get(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                first,
                second: i,
            });
        }
        let ty = read_meta_type(&mut c, &key)?;
        let value = read_value(&mut c, ty, &key, 0)?;
        seen.insert(key.clone(), i);
        metadata.push((key, value));
    }

    let alignment = alignment_of(&metadata)?;

    // ---- tensor infos ----
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut names: HashMap<String, u64> = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info_offset = c.offset();
        let name = c.string(&|| format!("tensor info {i} name"))?;
        if name.is_empty() {
            return Err(GgufError::EmptyTensorName {
                index: i,
                offset: info_offset,
            });
        }
        if name.len() as u64 >= MAX_TENSOR_NAME {
            return Err(GgufError::TensorNameTooLong {
                len: name.len() as u64,
                name,
                max: MAX_TENSOR_NAME - 1,
            });
        }
        if let Some(&first) = names.get(&name) {
            return Err(GgufError::DuplicateTensor {
                name,
                first,
                second: i,
            });
        }
        let info = read_tensor_info(&mut c, name)?;
        names.insert(info.name.clone(), i);
        tensors.push(info);
    }

    // ---- data section ----
    let infos_end = c.offset();
    let file_len = buf.len() as u64;
    let data_offset = if n_tensors == 0 {
        infos_end
    } else {
        let aligned = align_up(infos_end, alignment);
        if aligned.is_none_or(|a| a > file_len) {
            return Err(GgufError::DataSectionPastEnd {
                data_offset: aligned.unwrap_or(u64::MAX),
                infos_end,
                alignment,
                file_len,
            });
        }
        aligned.unwrap_or(u64::MAX)
    };
    let data_len = file_len - data_offset;
    // ggml requires each offset to be the running sum of the padded sizes before it, which
    // rules out gaps, overlaps and reordering at once; each way of breaking it gets its own error.
    let mut expected = 0u64;
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset < expected {
            return Err(GgufError::TensorOverlap {
                tensor: t.name.clone(),
                offset: t.offset,
                expected,
            });
        }
        if t.offset > expected {
            return Err(GgufError::TensorGap {
                tensor: t.name.clone(),
                offset: t.offset,
                expected,
            });
        }
        if t.offset
            .checked_add(t.n_bytes)
            .is_none_or(|end| end > data_len)
        {
            let at = t.offset.min(data_len);
            return Err(GgufError::TensorPastEnd {
                tensor: t.name.clone(),
                need: t.n_bytes,
                offset: data_offset.saturating_add(t.offset),
                left: data_len - at,
            });
        }
        let padded = align_up(t.n_bytes, alignment);
        expected = match padded.and_then(|p| expected.checked_add(p)) {
            Some(e) => e,
            None => {
                return Err(GgufError::DataSizeOverflow {
                    tensor: t.name.clone(),
                    sum: expected,
                    size: t.n_bytes,
                })
            }
        };
    }

    Ok(Layout {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

fn read_meta_type(c: &mut Cursor, key: &str) -> Result<MetaType, GgufError> {
    let offset = c.offset();
    let id = c.u32(&|| format!("key {key}: value type"))?;
    MetaType::from_id(id).ok_or_else(|| GgufError::UnknownMetaType {
        key: key.into(),
        type_id: id,
        offset,
    })
}

fn read_value(c: &mut Cursor, ty: MetaType, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
    let what = || format!("key {key}: {} value", ty.name());
    Ok(match ty {
        MetaType::U8 => MetaValue::U8(c.array::<1>(&what)?[0]),
        MetaType::I8 => MetaValue::I8(c.array::<1>(&what)?[0] as i8),
        MetaType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        MetaType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        MetaType::U32 => MetaValue::U32(u32::from_le_bytes(c.array(&what)?)),
        MetaType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        MetaType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        MetaType::U64 => MetaValue::U64(u64::from_le_bytes(c.array(&what)?)),
        MetaType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        MetaType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
        MetaType::Bool => {
            let offset = c.offset();
            match c.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                value => {
                    return Err(GgufError::InvalidBool {
                        key: key.into(),
                        value,
                        offset,
                    })
                }
            }
        }
        MetaType::String => MetaValue::String(c.string(&|| format!("key {key}: string value"))?),
        MetaType::Array => {
            let array_offset = c.offset();
            if depth >= MAX_ARRAY_NESTING {
                return Err(GgufError::NestingTooDeep {
                    key: key.into(),
                    depth: depth + 1,
                    max: MAX_ARRAY_NESTING,
                    offset: array_offset,
                });
            }
            let elem = read_meta_type(c, key)?;
            let len = c.u64(&|| format!("key {key}: array length"))?;
            let min = elem.min_encoded_size();
            if len > c.left() / min {
                return Err(GgufError::ArrayTooLong {
                    key: key.into(),
                    len,
                    elem_type: elem,
                    need: len.saturating_mul(min),
                    offset: c.offset(),
                    left: c.left(),
                });
            }
            // `len` is now bounded by the bytes left, so this allocation is too.
            let mut items = Vec::with_capacity(len as usize);
            for _ in 0..len {
                items.push(read_value(c, elem, key, depth + 1)?);
            }
            MetaValue::Array(elem, items)
        }
    })
}

fn read_tensor_info(c: &mut Cursor, name: String) -> Result<TensorInfo, GgufError> {
    let n_dims = c.u32(&|| format!("tensor {name}: n_dims"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let v = c.u64(&|| format!("tensor {name}: dim {d}"))?;
        // ggml reads dims as int64 and rejects negative ones.
        if v > i64::MAX as u64 {
            return Err(GgufError::NegativeDim {
                tensor: name,
                dim: d,
                value: v as i64,
            });
        }
        dims.push(v);
    }
    let type_id = c.u32(&|| format!("tensor {name}: type"))?;
    let ggml_type = match GgmlType::from_id(type_id) {
        Some(t) => t,
        None => {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                type_id,
            })
        }
    };
    let n_bytes = tensor_n_bytes(&name, &dims, ggml_type)?;
    let offset = c.u64(&|| format!("tensor {name}: data offset"))?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Bytes of a tensor of this shape and type, after ggml's checks: no more than `MAX_DIMS` dims,
/// none above i64::MAX, the element count fits an i64, the row length is whole blocks, and the
/// byte count fits. The writer checks its specs with the same function.
pub(crate) fn tensor_n_bytes(
    name: &str,
    dims: &[u64],
    ggml_type: GgmlType,
) -> Result<u64, GgufError> {
    if dims.len() > MAX_DIMS as usize {
        return Err(GgufError::TooManyDims {
            tensor: name.into(),
            n_dims: dims.len() as u32,
            max: MAX_DIMS,
        });
    }
    if let Some((d, &v)) = dims.iter().enumerate().find(|(_, &v)| v > i64::MAX as u64) {
        return Err(GgufError::NegativeDim {
            tensor: name.into(),
            dim: d as u32,
            value: v as i64,
        });
    }
    let n_elements = match dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) {
        Some(n) if n <= i64::MAX as u64 => n,
        _ => {
            return Err(GgufError::ElementCountOverflow {
                tensor: name.into(),
                dims: dims.to_vec(),
            })
        }
    };
    let row_len = dims.first().copied().unwrap_or(1);
    let (block, type_size) = ggml_type.block_layout();
    if row_len % block as u64 != 0 {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: name.into(),
            ggml_type,
            row_len,
            block_size: block as u64,
        });
    }
    // Every row is whole blocks, so the element count is too.
    match (n_elements / block as u64).checked_mul(type_size as u64) {
        Some(b) if b <= usize::MAX as u64 => Ok(b),
        _ => Err(GgufError::ByteSizeOverflow {
            tensor: name.into(),
            ggml_type,
            dims: dims.to_vec(),
        }),
    }
}

impl std::fmt::Display for TensorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        write!(
            f,
            "{} {} [{}] at data offset {} ({} bytes)",
            self.name,
            self.ggml_type,
            dims.join(", "),
            Num(self.offset),
            Num(self.n_bytes)
        )
    }
}

/// `general.alignment` (default 32): a u32 that is a non-zero power of two.
pub(crate) fn alignment_of(metadata: &[(String, MetaValue)]) -> Result<u64, GgufError> {
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) => u64::from(*a),
        Some((_, v)) => {
            return Err(GgufError::AlignmentNotU32 {
                found: v.meta_type(),
            })
        }
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(GgufError::BadAlignment { alignment });
    }
    Ok(alignment)
}
