//! Muser's reading of chat answers, the counterpart of tests/python/llamacpp_chat.cpp for the
//! oracle tests of tests/python: one JSON request per line on stdin, {"template": PATH,
//! "messages": [...], "tools": [...], "tool_choice": ..., "parallel_tool_calls": BOOL,
//! "enable_thinking": BOOL (default true), "text": RAW OUTPUT, and any other chat request
//! field}; one JSON line per request on stdout, the message `muser serve` would answer
//! ({"content", "reasoning_content", "tool_calls": [{"name", "arguments"}]}, with
//! "stream_error" where streaming the text would read it otherwise) or {"error": WHAT}.

use serde_json::{json, Value};
use std::io::{BufRead, Write};

fn answer(line: &str) -> Value {
    let Ok(Value::Object(mut req)) = serde_json::from_str::<Value>(line) else {
        return json!({"error": "not a JSON object"});
    };
    let path = req
        .remove("template")
        .and_then(|p| p.as_str().map(String::from));
    let Some(source) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return json!({"error": "no template file"});
    };
    let text = req
        .remove("text")
        .and_then(|t| t.as_str().map(String::from));
    let thinking = req.remove("enable_thinking").unwrap_or(Value::Bool(true));
    let kwargs = req
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Value::Object(k) = kwargs {
        k.insert("enable_thinking".into(), thinking);
    }
    muser_server::read_chat_output(&source, &req, &text.unwrap_or_default())
}

fn main() {
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        writeln!(out, "{}", answer(&line)).expect("stdout");
    }
}
