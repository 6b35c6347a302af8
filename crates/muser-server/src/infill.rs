//! llama-server's `POST /infill`: code completion between a prefix and a suffix, for models with
//! fill-in-the-middle tokens (Qwen2.5-Coder, CodeLlama, DeepSeek Coder, Granite, ...).
//!
//! The prompt is laid out as llama-server lays it out, so a model gets the same tokens from
//! either server:
//!
//! ```text
//! [FIM_REP]myproject\n [FIM_SEP]name\n text ... [FIM_SEP]filename\n      (repo-level models)
//! [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]
//! ```
//!
//! - `input_extra` (files given as context: `{"filename", "text"}`) comes first, each after
//!   `FIM_SEP` and its name (the name defaults to "tmp"), or, for models without `FIM_SEP`, after
//!   a "--- snippet ---" line; repo-level models (`FIM_REP`) get "myproject" as the repository
//!   and "filename" as the current file's name, as llama-server gives them.
//! - Only the prefix's last `3/4 n_batch` tokens are kept and the suffix's first
//!   `n_batch/4 - 2 - len(prompt)` (llama-server's split, with its default `n_batch` of 2048),
//!   and only the last `n_ctx - n_batch + 2` tokens of the extra context.
//! - `--spm-infill` puts the suffix before the prefix (the suffix-prefix-middle order some
//!   models are trained on).
//!
//! Prefix, suffix and extra texts are tokenized without special tokens (a `<|fim_prefix|>`
//! written in code stays text); `prompt`, the text the answer starts with, with them.
//! Everything else is `/completion`'s (sampling, streaming, `n_predict`, the answer's shape).

use crate::api::{self, Fields};
use crate::error::ApiError;
use muser_tokenizer::Tokenizer;
use serde_json::{Map, Value};

/// llama-server's default batch size, which its layout splits between prefix and suffix.
pub const N_BATCH: usize = 2048;

/// The request fields this endpoint adds to `/completion`'s (taken out before the rest is read
/// as a completion).
pub const FIELDS: [&str; 3] = ["input_prefix", "input_suffix", "input_extra"];

/// The prompt of an infill request (`obj`), or the 501 of a model without the tokens.
pub fn prompt(
    tok: &Tokenizer,
    obj: &Map<String, Value>,
    n_ctx: usize,
    spm: bool,
) -> Result<Vec<u32>, ApiError> {
    let fim = tok.fim();
    let (Some(pre), Some(suf), Some(mid)) = (fim.pre, fim.suf, fim.mid) else {
        let missing: Vec<&str> = [
            ("prefix", fim.pre),
            ("suffix", fim.suf),
            ("middle", fim.mid),
        ]
        .iter()
        .filter(|(_, id)| id.is_none())
        .map(|(name, _)| *name)
        .collect();
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            format!(
                "infill is not supported by this model: it has no fill-in-the-middle {} token",
                missing.join(", ")
            ),
        )
        .with_code("not_supported"));
    };
    let f = Fields(obj);
    let n_vocab = tok.n_vocab();
    let text = |s: &str| tok.encode(s, false, false);
    let mixed = |key: &str| -> Result<Vec<u32>, ApiError> {
        match obj.get(key) {
            None => Err(ApiError::param(key, format!("{key} is required"))),
            Some(v) => mixed_tokens(v, key, tok, n_vocab),
        }
    };
    let mut prefix = mixed("input_prefix")?;
    let mut suffix = mixed("input_suffix")?;
    let prompt = match f.get("prompt") {
        None => Vec::new(),
        Some(Value::String(s)) => tok.encode(s, false, true),
        Some(other) => {
            return Err(ApiError::param(
                "prompt",
                format!("prompt must be a string, got {}", api::type_name(other)),
            ))
        }
    };
    let mut extra = Vec::new();
    if let Some(rep) = fim.rep {
        extra.push(rep);
        extra.extend(text("myproject\n"));
    }
    for (filename, body) in read_extra(obj)? {
        match fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(text(&format!("{filename}\n")));
            }
            None => extra.extend(text("\n\n--- snippet ---\n\n")),
        }
        extra.extend(text(&body));
    }
    if let Some(sep) = fim.sep {
        extra.push(sep);
        extra.extend(text("filename\n"));
    }

    // llama-server's split of one batch: 3/4 for the prefix's end, the rest of a quarter
    // for the suffix's start; the extra context fills what the context leaves.
    let n_prefix = prefix.len().min(3 * (N_BATCH / 4));
    let n_suffix = suffix
        .len()
        .min((N_BATCH / 4).saturating_sub(2 + prompt.len()));
    // (its `n_ctx - n_batch - 2 n_predict` with the server's default n_predict of -1)
    let n_extra = (n_ctx + 2).saturating_sub(N_BATCH).min(extra.len());
    prefix.drain(..prefix.len() - n_prefix);
    suffix.truncate(n_suffix);
    prefix.insert(0, pre);
    prefix.extend(&prompt);
    suffix.insert(0, suf);
    let (mut head, tail) = if spm {
        (suffix, prefix)
    } else {
        (prefix, suffix)
    };
    if tok.add_bos() {
        if let Some(bos) = tok.bos() {
            head.insert(0, bos);
        }
    }
    let mut out = extra[extra.len() - n_extra..].to_vec();
    out.extend(head);
    out.extend(tail);
    out.push(mid);
    Ok(out)
}

/// A prefix or suffix: a string, or (as llama-server's mixed prompts) an array of strings and
/// token ids.
fn mixed_tokens(
    v: &Value,
    key: &str,
    tok: &Tokenizer,
    n_vocab: usize,
) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::param(
            key,
            format!(
                "{key} must be a string or an array of strings and token ids, got {}",
                api::show(v)
            ),
        )
    };
    match v {
        Value::String(s) => Ok(tok.encode(s, false, false)),
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.extend(tok.encode(s, false, false)),
                    Value::Number(_) => match item.as_u64() {
                        Some(t) if (t as usize) < n_vocab => out.push(t as u32),
                        _ => {
                            return Err(ApiError::param(
                                key,
                                format!(
                                    "{key}[{i}] = {} is not a token id (an integer from 0 to {})",
                                    api::show(item),
                                    n_vocab - 1
                                ),
                            ))
                        }
                    },
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        _ => Err(bad()),
    }
}

/// `input_extra`: an array of `{"filename": string (optional), "text": string}`.
fn read_extra(obj: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let key = "input_extra";
    let items = match obj.get(key) {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(ApiError::param(
                key,
                format!(
                    "{key} must be an array of {{\"filename\": string, \"text\": string}}, got {}",
                    api::type_name(other)
                ),
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let field = |name: &str| c.get(name).map(|v| (v, v.as_str()));
            let text = match field("text") {
                Some((_, Some(t))) => t.to_string(),
                _ => {
                    return Err(ApiError::param(
                        key,
                        format!("{key}[{i}] must have a \"text\" string"),
                    ))
                }
            };
            let filename = match field("filename") {
                None => "tmp".to_string(),
                Some((_, Some(n))) => n.to_string(),
                Some((v, None)) => {
                    return Err(ApiError::param(
                        key,
                        format!(
                            "{key}[{i}].filename must be a string, got {}",
                            api::type_name(v)
                        ),
                    ))
                }
            };
            Ok((filename, text))
        })
        .collect()
}
