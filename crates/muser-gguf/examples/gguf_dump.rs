//! A tiny command-line window onto the GGUF reader and writer, used by the gguf-py interop test
//! (tests/python/test_gguf_interop.py).
//!
//!   gguf_dump dump <file> [--data]   metadata and tensor infos as JSON (`--data`: tensor bytes in hex)
//!   gguf_dump write <file>           writes a sample file (every value type, several tensor types)
//!   gguf_dump rewrite <in> <out>     reads <in> and writes it back with our writer
//!   gguf_dump types                  the GgmlType table as JSON
//!
//! JSON is written by hand (no serde in this crate). Values are typed:
//! `{"type":"u32","value":7}`, arrays `{"type":"arr","elem":"str","items":[...]}`; f32 values are
//! printed as the exact f64 they widen to; NaN and infinities as Python's json reads them.

use muser_gguf::{GgmlType, GgufFile, GgufWriter, MetaType, MetaValue, TensorSpec};
use std::fmt::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["dump", path] => dump(path, false),
        ["dump", path, "--data"] => dump(path, true),
        ["write", path] => write_sample(path),
        ["rewrite", input, output] => rewrite(input, output),
        ["types"] => {
            println!("{}", types_json());
            Ok(())
        }
        _ => {
            eprintln!(
                "usage: gguf_dump dump <file> [--data] | write <file> | rewrite <in> <out> | types"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn dump(path: &str, with_data: bool) -> Result<(), muser_gguf::GgufError> {
    let f = GgufFile::open(path)?;
    let mut s = String::new();
    write!(
        s,
        "{{\"version\":{},\"alignment\":{},\"data_offset\":{},",
        f.version, f.alignment, f.data_offset
    )
    .unwrap();
    s.push_str("\"metadata\":[");
    for (i, (k, v)) in f.metadata.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        write!(s, "[{},", json_str(k)).unwrap();
        value_json(&mut s, v);
        s.push(']');
    }
    s.push_str("],\"tensors\":[");
    for (i, t) in f.tensors.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        write!(
            s,
            "{{\"name\":{},\"type\":\"{}\",\"type_id\":{},\"dims\":[{}],\"offset\":{},\"n_bytes\":{}",
            json_str(&t.name),
            t.ggml_type,
            t.ggml_type.id(),
            dims.join(","),
            t.offset,
            t.n_bytes
        )
        .unwrap();
        if with_data {
            s.push_str(",\"data\":\"");
            for b in f.tensor_data(t) {
                write!(s, "{b:02x}").unwrap();
            }
            s.push('"');
        }
        s.push('}');
    }
    s.push_str("]}");
    println!("{s}");
    Ok(())
}

