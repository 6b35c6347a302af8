//! A catalogue of hand-made corrupt GGUF files, one per check the reader makes; each asserts the
//! specific error variant, not just that parsing failed.

use muser_gguf::{GgmlType, GgufError, GgufFile, MetaType, MetaValue, TensorSpec};

/// Builds a GGUF file byte by byte.
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version, tensor count and key count.
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A key with a u32 value.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key).u32(MetaType::U32 as u32).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zeros up to a multiple of `align`.
    fn pad(&mut self, align: usize) -> &mut Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn err(r: &Raw) -> GgufError {
    match r.parse() {
        Ok(_) => panic!("corrupt file parsed cleanly"),
        Err(e) => e,
    }
}

/// A valid file with one F32 tensor of 8 values, for comparison with the corrupt ones.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Raw {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", dims, ty, offset).pad(32).zeros(data);
    r
}

#[test]
fn baseline_files_parse() {
    let f = one_tensor(&[8], 0, 0, 32).parse().unwrap();
    assert_eq!(f.tensors[0].n_bytes, 32);
    assert_eq!(f.data_offset % 32, 0);
    // Version 2 has the same layout as version 3.
    let mut r = Raw::header(2, 0, 1);
    r.kv_u32("a", 7);
    let f = r.parse().unwrap();
    assert_eq!((f.version, f.get_u32("a").unwrap()), (2, 7));
    // ggml accepts n_dims = 0 (a scalar: one element) and zero-sized dims.
    let f = one_tensor(&[], 0, 0, 32).parse().unwrap();
    assert_eq!((f.tensors[0].n_elements(), f.tensors[0].n_bytes), (1, 4));
    let f = one_tensor(&[0, 5], 0, 0, 0).parse().unwrap();
    assert_eq!(f.tensors[0].n_bytes, 0);
}

#[test]
fn empty_file() {
    assert!(matches!(
        err(&Raw(vec![])),
        GgufError::Truncated {
            need: 4,
            left: 0,
            ..
        }
    ));
}

#[test]
fn bad_magic() {
    let mut r = Raw::header(3, 0, 0);
    r.0[3] = b'G';
    assert!(matches!(err(&r), GgufError::BadMagic { ref found } if found == b"GGUG"));
}

#[test]
fn version_0_1_and_4_rejected() {
    for v in [0, 1, 4, 0x1234] {
        assert!(
            matches!(err(&Raw::header(v, 0, 0)), GgufError::UnsupportedVersion { version } if version == v),
            "version {v}"
        );
    }
}

#[test]
fn big_endian_version() {
    let r = Raw::header(3u32.swap_bytes(), 0, 0);
    assert!(matches!(
        err(&r),
        GgufError::WrongEndianness {
            version: 0x0300_0000
        }
    ));
}

#[test]
fn truncated_header() {
    let mut r = Raw(b"GGUF".to_vec());
    r.u32(3).u64(0);
    assert!(matches!(
        err(&r),
        GgufError::Truncated {
            offset: 16,
            need: 8,
            left: 0,
            ..
        }
    ));
}

#[test]
fn tensor_count_beyond_file() {
    let r = Raw::header(3, 1_000_000, 0);
    assert!(matches!(
        err(&r),
        GgufError::TooManyTensors {
            count: 1_000_000,
            left: 0,
            ..
        }
    ));
}

#[test]
fn key_count_beyond_file() {
    let mut r = Raw::header(3, 0, 3);
    r.kv_u32("a", 1);
    assert!(matches!(err(&r), GgufError::TooManyKeys { count: 3, .. }));
}

#[test]
fn key_length_beyond_file() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 40).zeros(16);
    assert!(matches!(err(&r), GgufError::StringTooLong { len, left: 16, .. } if len == 1 << 40));
}

#[test]
fn string_value_length_beyond_file() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(MetaType::String as u32)
        .u64(u64::MAX)
        .zeros(8);
    assert!(matches!(
        err(&r),
        GgufError::StringTooLong { len: u64::MAX, .. }
    ));
}

