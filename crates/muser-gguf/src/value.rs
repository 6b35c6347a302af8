//! GGUF metadata values: the thirteen value types, arrays (possibly nested) included.

/// The type id of a metadata value as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

/// One metadata value. Arrays keep their element type so that an empty array round-trips.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaType {
    /// All value types, in id order.
    pub const ALL: [MetaType; 13] = [
        MetaType::U8,
        MetaType::I8,
        MetaType::U16,
        MetaType::I16,
        MetaType::U32,
        MetaType::I32,
        MetaType::F32,
        MetaType::Bool,
        MetaType::String,
        MetaType::Array,
        MetaType::U64,
        MetaType::I64,
        MetaType::F64,
    ];

    /// The type with this id, or `None` for an id GGUF does not define.
    pub fn from_id(id: u32) -> Option<MetaType> {
        Self::ALL.get(id as usize).copied()
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short name as ggml prints it ("u32", "str", "arr").
    pub fn name(self) -> &'static str {
        match self {
            MetaType::U8 => "u8",
            MetaType::I8 => "i8",
            MetaType::U16 => "u16",
            MetaType::I16 => "i16",
            MetaType::U32 => "u32",
            MetaType::I32 => "i32",
            MetaType::F32 => "f32",
            MetaType::Bool => "bool",
            MetaType::String => "str",
            MetaType::Array => "arr",
            MetaType::U64 => "u64",
            MetaType::I64 => "i64",
            MetaType::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string is at least its u64
    /// length, an array at least its element type and u64 count). Used to bound counts read from
    /// a file before anything is allocated.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            MetaType::U8 | MetaType::I8 | MetaType::Bool => 1,
            MetaType::U16 | MetaType::I16 => 2,
            MetaType::U32 | MetaType::I32 | MetaType::F32 => 4,
            MetaType::U64 | MetaType::I64 | MetaType::F64 | MetaType::String => 8,
            MetaType::Array => 12,
        }
    }
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(..) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// A description of the type for messages: "u32", "array of str", "array of array of u8".
    pub fn type_description(&self) -> String {
        match self {
            MetaValue::Array(t, items) => match (t, items.first()) {
                (MetaType::Array, Some(first)) => format!("array of {}", first.type_description()),
                _ => format!("array of {}", t.name()),
            },
            v => v.meta_type().name().to_string(),
        }
    }

    /// The value as an i128 when it is an integer of any width (bools are not integers).
    pub fn as_integer(&self) -> Option<i128> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as an f64 when it is a number (integer or float).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_integer().map(|i| i as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements when the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}