fn json_str(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for ch in v.chars() {
        match ch {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if (c as u32) < 0x20 => write!(s, "\\u{:04x}", c as u32).unwrap(),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn float_json(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        // Debug prints the shortest text that parses back to the same f64.
        format!("{x:?}")
    }
}

fn value_json(s: &mut String, v: &MetaValue) {
    let scalar = match v {
        MetaValue::U8(x) => x.to_string(),
        MetaValue::I8(x) => x.to_string(),
        MetaValue::U16(x) => x.to_string(),
        MetaValue::I16(x) => x.to_string(),
        MetaValue::U32(x) => x.to_string(),
        MetaValue::I32(x) => x.to_string(),
        MetaValue::U64(x) => x.to_string(),
        MetaValue::I64(x) => x.to_string(),
        MetaValue::F32(x) => float_json(f64::from(*x)),
        MetaValue::F64(x) => float_json(*x),
        MetaValue::Bool(x) => x.to_string(),
        MetaValue::String(x) => json_str(x),
        MetaValue::Array(elem, items) => {
            write!(
                s,
                "{{\"type\":\"arr\",\"elem\":\"{}\",\"items\":[",
                elem.name()
            )
            .unwrap();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                value_json(s, item);
            }
            s.push_str("]}");
            return;
        }
    };
    write!(
        s,
        "{{\"type\":\"{}\",\"value\":{scalar}}}",
        v.meta_type().name()
    )
    .unwrap();
}

fn types_json() -> String {
    let rows: Vec<String> = GgmlType::ALL
        .iter()
        .map(|t| {
            let (bs, ts) = t.block_layout();
            format!(
                "{{\"name\":\"{t}\",\"id\":{},\"block_size\":{bs},\"type_size\":{ts}}}",
                t.id()
            )
        })
        .collect();
    format!("[{}]", rows.join(","))
}

/// A sample file with every value type, nested arrays and tensors of several types. Tensor data
/// come from a fixed linear congruential generator so the Python side can check exact bytes.
fn write_sample(path: &str) -> Result<(), muser_gguf::GgufError> {
    use MetaValue as V;
    let kv = |k: &str, v: MetaValue| (k.to_string(), v);
    let strs = |xs: &[&str]| {
        V::Array(
            MetaType::String,
            xs.iter().map(|x| V::String(x.to_string())).collect(),
        )
    };
    let meta = vec![
        kv("general.architecture", V::String("llama".into())),
        kv("general.name", V::String("muser sample \u{2713}".into())),
        kv("general.alignment", V::U32(64)),
        kv("s.u8", V::U8(250)),
        kv("s.i8", V::I8(-100)),
        kv("s.u16", V::U16(65000)),
        kv("s.i16", V::I16(-32000)),
        kv("s.u32", V::U32(4_000_000_000)),
        kv("s.i32", V::I32(-2_000_000_000)),
        kv("s.f32", V::F32(0.1)),
        kv("s.bool", V::Bool(true)),
        kv("s.u64", V::U64(18_000_000_000_000_000_000)),
        kv("s.i64", V::I64(-9_000_000_000_000_000_000)),
        kv("s.f64", V::F64(-2.5e-300)),
        kv("s.str", V::String("line\n\"quoted\"".into())),
        kv(
            "tokenizer.ggml.tokens",
            strs(&["<s>", "</s>", "hello", "\u{2581}world"]),
        ),
        kv(
            "tokenizer.ggml.scores",
            V::Array(
                MetaType::F32,
                vec![V::F32(0.0), V::F32(-1.5), V::F32(-2.25), V::F32(3.0)],
            ),
        ),
        kv(
            "tokenizer.ggml.token_type",
            V::Array(
                MetaType::I32,
                vec![V::I32(3), V::I32(3), V::I32(1), V::I32(1)],
            ),
        ),
        kv(
            "a.bool",
            V::Array(MetaType::Bool, vec![V::Bool(false), V::Bool(true)]),
        ),
        kv(
            "a.u64",
            V::Array(MetaType::U64, vec![V::U64(1), V::U64(u64::MAX)]),
        ),
        kv("a.empty", V::Array(MetaType::U32, vec![])),
        kv(
            "a.nested",
            V::Array(
                MetaType::Array,
                vec![
                    V::Array(MetaType::I16, vec![V::I16(1), V::I16(-2)]),
                    V::Array(MetaType::I16, vec![V::I16(3)]),
                ],
            ),
        ),
    ];
    let specs = [
        TensorSpec::new("token_embd.weight", &[16, 4], GgmlType::F32),
        TensorSpec::new("blk.0.attn_q.weight", &[32, 3], GgmlType::F16),
        TensorSpec::new("blk.0.ffn_up.weight", &[64, 2], GgmlType::Q8_0),
        TensorSpec::new("blk.0.ffn_down.weight", &[256, 2], GgmlType::Q4_K),
        TensorSpec::new("blk.0.attn_v.weight", &[256], GgmlType::Q6_K),
        TensorSpec::new("output_norm.weight", &[7], GgmlType::BF16),
    ];
    let mut state = 12345u32;
    let mut w = GgufWriter::create(path, &meta, &specs)?;
    for spec in &specs {
        let n = spec.n_bytes()? as usize;
        let data: Vec<u8> = (0..n)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (state >> 16) as u8
            })
            .collect();
        w.write_tensor(&data)?;
    }
    w.finish()?;
    Ok(())
}

fn rewrite(input: &str, output: &str) -> Result<(), muser_gguf::GgufError> {
    let f = GgufFile::open(input)?;
    let specs: Vec<TensorSpec> = f
        .tensors
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ggml_type))
        .collect();
    let mut w = GgufWriter::create(output, &f.metadata, &specs)?;
    for t in &f.tensors {
        w.write_tensor(f.tensor_data(t))?;
    }
    w.finish()?;
    Ok(())
}
