//! The ggml type table is consistent with itself (ids, names, row sizes). Its values are checked
//! against gguf-py in tests/python/test_gguf_interop.py.

use muser_gguf::GgmlType;

#[test]
fn ids_names_and_row_bytes_agree() {
    let mut last = None;
    for t in GgmlType::ALL {
        assert!(last.is_none_or(|l| l < t.id()), "ALL is in id order");
        last = Some(t.id());
        assert_eq!(GgmlType::from_id(t.id()), Some(t));
        assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        let (bs, ts) = t.block_layout();
        assert_eq!(t.row_bytes(bs as u64 * 3), Some(3 * ts as u64), "{t}");
        if bs > 1 {
            assert_eq!(t.row_bytes(bs as u64 + 1), None, "{t}");
        }
    }
    for removed in [4, 5, 31, 32, 33, 36, 37, 38] {
        assert_eq!(GgmlType::from_id(removed), None);
    }
    assert_eq!(GgmlType::Q4_K.row_bytes(4096), Some(16 * 144));
    assert_eq!(
        GgmlType::F64.row_bytes(u64::MAX),
        None,
        "overflow is None, not a panic"
    );
}
