//! A valid sample file shared by the round-trip and sweep tests: every metadata type, nested and
//! empty arrays, and tensors of several ggml types filled with seeded random bytes.

use muser_gguf::{GgmlType, MetaType, MetaValue, TensorSpec};
use rand::{Rng, SeedableRng};

pub fn kv(key: &str, v: MetaValue) -> (String, MetaValue) {
    (key.to_string(), v)
}

pub fn sample_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue as V;
    vec![
        kv("general.architecture", V::String("llama".into())),
        kv("general.name", V::String("sample – ünïcödé ✓".into())),
        kv("t.u8", V::U8(0xab)),
        kv("t.i8", V::I8(-7)),
        kv("t.u16", V::U16(0xbeef)),
        kv("t.i16", V::I16(-12345)),
        kv("t.u32", V::U32(0xdead_beef)),
        kv("t.i32", V::I32(-2_000_000_000)),
        kv("t.f32", V::F32(-1.25e-3)),
        kv("t.bool.true", V::Bool(true)),
        kv("t.bool.false", V::Bool(false)),
        kv("t.u64", V::U64(u64::MAX - 3)),
        kv("t.i64", V::I64(i64::MIN + 5)),
        kv("t.f64", V::F64(std::f64::consts::PI)),
        kv("t.str.empty", V::String(String::new())),
        kv(
            "t.arr.u8",
            V::Array(MetaType::U8, vec![V::U8(1), V::U8(2), V::U8(255)]),
        ),
        kv(
            "t.arr.i16",
            V::Array(MetaType::I16, vec![V::I16(-1), V::I16(300)]),
        ),
        kv(
            "t.arr.f32",
            V::Array(
                MetaType::F32,
                vec![V::F32(0.5), V::F32(-2.75), V::F32(1e30)],
            ),
        ),
        kv(
            "t.arr.bool",
            V::Array(MetaType::Bool, vec![V::Bool(true), V::Bool(false)]),
        ),
        kv(
            "t.arr.str",
            V::Array(
                MetaType::String,
                vec![
                    V::String("a".into()),
                    V::String("".into()),
                    V::String("<0x0A>".into()),
                ],
            ),
        ),
        kv(
            "t.arr.i64",
            V::Array(MetaType::I64, vec![V::I64(-9), V::I64(i64::MAX)]),
        ),
        kv("t.arr.f64", V::Array(MetaType::F64, vec![V::F64(1e-300)])),
        kv("t.arr.empty.u32", V::Array(MetaType::U32, vec![])),
        kv("t.arr.empty.str", V::Array(MetaType::String, vec![])),
        kv(
            "t.arr.nested",
            V::Array(
                MetaType::Array,
                vec![
                    V::Array(MetaType::I32, vec![V::I32(1), V::I32(-2)]),
                    V::Array(MetaType::String, vec![V::String("x".into())]),
                    V::Array(MetaType::U8, vec![]),
                    V::Array(
                        MetaType::Array,
                        vec![V::Array(MetaType::U16, vec![V::U16(7)])],
                    ),
                ],
            ),
        ),
        kv("t.arr.empty.nested", V::Array(MetaType::Array, vec![])),
    ]
}

pub fn sample_tensors(seed: u64) -> Vec<(TensorSpec, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let specs = [
        TensorSpec::new("token_embd.weight", &[8, 3], GgmlType::F32),
        TensorSpec::new("blk.0.attn_q.weight", &[32, 2], GgmlType::F16),
        TensorSpec::new("blk.0.ffn_up.weight", &[64, 1, 1], GgmlType::Q8_0),
        TensorSpec::new("blk.0.ffn_down.weight", &[256, 2], GgmlType::Q4_K),
        TensorSpec::new("output_norm.weight", &[5], GgmlType::BF16),
        TensorSpec::new("blk.0.attn_v.weight", &[256], GgmlType::Q6_K),
    ];
    specs
        .into_iter()
        .map(|s| {
            let n = s.n_bytes().unwrap() as usize;
            let data: Vec<u8> = (0..n).map(|_| rng.gen_range(1..=255u8)).collect();
            (s, data)
        })
        .collect()
}

/// The sample file's bytes.
pub fn sample_file() -> Vec<u8> {
    muser_gguf::write_to_vec(&sample_metadata(), &sample_tensors(7)).unwrap()
}
