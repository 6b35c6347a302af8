//! The reader never panics: a valid file truncated at every byte, and with bytes flipped at
//! 10,000 seeded random places, either parses cleanly or gives an error.

mod common;

use muser_gguf::GgufFile;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Parses `bytes`; on success touches every tensor view and getter. Returns whether it parsed.
fn parse_without_panic(bytes: Vec<u8>, what: &str) -> bool {
    let len = bytes.len();
    let result = catch_unwind(AssertUnwindSafe(|| match GgufFile::from_bytes(bytes) {
        Ok(f) => {
            for t in &f.tensors {
                assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                assert!(f.data_offset + t.offset + t.n_bytes <= len as u64);
            }
            for (k, _) in &f.metadata {
                let _ = (
                    f.get_u32(k),
                    f.get_str(k),
                    f.get_f32_array(k),
                    f.get_i64_array(k),
                );
            }
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }));
    match result {
        Ok(ok) => ok,
        Err(_) => panic!("reader panicked on {what}"),
    }
}

#[test]
fn every_truncation_is_an_error_or_a_clean_read() {
    let file = common::sample_file();
    let f = GgufFile::from_bytes(file.clone()).unwrap();
    let last = f.tensors.last().unwrap();
    let needed = (f.data_offset + last.offset + last.n_bytes) as usize;
    for cut in 0..file.len() {
        let ok = parse_without_panic(file[..cut].to_vec(), &format!("truncation at {cut}"));
        // Only the padding after the last tensor may be cut away.
        assert_eq!(ok, cut >= needed, "truncation at {cut} of {}", file.len());
    }
}

#[test]
fn ten_thousand_random_byte_flips() {
    let file = common::sample_file();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6775_6666);
    let (mut ok, mut err) = (0, 0);
    for i in 0..10_000 {
        let mut bytes = file.clone();
        // Mostly single flips; every fourth case flips a few bytes at once.
        let n_flips = if i % 4 == 0 { rng.gen_range(2..6) } else { 1 };
        let mut places = Vec::new();
        for _ in 0..n_flips {
            // Bias towards the header, metadata and tensor infos, where the structure is.
            let limit = if rng.gen_bool(0.8) {
                1200.min(file.len())
            } else {
                file.len()
            };
            let at = rng.gen_range(0..limit);
            bytes[at] ^= rng.gen_range(1..=255u8);
            places.push(at);
        }
        if parse_without_panic(bytes, &format!("case {i}: flips at {places:?}")) {
            ok += 1;
        } else {
            err += 1;
        }
    }
    // Both outcomes must occur: flips in tensor data parse, flips in structure mostly do not.
    assert!(ok > 100 && err > 1000, "ok {ok}, err {err}");
}
