//! Streaming a tool call: after every token the server reads the whole output so far
//! (`Format::parse_partial`) to send the call's new argument text. One reading of a call with
//! long arguments (a file's text, 16 KiB and 64 KiB) in the Hermes (JSON) and Qwen3-Coder (XML)
//! formats, against the reading without calls (`tool_choice` none: the text as it is), and the
//! whole stream of a 16 KiB call read after every 4 bytes (a token's worth).
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use muser_server::tools::{Format, Tool, ToolChoice, ToolRequest};
use serde_json::json;

fn request(choice: ToolChoice) -> ToolRequest {
    ToolRequest {
        tools: vec![Tool {
            name: "write_file".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string"}, "text": {"type": "string"}}}),
        }],
        choice,
        parallel: false,
        response: None,
    }
}

/// A file's text of about `n` bytes: lines of code-like words, quotes and backslashes.
fn file_text(n: usize) -> String {
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < n {
        s.push_str(&format!(
            "    let x{i} = \"value {i}\\n\"; // é {}\n",
            i * 7919 % 1000
        ));
        i += 1;
    }
    s
}

/// The call, cut a few bytes before its end (open, as while it streams).
fn call_text(format: Format, n: usize) -> String {
    let text = file_text(n);
    let whole = match format {
        Format::QwenXml => format!(
            "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n\
             <parameter=text>\n{text}\n</parameter>\n</function>\n</tool_call>"
        ),
        _ => format!(
            "<tool_call>\n{}\n</tool_call>",
            json!({"name": "write_file", "arguments": {"path": "src/main.rs", "text": text}})
        ),
    };
    whole[..whole.len() - 40].to_string()
}

fn bench(c: &mut Criterion) {
    let calls = request(ToolChoice::Auto);
    let none = request(ToolChoice::None);
    for format in [Format::Hermes, Format::QwenXml] {
        for kib in [16, 64] {
            let t = call_text(format, kib << 10);
            c.bench_function(&format!("{} one reading, {kib} KiB", format.name()), |b| {
                b.iter(|| black_box(format.parse_partial(black_box(&t), Some(&calls))))
            });
            c.bench_function(&format!("{} no calls, {kib} KiB", format.name()), |b| {
                b.iter(|| black_box(format.parse_partial(black_box(&t), Some(&none))))
            });
        }
        let t = call_text(format, 16 << 10);
        let cuts: Vec<usize> = (0..t.len())
            .step_by(4)
            .filter(|&i| t.is_char_boundary(i))
            .collect();
        c.bench_function(&format!("{} whole stream, 16 KiB", format.name()), |b| {
            b.iter(|| {
                for &i in &cuts {
                    black_box(format.parse_partial(&t[..i], Some(&calls)));
                }
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