#[test]
fn empty_key() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("", 1).zeros(8);
    assert!(matches!(
        err(&r),
        GgufError::EmptyKey {
            index: 0,
            offset: 24
        }
    ));
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 3);
    r.kv_u32("a", 1).kv_u32("b", 2).kv_u32("a", 3);
    assert!(
        matches!(err(&r), GgufError::DuplicateKey { ref key, first: 0, second: 2 } if key == "a")
    );
}

#[test]
fn unknown_value_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    assert!(matches!(
        err(&r),
        GgufError::UnknownMetaType { type_id: 13, .. }
    ));
}

#[test]
fn unknown_array_element_type() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(MetaType::Array as u32)
        .u32(99)
        .u64(1)
        .zeros(8);
    assert!(matches!(
        err(&r),
        GgufError::UnknownMetaType { type_id: 99, .. }
    ));
}

#[test]
fn array_length_beyond_file() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(MetaType::Array as u32)
        .u32(MetaType::U32 as u32)
        .u64(5)
        .zeros(16);
    assert!(matches!(
        err(&r),
        GgufError::ArrayTooLong {
            len: 5,
            elem_type: MetaType::U32,
            need: 20,
            left: 16,
            ..
        }
    ));
}

#[test]
fn string_array_count_beyond_file() {
    // 1,000 strings need at least 8 bytes each for their lengths.
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(MetaType::Array as u32)
        .u32(MetaType::String as u32)
        .u64(1000)
        .zeros(100);
    assert!(matches!(
        err(&r),
        GgufError::ArrayTooLong {
            len: 1000,
            need: 8000,
            ..
        }
    ));
}

#[test]
fn array_element_string_truncated() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k")
        .u32(MetaType::Array as u32)
        .u32(MetaType::String as u32)
        .u64(2)
        .str("ab")
        .u64(9);
    r.bytes(b"short");
    assert!(matches!(
        err(&r),
        GgufError::StringTooLong {
            len: 9,
            left: 5,
            ..
        }
    ));
}

#[test]
fn arrays_nested_too_deep() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(MetaType::Array as u32);
    for _ in 0..20 {
        r.u32(MetaType::Array as u32).u64(1);
    }
    r.u32(MetaType::U8 as u32).u64(0).zeros(64);
    assert!(matches!(
        err(&r),
        GgufError::NestingTooDeep {
            depth: 9,
            max: 8,
            ..
        }
    ));
}

#[test]
fn key_not_utf8() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(2)
        .bytes(&[0xff, 0xfe])
        .u32(MetaType::U8 as u32)
        .bytes(&[1]);
    assert!(matches!(err(&r), GgufError::InvalidUtf8 { offset: 32, .. }));
}

#[test]
fn bool_not_0_or_1() {
    let mut r = Raw::header(3, 0, 1);
    r.str("flag").u32(MetaType::Bool as u32).bytes(&[2]);
    assert!(matches!(err(&r), GgufError::InvalidBool { ref key, value: 2, .. } if key == "flag"));
}

#[test]
fn truncated_metadata_value() {
    let mut r = Raw::header(3, 0, 1);
    r.str("some.key")
        .u32(MetaType::U64 as u32)
        .bytes(&[1, 2, 3]);
    // the minimum-size bound passes (14 bytes per key), the u64 itself does not fit
    let e = err(&r);
    assert!(
        matches!(e, GgufError::Truncated { need: 8, left: 3, ref what, .. } if what.contains("some.key"))
    );
}

#[test]
fn alignment_not_u32() {
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(MetaType::U64 as u32).u64(32);
    assert!(matches!(
        err(&r),
        GgufError::AlignmentNotU32 {
            found: MetaType::U64
        }
    ));
}

#[test]
fn alignment_zero() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    assert!(matches!(err(&r), GgufError::BadAlignment { alignment: 0 }));
}

