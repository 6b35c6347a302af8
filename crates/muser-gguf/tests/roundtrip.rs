//! write -> read -> write is byte-identical; every metadata type and every tensor survives.

mod common;

use common::{kv, sample_file, sample_metadata, sample_tensors};
use muser_gguf::{GgmlType, GgufFile, GgufWriter, MetaType, MetaValue, TensorSpec};

/// Writes a parsed file back out with our writer.
fn rewrite(f: &GgufFile) -> Vec<u8> {
    let specs: Vec<TensorSpec> = f
        .tensors
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ggml_type))
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &f.metadata, &specs).unwrap();
    for t in &f.tensors {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn write_read_write_is_byte_identical() {
    let bytes = sample_file();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(
        f.metadata,
        sample_metadata(),
        "metadata in file order, every value equal"
    );
    let tensors = sample_tensors(7);
    assert_eq!(f.tensors.len(), tensors.len());
    for (t, (spec, data)) in f.tensors.iter().zip(&tensors) {
        assert_eq!(
            (&t.name, &t.dims, t.ggml_type),
            (&spec.name, &spec.dims, spec.ggml_type)
        );
        assert_eq!(t.offset % f.alignment, 0);
        assert_eq!(f.tensor_data(t), &data[..], "{}", t.name);
    }
    assert_eq!(rewrite(&f), bytes);
}

#[test]
fn open_maps_the_file_and_views_are_zero_copy() {
    let dir = std::env::temp_dir().join(format!("muser-gguf-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    muser_gguf::write_file(&path, &sample_metadata(), &sample_tensors(7)).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.bytes(), &sample_file()[..]);
    let range = f.bytes().as_ptr_range();
    for t in &f.tensors {
        let d = f.tensor_data(t);
        assert!(
            range.contains(&d.as_ptr()),
            "{} is a view into the map",
            t.name
        );
        assert_eq!(d.len() as u64, t.n_bytes);
    }
    let q4 = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((q4.n_cols(), q4.n_rows(), q4.n_bytes), (256, 2, 288));
    assert_eq!(f.tensor_bytes("output_norm.weight").unwrap().len(), 10);

    // An empty file and a missing file are errors, not panics.
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(muser_gguf::GgufError::Truncated { .. })
    ));
    let e = GgufFile::open(dir.join("nope.gguf")).err().unwrap();
    assert!(matches!(e, muser_gguf::GgufError::Io { .. }) && e.to_string().contains("nope.gguf"));
    // The OS error is in the message once, not again as a source (an error chain printed it
    // twice).
    assert!(std::error::Error::source(&e).is_none());
    // A directory is named as one (its map failed with "No such device").
    let e = GgufFile::open(&dir).err().unwrap();
    assert!(e.to_string().contains("is a directory"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_value_type_round_trips_alone() {
    for (key, value) in sample_metadata() {
        let meta = vec![(key.clone(), value.clone())];
        let bytes = muser_gguf::write_to_vec(&meta, &[]).unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(f.get(&key), Some(&value), "{key}");
        assert_eq!(rewrite(&f), bytes, "{key}");
    }
}

#[test]
fn typed_getters() {
    let f = GgufFile::from_bytes(sample_file()).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("t.u16").unwrap(), 0xbeef);
    assert_eq!(f.get_u32("t.u8").unwrap(), 0xab);
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX - 3);
    assert_eq!(f.get_f32("t.f32").unwrap(), -1.25e-3);
    assert!(f.get_bool("t.bool.true").unwrap());
    assert!(!f.get_bool("t.bool.false").unwrap());
    assert_eq!(
        f.get_str_array("t.arr.str").unwrap(),
        vec!["a", "", "<0x0A>"]
    );
    assert!(f.get_str_array("t.arr.empty.str").unwrap().is_empty());
    assert_eq!(
        f.get_f32_array("t.arr.f32").unwrap(),
        vec![0.5, -2.75, 1e30]
    );
    assert_eq!(f.get_f32_array("t.arr.i16").unwrap(), vec![-1.0, 300.0]);
    assert_eq!(f.get_i64_array("t.arr.i64").unwrap(), vec![-9, i64::MAX]);
    assert_eq!(f.get_i64_array("t.arr.u8").unwrap(), vec![1, 2, 255]);
}

#[test]
fn alignment_from_metadata_and_no_tensors() {
    let meta = vec![
        kv("general.alignment", MetaValue::U32(256)),
        kv("x", MetaValue::U8(1)),
    ];
    let specs = vec![
        (TensorSpec::new("a", &[3], GgmlType::F32), vec![1u8; 12]),
        (TensorSpec::new("b", &[32], GgmlType::Q8_0), vec![2u8; 34]),
    ];
    let bytes = muser_gguf::write_to_vec(&meta, &specs).unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(
        (f.alignment, f.data_offset % 256, f.tensors[1].offset),
        (256, 0, 256)
    );
    assert_eq!(
        bytes.len() as u64,
        f.data_offset + 512,
        "each tensor padded to 256"
    );
    assert_eq!(rewrite(&f), bytes);

    let bytes = muser_gguf::write_to_vec(&[], &[]).unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert!(f.metadata.is_empty() && f.tensors.is_empty());
    assert_eq!(rewrite(&f), bytes);
}

#[test]
fn nested_arrays_keep_inner_types() {
    let f = GgufFile::from_bytes(sample_file()).unwrap();
    let nested = f.get("t.arr.nested").unwrap();
    assert_eq!(nested.type_description(), "array of array of i32");
    let inner = nested.as_array().unwrap();
    assert_eq!(inner[2], MetaValue::Array(MetaType::U8, vec![]));
    assert_eq!(
        f.get("t.arr.empty.nested"),
        Some(&MetaValue::Array(MetaType::Array, vec![]))
    );
}
