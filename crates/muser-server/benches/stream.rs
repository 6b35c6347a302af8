//! Streaming a tool call: after every token the server reads the whole output so far
//! (`Format::parse_partial`) to send the call's new argument text. One reading of a call with
//! long arguments (a file's text, 16 KiB and 64 KiB) in the Hermes (JSON) and Qwen3-Coder (XML)
//! formats, against the reading without calls (`tool_choice` none: the text as it is), and
//! whole streams read after every 4 bytes (a token's worth): a 16 KiB call, 64 calls of 256
//! bytes of text each, and 16 KiB of text before a short call; each read all again at every
//! token (`parse_partial`) and read on (`parse_partial_on`: from the last whole block, and
//! inside the block being written from what the last reading read of its long strings), and
//! a 64 KiB call read on.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use muser_server::tools::{Format, Resume, Tool, ToolChoice, ToolRequest};
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

/// A whole `write_file` call of a file's text of about `n` bytes.
fn whole_call(format: Format, n: usize) -> String {
    let text = file_text(n);
    match format {
        Format::QwenXml => format!(
            "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n\
             <parameter=text>\n{text}\n</parameter>\n</function>\n</tool_call>"
        ),
        _ => format!(
            "<tool_call>\n{}\n</tool_call>",
            json!({"name": "write_file", "arguments": {"path": "src/main.rs", "text": text}})
        ),
    }
}

/// The call, cut a few bytes before its end (open, as while it streams).
fn call_text(format: Format, n: usize) -> String {
    let whole = whole_call(format, n);
    whole[..whole.len() - 40].to_string()
}

/// Times streaming `t` read after every 4 bytes, read all again at every token and read on.
fn bench_stream(c: &mut Criterion, format: Format, what: &str, t: &str, req: &ToolRequest) {
    let cuts: Vec<usize> = (0..t.len())
        .step_by(4)
        .filter(|&i| t.is_char_boundary(i))
        .collect();
    let name = format.name();
    c.bench_function(&format!("{name} whole stream, {what}"), |b| {
        b.iter(|| {
            for &i in &cuts {
                black_box(format.parse_partial(&t[..i], Some(req)));
            }
        })
    });
    c.bench_function(&format!("{name} whole stream read on, {what}"), |b| {
        b.iter(|| {
            let mut resume = Resume::default();
            for &i in &cuts {
                black_box(format.parse_partial_on(&t[..i], Some(req), &mut resume));
            }
        })
    });
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
        bench_stream(c, format, "16 KiB", &t, &calls);
        // (read all again, 64 KiB takes seconds a stream: read on only)
        let t = call_text(format, 64 << 10);
        c.bench_function(
            &format!("{} whole stream read on, 64 KiB", format.name()),
            |b| {
                b.iter(|| {
                    let mut resume = Resume::default();
                    for i in (0..t.len()).step_by(4).filter(|&i| t.is_char_boundary(i)) {
                        black_box(format.parse_partial_on(&t[..i], Some(&calls), &mut resume));
                    }
                })
            },
        );
        let many: String = (0..64).map(|_| whole_call(format, 256) + "\n").collect();
        bench_stream(c, format, "64 calls", &many, &calls);
        let after_text = file_text(16 << 10) + "\n" + &whole_call(format, 64);
        bench_stream(c, format, "16 KiB of text, a call", &after_text, &calls);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