#[test]
fn alignment_not_power_of_two() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 48);
    assert!(matches!(err(&r), GgufError::BadAlignment { alignment: 48 }));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut r = Raw::header(3, 2, 1);
    r.kv_u32("general.alignment", 64)
        .tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 64);
    r.pad(64).zeros(128);
    let f = r.parse().unwrap();
    assert_eq!(
        (f.alignment, f.data_offset % 64, f.tensors[1].offset),
        (64, 0, 64)
    );
}

#[test]
fn empty_tensor_name() {
    let r = one_tensor(&[8], 0, 0, 32);
    let mut bad = Raw::header(3, 1, 0);
    bad.tensor("", &[8], 0, 0).pad(32).zeros(32);
    assert!(r.parse().is_ok());
    assert!(matches!(
        err(&bad),
        GgufError::EmptyTensorName {
            index: 0,
            offset: 24
        }
    ));
}

#[test]
fn tensor_name_not_utf8() {
    let mut r = Raw::header(3, 1, 0);
    r.u64(1)
        .bytes(&[0x80])
        .u32(1)
        .u64(8)
        .u32(0)
        .u64(0)
        .pad(32)
        .zeros(32);
    assert!(matches!(err(&r), GgufError::InvalidUtf8 { .. }));
}

#[test]
fn tensor_name_too_long() {
    let name = "x".repeat(64);
    let mut r = Raw::header(3, 1, 0);
    r.tensor(&name, &[8], 0, 0).pad(32).zeros(32);
    assert!(matches!(
        err(&r),
        GgufError::TensorNameTooLong {
            len: 64,
            max: 63,
            ..
        }
    ));
    // 63 bytes is fine
    let mut r = Raw::header(3, 1, 0);
    r.tensor(&name[..63], &[8], 0, 0).pad(32).zeros(32);
    assert!(r.parse().is_ok());
}

#[test]
fn duplicate_tensor_name() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .zeros(64);
    assert!(matches!(
        err(&r),
        GgufError::DuplicateTensor {
            first: 0,
            second: 1,
            ..
        }
    ));
}

#[test]
fn too_many_dims() {
    let r = one_tensor(&[8, 1, 1, 1, 1], 0, 0, 32);
    assert!(matches!(
        err(&r),
        GgufError::TooManyDims {
            n_dims: 5,
            max: 4,
            ..
        }
    ));
}

#[test]
fn negative_dim() {
    let r = one_tensor(&[8, u64::MAX], 0, 0, 32);
    assert!(matches!(
        err(&r),
        GgufError::NegativeDim {
            dim: 1,
            value: -1,
            ..
        }
    ));
}

#[test]
fn element_count_overflow() {
    let r = one_tensor(&[1 << 32, 1 << 32], 0, 0, 32);
    assert!(matches!(err(&r), GgufError::ElementCountOverflow { .. }));
    let r = one_tensor(&[1 << 40, 1 << 20, 1 << 3], 0, 0, 32);
    assert!(matches!(err(&r), GgufError::ElementCountOverflow { .. }));
}

#[test]
fn byte_size_overflow() {
    // 2^62 F64 elements fit an i64 count but take 2^65 bytes.
    let r = one_tensor(&[1 << 62], GgmlType::F64 as u32, 0, 32);
    assert!(matches!(
        err(&r),
        GgufError::ByteSizeOverflow {
            ggml_type: GgmlType::F64,
            ..
        }
    ));
}

#[test]
fn unknown_tensor_type() {
    // 4 and 5 were Q4_2 and Q4_3, 31 was Q4_0_4_4, all removed from ggml; 42 is past the table.
    for id in [4, 5, 31, 36, 42, u32::MAX] {
        let r = one_tensor(&[32], id, 0, 64);
        assert!(
            matches!(err(&r), GgufError::UnknownTensorType { type_id, .. } if type_id == id),
            "{id}"
        );
    }
}

#[test]
fn row_not_block_multiple() {
    let r = one_tensor(&[33, 2], GgmlType::Q8_0 as u32, 0, 128);
    assert!(matches!(
        err(&r),
        GgufError::RowNotBlockMultiple {
            ggml_type: GgmlType::Q8_0,
            row_len: 33,
            block_size: 32,
            ..
        }
    ));
    // A Q4_K row of 255 values.
    let r = one_tensor(&[255], GgmlType::Q4_K as u32, 0, 256);
    assert!(matches!(
        err(&r),
        GgufError::RowNotBlockMultiple {
            block_size: 256,
            ..
        }
    ));
}

#[test]
fn truncated_tensor_info() {
    let mut r = Raw::header(3, 1, 0);
    r.str("w").u32(2).u64(8).zeros(12);
    assert!(matches!(err(&r), GgufError::Truncated { ref what, .. } if what.contains("w")));
}

#[test]
fn data_section_past_end() {
    // The tensor info ends at byte 57; aligning to 32 would need the file to reach byte 64.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[0], 0, 0);
    assert_eq!(r.0.len(), 57);
    assert!(matches!(
        err(&r),
        GgufError::DataSectionPastEnd {
            data_offset: 64,
            infos_end: 57,
            file_len: 57,
            ..
        }
    ));
}

#[test]
fn misaligned_tensor() {
    let r = one_tensor(&[8], 0, 16, 64);
    assert!(matches!(
        err(&r),
        GgufError::MisalignedTensor {
            offset: 16,
            alignment: 32,
            ..
        }
    ));
}

#[test]
fn overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(96);
    assert!(matches!(
        err(&r),
        GgufError::TensorOverlap {
            offset: 32,
            expected: 64,
            ..
        }
    ));
}

#[test]
fn tensor_offset_gap() {
    let r = one_tensor(&[8], 0, 32, 64);
    assert!(matches!(
        err(&r),
        GgufError::TensorGap {
            offset: 32,
            expected: 0,
            ..
        }
    ));
}

#[test]
fn tensor_past_end() {
    // 8 x 32 F32 need 1,024 bytes; 100 are there.
    let r = one_tensor(&[8, 32], 0, 0, 100);
    let e = err(&r);
    assert!(matches!(
        e,
        GgufError::TensorPastEnd {
            need: 1024,
            left: 100,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("tensor w needs 1,024 bytes at offset 96; the file has 100 left"),
        "{msg}"
    );
}

#[test]
fn second_tensor_past_end() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(40);
    assert!(
        matches!(err(&r), GgufError::TensorPastEnd { ref tensor, need: 32, left: 8, .. } if tensor == "b")
    );
}

#[test]
fn last_tensor_padding_may_be_missing() {
    // Only the tensor's own bytes must be in the file, not the padding after the last one.
    let r = one_tensor(&[3], 0, 0, 12);
    assert_eq!(r.parse().unwrap().tensors[0].n_bytes, 12);
}

// ---- typed getters ----

fn getter_file() -> GgufFile {
    let meta = vec![
        ("u8".to_string(), MetaValue::U8(200)),
        ("neg".to_string(), MetaValue::I32(-5)),
        ("big".to_string(), MetaValue::U64(1 << 40)),
        ("name".to_string(), MetaValue::String("glimmer".into())),
        (
            "ints".to_string(),
            MetaValue::Array(MetaType::U64, vec![MetaValue::U64(u64::MAX)]),
        ),
    ];
    GgufFile::from_bytes(muser_gguf::write_to_vec(&meta, &[]).unwrap()).unwrap()
}

#[test]
fn getter_errors_name_key_and_types() {
    let f = getter_file();
    assert_eq!(f.get_u32("u8").unwrap(), 200);
    assert_eq!(f.get_u64("big").unwrap(), 1 << 40);
    assert!(
        matches!(f.get_u32("missing"), Err(GgufError::MissingKey { ref key }) if key == "missing")
    );
    assert!(matches!(
        f.get_u32("neg"),
        Err(GgufError::ValueOutOfRange { target: "u32", .. })
    ));
    assert!(
        matches!(f.get_u32("big"), Err(GgufError::ValueOutOfRange { ref value, .. }) if value == "1099511627776")
    );
    let e = f.get_str("u8").unwrap_err();
    assert!(matches!(e, GgufError::WrongType { expected: "str", ref found, .. } if found == "u8"));
    let e = f.get_u32("name").unwrap_err();
    assert!(
        e.to_string().contains("name") && e.to_string().contains("str"),
        "{e}"
    );
    let e = f.get_str_array("ints").unwrap_err();
    assert!(matches!(e, GgufError::WrongType { ref found, .. } if found == "array of u64"));
    assert!(matches!(
        f.get_i64_array("ints"),
        Err(GgufError::ValueOutOfRange { target: "i64", .. })
    ));
    assert_eq!(f.get_f32_array("ints").unwrap(), vec![u64::MAX as f32]);
    assert!(matches!(
        f.get_bool("u8"),
        Err(GgufError::WrongType {
            expected: "bool",
            ..
        })
    ));
    assert!(matches!(
        f.get_f32("u8"),
        Err(GgufError::WrongType {
            expected: "f32",
            ..
        })
    ));
    assert!(matches!(
        f.tensor_bytes("nope"),
        Err(GgufError::MissingTensor { .. })
    ));
}

// ---- writer refusals ----

#[test]
fn writer_rejects_bad_specs_and_data() {
    let spec = |dims: &[u64], t| TensorSpec::new("w", dims, t);
    let w = |specs: &[TensorSpec]| muser_gguf::GgufWriter::new(Vec::new(), &[], specs);
    assert!(matches!(
        w(&[spec(&[33], GgmlType::Q8_0)]),
        Err(GgufError::RowNotBlockMultiple { row_len: 33, .. })
    ));
    assert!(matches!(
        w(&[spec(&[1, 1, 1, 1, 1], GgmlType::F32)]),
        Err(GgufError::TooManyDims { .. })
    ));
    assert!(matches!(
        w(&[spec(&[8], GgmlType::F32), spec(&[8], GgmlType::F32)]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w(&[TensorSpec::new("", &[8], GgmlType::F32)]),
        Err(GgufError::EmptyTensorName { .. })
    ));

    let mut wr = w(&[spec(&[64], GgmlType::Q8_0)]).unwrap();
    let e = wr.write_tensor(&[0; 60]).unwrap_err();
    assert!(matches!(
        e,
        GgufError::WrongDataLength {
            expected: 68,
            got: 60,
            ..
        }
    ));
    assert!(e.to_string().contains("got 60 bytes"), "{e}");
    assert!(matches!(
        wr.finish(),
        Err(GgufError::TensorsNotWritten {
            written: 0,
            count: 1,
            ..
        })
    ));

    let mut wr = w(&[]).unwrap();
    assert!(matches!(
        wr.write_tensor(&[]),
        Err(GgufError::TooManyTensorWrites { calls: 1, count: 0 })
    ));

    let meta = |k: &str, v: MetaValue| vec![(k.to_string(), v)];
    let wm =
        |m: &[(String, MetaValue)]| muser_gguf::GgufWriter::new(Vec::new(), m, &[]).map(|_| ());
    let mixed = MetaValue::Array(MetaType::U32, vec![MetaValue::U32(1), MetaValue::I32(2)]);
    assert!(matches!(
        wm(&meta("a", mixed)),
        Err(GgufError::ArrayElementType {
            declared: MetaType::U32,
            found: MetaType::I32,
            index: 1,
            ..
        })
    ));
    assert!(matches!(
        wm(&meta("general.alignment", MetaValue::U32(24))),
        Err(GgufError::BadAlignment { .. })
    ));
    assert!(matches!(
        wm(&meta("general.alignment", MetaValue::I32(32))),
        Err(GgufError::AlignmentNotU32 {
            found: MetaType::I32
        })
    ));
    assert!(matches!(
        wm(&meta("", MetaValue::U8(1))),
        Err(GgufError::EmptyKey { .. })
    ));
    let dup = vec![
        ("k".to_string(), MetaValue::U8(1)),
        ("k".to_string(), MetaValue::U8(2)),
    ];
    assert!(matches!(wm(&dup), Err(GgufError::DuplicateKey { .. })));
}
