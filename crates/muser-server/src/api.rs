//! Request parsing: a body becomes a checked generation request or an OpenAI-shaped 400 that
//! names the field, what it must be and what it was. Fields are read from a JSON object by hand
//! (not derived) so every wrong type and out-of-range value gets such a message; unknown fields
//! are ignored, as OpenAI's API does, except OpenAI's own fields that would change the answer
//! and that Muser does not implement (tools, function calls): those are
//! a 400 naming them, never silently dropped.

use crate::error::ApiError;
use muser_sample::SamplerParams;
use muser_tokenizer::Tokenizer;
use serde_json::{Map, Value};

/// Most stop strings a request may give.
pub const MAX_STOPS: usize = 16;
/// Most alternatives `top_logprobs` / completions' `logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short rendering of a value for error messages.
pub(crate) fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!("{}...", &s[..s.floor_char_boundary(40)])
    } else {
        s
    }
}

/// The body as a JSON object: invalid UTF-8, malformed JSON and a non-object are 400s.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
        .with_code("invalid_utf8")
    })?;
    let v: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            type_name(&other)
        ))
        .with_code("invalid_json")),
    }
}

/// Typed, range-checked access to the fields of a request object; null counts as absent.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    pub fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    pub fn number(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            _ if lo == f64::MIN && hi == f64::MAX => Err(ApiError::param(
                k,
                format!("{k} must be a number, got {}", show(v)),
            )),
            _ => Err(ApiError::param(
                k,
                format!("{k} must be a number from {lo} to {hi}, got {}", show(v)),
            )),
        }
    }

    /// A number with no range of its own (as llama-server reads its samplers' settings) but
    /// what an f32 holds: 1e300 would be an infinite setting.
    pub fn any_number(&self, k: &str) -> Result<Option<f64>, ApiError> {
        match self.number(k, f64::MIN, f64::MAX)? {
            Some(x) if x.abs() > f32::MAX as f64 => Err(ApiError::param(
                k,
                format!("{k} must be a number of magnitude at most 3.4e38 (an f32), got {x:e}"),
            )),
            x => Ok(x),
        }
    }

    pub fn integer(&self, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        // A number with no fraction is an integer too (1.0 as 1), as JSON Schema counts it.
        let whole = v.as_i64().or_else(|| {
            v.as_f64()
                .filter(|x| x.fract() == 0.0 && x.abs() < 9.0e15)
                .map(|x| x as i64)
        });
        match whole {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            _ if lo == i64::MIN && hi == i64::MAX => Err(ApiError::param(
                k,
                format!("{k} must be an integer, got {}", show(v)),
            )),
            _ => Err(ApiError::param(
                k,
                format!("{k} must be an integer from {lo} to {hi}, got {}", show(v)),
            )),
        }
    }

    pub fn boolean(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::param(
                k,
                format!("{k} must be a boolean, got {}", show(v)),
            )),
        }
    }

    pub fn string(&self, k: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::param(
                k,
                format!("{k} must be a string, got {}", type_name(v)),
            )),
        }
    }
}

/// Everything of a completion request except the prompt.
#[derive(Debug, Clone)]
pub struct Generation {
    pub params: SamplerParams,
    /// None: until the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Some(n): report each token's log-probability and its n most likely alternatives.
    pub logprobs: Option<usize>,
    /// /v1/completions' `echo`: the answer's text starts with the prompt's, and with `logprobs`
    /// its logprobs start with the prompt tokens', each given the tokens before it (the first
    /// none).
    pub echo: bool,
    pub stream: bool,
    /// Streams end with a chunk that carries the usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// End-of-generation tokens are never sampled (llama-server's and vLLM's `ignore_eos`, as
    /// llama-server bans them): the request runs to `max_tokens`, a stop string, the context's
    /// end or its grammar's end. For benchmarks of a fixed length.
    pub ignore_eos: bool,
    /// The grammar the output follows (`grammar`, `json_schema`, `response_format`), set by
    /// `constrain::parse_constraint` after this is read.
    pub grammar: Option<crate::constrain::Constraint>,
    /// Tokens whose text is output even when they are control tokens (`preserved_tokens`, or
    /// a chat format's markup), sorted.
    pub preserved: Vec<u32>,
}

/// How many choices a request asks for: OpenAI's `n` (llama-server's `n_cmpl`, which it reads
/// first), from 1 to `parallel`, the server's slots, as llama-server bounds it: each choice
/// runs in a slot of its own.
pub fn parse_choices(f: &Fields, parallel: usize) -> Result<usize, ApiError> {
    let mut n = 1;
    let most = i64::try_from(parallel).unwrap_or(i64::MAX);
    for key in ["n", "n_cmpl"] {
        if let Some(v) = f.integer(key, i64::MIN, i64::MAX)? {
            if v < 1 || v > most {
                return Err(ApiError::param(
                    key,
                    format!(
                        "{key} must be from 1 to {parallel} (the server's --parallel: each \
                         choice takes a slot of its own), got {v}"
                    ),
                ));
            }
            n = v as usize;
        }
    }
    Ok(n)
}

/// The sampling seed of choice `i` of a request (`parse_choices`) whose first choice has
/// `seed`: llama-server's rule, the seed plus `i` where the request gave one, else `random`, a
/// seed of its own.
pub fn choice_seed(f: &Fields, seed: u64, i: usize, random: impl FnOnce() -> u64) -> u64 {
    // (read as `parse_generation` reads it: a whole float counts)
    let given = f
        .integer("seed", i64::MIN, i64::MAX)
        .ok()
        .flatten()
        .is_some_and(|s| s != -1);
    match (i, given) {
        (0, _) => seed,
        (_, true) => seed.wrapping_add(i as u64),
        (_, false) => random(),
    }
}

/// Most entries a request's `logit_bias` may hold (a bound on the per-token work of a request).
pub const MAX_LOGIT_BIAS: usize = 300;

/// `logit_bias`: an object from token ids (as strings) to biases from -100 to 100, added to
/// those tokens' logits before sampling. Sorted by id.
fn parse_logit_bias(f: &Fields, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let err = |m: String| ApiError::param("logit_bias", m);
    let o = match f.get("logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(err(format!(
                "logit_bias must be an object from token ids to biases, got {}",
                type_name(v)
            )))
        }
    };
    if o.len() > MAX_LOGIT_BIAS {
        return Err(err(format!(
            "logit_bias has {} entries; at most {MAX_LOGIT_BIAS}",
            o.len()
        )));
    }
    let mut bias = o
        .iter()
        .map(|(k, v)| {
            let id = k
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    err(format!(
                        "logit_bias key {} is not a token id from 0 to {}",
                        show(&Value::String(k.clone())),
                        n_vocab - 1
                    ))
                })?;
            match v.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(err(format!(
                    "logit_bias[\"{id}\"] must be a number from -100 to 100, got {}",
                    show(v)
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    bias.sort_by_key(|&(id, _)| id);
    Ok(bias)
}

/// OpenAI's tool-calling fields on an endpoint that has no tools (/v1/completions): a 400
/// naming them, rather than an answer that silently ignores them. On chat completions they are
/// read by `tools::parse_tools`.
fn refuse_unsupported(f: &Fields, chat: bool) -> Result<(), ApiError> {
    if chat {
        return Ok(());
    }
    for key in ["tools", "functions"] {
        if let Some(v) = f.get(key) {
            if !matches!(v, Value::Array(a) if a.is_empty()) {
                return Err(ApiError::param(
                    key,
                    format!("{key} is only read on /v1/chat/completions (tool calls are chat)"),
                ));
            }
        }
    }
    for key in ["tool_choice", "function_call"] {
        match f.get(key) {
            None => {}
            Some(Value::String(s)) if s == "none" || s == "auto" => {}
            Some(v) => {
                return Err(ApiError::param(
                    key,
                    format!(
                        "{key} {} is only read on /v1/chat/completions (tool calls are chat)",
                        show(v)
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// llama.cpp's samplers beyond OpenAI's (llama-server reads them on its OpenAI endpoints as on
/// /completion), with llama-server's ranges: XTC's from 0 to 1 and mirostat 0, 1 or 2 (which
/// llama-server clamps and Muser refuses, as it refuses a top_p past 1), min_keep a count, the
/// others any number (typical_p >= 1, top_n_sigma <= 0, dynatemp_range <= 0 are off); DRY's as
/// `parse_dry` reads them.
fn parse_llama_samplers(f: &Fields, p: &mut SamplerParams) -> Result<(), ApiError> {
    for (key, field) in [
        ("typical_p", &mut p.typical_p),
        ("top_n_sigma", &mut p.top_n_sigma),
        ("dynatemp_range", &mut p.dynatemp_range),
        ("dynatemp_exponent", &mut p.dynatemp_exponent),
        ("mirostat_tau", &mut p.mirostat_tau),
        ("mirostat_eta", &mut p.mirostat_eta),
    ] {
        if let Some(x) = f.any_number(key)? {
            *field = x as f32;
        }
    }
    for (key, field) in [
        ("xtc_probability", &mut p.xtc_probability),
        ("xtc_threshold", &mut p.xtc_threshold),
    ] {
        if let Some(x) = f.number(key, 0.0, 1.0)? {
            *field = x as f32;
        }
    }
    if let Some(m) = f.integer("mirostat", 0, 2)? {
        p.mirostat = m as u32;
    }
    if let Some(n) = f.integer("min_keep", 0, i32::MAX as i64)? {
        p.min_keep = n as usize;
    }
    parse_dry(f, p)
}

/// Most strings a request's `dry_sequence_breakers` may hold (each one is matched against every
/// token of the vocabulary when a request brings a list the server has not seen lately).
pub const MAX_DRY_BREAKERS: usize = 64;

/// DRY as llama-server reads it: `dry_multiplier` any number (0 = off), `dry_base` any number,
/// one below 1 replaced by the default 1.75, `dry_allowed_length` and `dry_penalty_last_n`
/// counts (llama-server refuses -1 for the window as for `repeat_last_n`), and
/// `dry_sequence_breakers` a non-empty array of strings.
fn parse_dry(f: &Fields, p: &mut SamplerParams) -> Result<(), ApiError> {
    if let Some(x) = f.any_number("dry_multiplier")? {
        p.dry_multiplier = x as f32;
    }
    if let Some(x) = f.any_number("dry_base")? {
        p.dry_base = if x < 1.0 {
            SamplerParams::default().dry_base
        } else {
            x as f32
        };
    }
    if let Some(n) = f.integer("dry_allowed_length", 0, i32::MAX as i64)? {
        p.dry_allowed_length = n as usize;
    }
    if let Some(n) = f.integer("dry_penalty_last_n", 0, i32::MAX as i64)? {
        p.dry_penalty_last_n = n as usize;
    }
    let key = "dry_sequence_breakers";
    let Some(v) = f.get(key) else {
        return Ok(());
    };
    let breakers: Option<Vec<String>> = match v {
        Value::Array(a) if !a.is_empty() => {
            a.iter().map(|s| s.as_str().map(String::from)).collect()
        }
        _ => None,
    };
    match breakers {
        Some(b) if b.len() > MAX_DRY_BREAKERS => Err(ApiError::param(
            key,
            format!("{key} has {} strings; at most {MAX_DRY_BREAKERS}", b.len()),
        )),
        Some(b) => {
            p.dry_sequence_breakers = b;
            Ok(())
        }
        None => Err(ApiError::param(
            key,
            format!(
                "{key} must be a non-empty array of strings, got {}",
                show(v)
            ),
        )),
    }
}

/// Reads the sampling and output fields shared by /v1/completions and /v1/chat/completions.
/// `seed` is used when the request gives none; `logit_bias` ids must be below `n_vocab`.
pub fn parse_generation(
    f: &Fields,
    chat: bool,
    seed: u64,
    n_vocab: usize,
) -> Result<Generation, ApiError> {
    refuse_unsupported(f, chat)?;
    let echo = f.boolean("echo")?.unwrap_or(false);
    if echo && chat {
        return Err(ApiError::param(
            "echo",
            "echo is only read on /v1/completions (a chat answer does not repeat its messages)",
        ));
    }
    if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "suffix is not supported"));
    }
    if let Some(b) = f.integer("best_of", i64::MIN, i64::MAX)? {
        if b != 1 {
            return Err(ApiError::param("best_of", "best_of must be 1"));
        }
    }

    let mut p = SamplerParams::default();
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        p.temperature = t as f32;
    }
    if let Some(t) = f.number("top_p", 0.0, 1.0)? {
        p.top_p = t as f32;
    }
    if let Some(k) = f.integer("top_k", 0, i32::MAX as i64)? {
        p.top_k = k as usize;
    }
    if let Some(m) = f.number("min_p", 0.0, 1.0)? {
        p.min_p = m as f32;
    }
    for key in ["repetition_penalty", "repeat_penalty"] {
        if let Some(r) = f.number(key, 0.0, 10.0)? {
            if r == 0.0 {
                return Err(ApiError::param(key, format!("{key} must be above 0")));
            }
            p.repeat_penalty = r as f32;
        }
    }
    // llama.cpp's window of the penalties; -1: the whole context.
    if let Some(n) = f.integer("repeat_last_n", -1, i32::MAX as i64)? {
        p.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
    }
    if let Some(x) = f.number("frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = x as f32;
    }
    if let Some(x) = f.number("presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = x as f32;
    }
    p.seed = match f.integer("seed", i64::MIN, i64::MAX)? {
        None | Some(-1) => seed,
        Some(s) => s as u64,
    };
    p.logit_bias = parse_logit_bias(f, n_vocab)?;
    parse_llama_samplers(f, &mut p)?;
    // What the chain cannot run with, by the sampler's own rules (none of the ranges above lets
    // such a value through today): check's message starts with the field's name.
    p.check().map_err(|m| {
        let field = m.split(' ').next().unwrap_or_default().to_string();
        ApiError::param(&field, m)
    })?;

    let mut max_tokens = None;
    for key in ["max_tokens", "max_completion_tokens", "n_predict"] {
        // 0 with echo: the prompt scored, nothing generated (an evaluation's loglikelihood).
        if let Some(n) = f.integer(key, i64::from(!echo), i32::MAX as i64)? {
            max_tokens = Some(n as usize);
        }
    }

    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::param(
                    "stop",
                    format!("stop has {} strings; at most {MAX_STOPS}", a.len()),
                ));
            }
            a.iter()
                .map(|s| match s {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::param(
                        "stop",
                        format!("stop must hold strings, got {}", type_name(v)),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => {
            return Err(ApiError::param(
                "stop",
                format!(
                    "stop must be a string or an array of strings, got {}",
                    type_name(v)
                ),
            ))
        }
    };

    let top_max = MAX_TOP_LOGPROBS as i64;
    let logprobs = if chat {
        let on = f.boolean("logprobs")?.unwrap_or(false);
        let top = f.integer("top_logprobs", 0, top_max)?;
        if top.is_some() && !on {
            return Err(ApiError::param(
                "top_logprobs",
                "top_logprobs needs logprobs set to true",
            ));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        // Completions: an integer; `true` is taken as 0 alternatives.
        match f.get("logprobs") {
            Some(Value::Bool(b)) => b.then_some(0),
            _ => f.integer("logprobs", 0, top_max)?.map(|n| n as usize),
        }
    };

    let stream = f.boolean("stream")?.unwrap_or(false);
    let ignore_eos = f.boolean("ignore_eos")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).boolean("include_usage")?.unwrap_or(false),
        Some(v) => {
            return Err(ApiError::param(
                "stream_options",
                format!("stream_options must be an object, got {}", type_name(v)),
            ))
        }
    };

    Ok(Generation {
        params: p,
        max_tokens,
        stop,
        logprobs,
        echo,
        stream,
        ignore_eos,
        grammar: None,
        preserved: Vec::new(),
        include_usage,
    })
}

/// A completions prompt: a string, an array of token ids, or a one-element array of either.
/// Strings are tokenized with BOS (where the model asks for it) and control tokens parsed.
pub fn parse_prompt(
    v: Option<&Value>,
    tok: &Tokenizer,
    n_vocab: usize,
) -> Result<Vec<u32>, ApiError> {
    let err = |m: String| ApiError::param("prompt", m);
    let tokens = match v {
        None => return Err(err("prompt is required".into())),
        Some(Value::String(s)) => tok.encode(s, true, true),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) && !a.is_empty() => {
            token_ids(a, n_vocab).map_err(|m| err(format!("prompt{m}")))?
        }
        Some(Value::Array(a)) if a.len() == 1 => return parse_prompt(a.first(), tok, n_vocab),
        Some(Value::Array(a)) if a.is_empty() => return Err(err("prompt is empty".into())),
        Some(Value::Array(a)) if a.iter().any(Value::is_number) => {
            return Err(err(
                "prompt mixes token ids with other values; give a string or an array of token \
                 ids"
                .into(),
            ))
        }
        Some(Value::Array(a)) => {
            return Err(err(format!(
                "prompt holds {} prompts; send one prompt per request here (a string or an \
                 array of token ids), or several to /v1/completions",
                a.len()
            )))
        }
        Some(other) => {
            return Err(err(format!(
                "prompt must be a string or an array of token ids, got {}",
                type_name(other)
            )))
        }
    };
    if tokens.is_empty() {
        return Err(err("prompt has no tokens".into()));
    }
    Ok(tokens)
}

/// The prompts of a completions request: one (`parse_prompt`'s forms), or several as OpenAI's
/// completions take them, an array of strings or of token-id arrays; each is read as one
/// prompt (errors name it: "prompt[2] ...").
pub fn parse_prompts(
    v: Option<&Value>,
    tok: &Tokenizer,
    n_vocab: usize,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let Some(Value::Array(a)) = v else {
        return Ok(vec![parse_prompt(v, tok, n_vocab)?]);
    };
    if a.len() < 2 || a.iter().any(Value::is_number) {
        return Ok(vec![parse_prompt(v, tok, n_vocab)?]);
    }
    a.iter()
        .enumerate()
        .map(|(i, p)| {
            if matches!(p, Value::Array(items) if items.iter().any(|x| !x.is_number())) {
                return Err(ApiError::param(
                    "prompt",
                    format!("prompt[{i}] must be a string or an array of token ids"),
                ));
            }
            parse_prompt(Some(p), tok, n_vocab).map_err(|e| {
                let message = e.message.replacen("prompt", &format!("prompt[{i}]"), 1);
                ApiError::param("prompt", message)
            })
        })
        .collect()
}

/// Token ids of a JSON array, each checked against the vocabulary; the error text continues
/// the field name ("[3] = 99999 is out of range ...").
pub fn token_ids(a: &[Value], n_vocab: usize) -> Result<Vec<u32>, String> {
    a.iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if (t as usize) < n_vocab => Ok(t as u32),
            _ => Err(format!(
                "[{i}] = {} is not a token id (an integer from 0 to {})",
                show(v),
                n_vocab - 1
            )),
        })
        .collect()
}

/// The number of tokens to generate at most: `max_tokens`, or what is left of the context.
/// A prompt that leaves no room, or a prompt plus max_tokens past the context, is a 400 that
/// carries n_prompt_tokens and n_ctx.
pub fn fit_context(
    n_prompt: usize,
    max_tokens: Option<usize>,
    n_ctx: usize,
) -> Result<usize, ApiError> {
    let over = |msg: String| {
        ApiError::bad_request(msg)
            .with_code("context_length_exceeded")
            .with("n_prompt_tokens", n_prompt)
            .with("n_ctx", n_ctx)
    };
    if n_prompt >= n_ctx {
        return Err(over(format!(
            "the prompt has {n_prompt} tokens, which leaves no room in the context of {n_ctx} \
             tokens"
        )));
    }
    match max_tokens {
        None => Ok(n_ctx - n_prompt),
        Some(m) if n_prompt + m <= n_ctx => Ok(m),
        Some(m) => Err(over(format!(
            "the prompt ({n_prompt} tokens) plus max_tokens ({m}) is past the context of \
             {n_ctx} tokens"
        ))
        .with_param("max_tokens")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gen(v: Value) -> Result<Generation, ApiError> {
        parse_generation(&Fields(v.as_object().unwrap()), false, 7, 1000)
    }

    #[test]
    fn defaults_and_values() {
        let g = gen(json!({})).unwrap();
        assert_eq!(
            g.params,
            SamplerParams {
                seed: 7,
                ..Default::default()
            }
        );
        assert_eq!((g.max_tokens, g.logprobs, g.stream), (None, None, false));
        let g = gen(
            json!({"temperature": 0, "top_k": 5, "seed": 3, "max_tokens": 9,
                           "stop": ["a", "b"], "logprobs": 2, "stream": true,
                           "stream_options": {"include_usage": true}}),
        )
        .unwrap();
        assert_eq!(g.params.temperature, 0.0);
        assert_eq!((g.params.top_k, g.params.seed), (5, 3));
        assert_eq!((g.max_tokens, g.logprobs), (Some(9), Some(2)));
        assert_eq!(g.stop, vec!["a", "b"]);
        assert!(g.stream && g.include_usage);
        assert!(!g.ignore_eos);
        assert!(gen(json!({"ignore_eos": true})).unwrap().ignore_eos);
        let window = |n: i64| {
            gen(json!({"repeat_last_n": n}))
                .unwrap()
                .params
                .repeat_last_n
        };
        assert_eq!((window(0), window(128), window(-1)), (0, 128, usize::MAX));
    }

    /// `n` (or llama-server's `n_cmpl`) from 1 to the slots; out of range or not an integer, a
    /// 400 naming the field. Choice i's seed is the request's plus i where it gave one (-1 is
    /// none), else a seed of its own; choice 0 keeps the request's.
    #[test]
    fn choices_and_their_seeds() {
        let mut rng = crate::tools::test_util::Rng(0x0C40_1CE5);
        for _ in 0..200 {
            let parallel = 1 + rng.below(16);
            let n = rng.below(parallel + 3) as i64 - 1;
            let key = ["n", "n_cmpl"][rng.below(2)];
            let body = json!({ key: n });
            let got = parse_choices(&Fields(body.as_object().unwrap()), parallel);
            if (1..=parallel as i64).contains(&n) {
                assert_eq!(got.unwrap(), n as usize);
            } else {
                let e = got.unwrap_err();
                assert_eq!(e.status, 400, "{body}");
                assert_eq!(e.param.as_deref(), Some(key), "{body}");
            }
            let seed = rng.next() >> 34; // (30 bits: exact as a float too)
            let i = rng.below(8);
            let fresh = rng.next();
            for (req, want) in [
                (json!({"seed": seed}), seed.wrapping_add(i as u64)),
                (json!({"seed": seed as f64}), seed.wrapping_add(i as u64)),
                (json!({"seed": -1}), if i == 0 { seed } else { fresh }),
                (json!({}), if i == 0 { seed } else { fresh }),
            ] {
                let f = Fields(req.as_object().unwrap());
                assert_eq!(choice_seed(&f, seed, i, || fresh), want, "{req} {i}");
            }
        }
        for body in [json!({"n": "2"}), json!({"n": 1.5}), json!({"n_cmpl": [1]})] {
            let e = parse_choices(&Fields(body.as_object().unwrap()), 8).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
        }
        assert_eq!(parse_choices(&Fields(&Map::new()), 1).unwrap(), 1);
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        for (body, field) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": -1}), "temperature"),
            (json!({"temperature": 1e300}), "temperature"),
            (json!({"top_p": 2}), "top_p"),
            (json!({"top_k": -3}), "top_k"),
            (json!({"top_k": 1.5}), "top_k"),
            (json!({"max_tokens": -5}), "max_tokens"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 1e30}), "max_tokens"),
            (json!({"max_tokens": "10"}), "max_tokens"),
            (json!({"seed": "x"}), "seed"),
            (json!({"stop": 3}), "stop"),
            (json!({"stop": [1]}), "stop"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"ignore_eos": 1}), "ignore_eos"),
            (json!({"logprobs": 50}), "logprobs"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (json!({"stream_options": 1}), "stream_options"),
            (json!({"repeat_last_n": -2}), "repeat_last_n"),
            (json!({"typical_p": "x"}), "typical_p"),
            (json!({"top_n_sigma": 1e300}), "top_n_sigma"),
            (json!({"xtc_probability": 2}), "xtc_probability"),
            (json!({"xtc_threshold": -0.1}), "xtc_threshold"),
            (json!({"dynatemp_range": [1]}), "dynatemp_range"),
            (json!({"dynatemp_exponent": 1e39}), "dynatemp_exponent"),
            (json!({"mirostat": 3}), "mirostat"),
            (json!({"mirostat": 1.5}), "mirostat"),
            (json!({"mirostat_tau": true}), "mirostat_tau"),
            (json!({"mirostat_eta": -1e300}), "mirostat_eta"),
            (json!({"min_keep": -1}), "min_keep"),
            (json!({"dry_multiplier": "x"}), "dry_multiplier"),
            (json!({"dry_base": 1e39}), "dry_base"),
            (json!({"dry_allowed_length": -1}), "dry_allowed_length"),
            (json!({"dry_penalty_last_n": -1}), "dry_penalty_last_n"),
            (json!({"dry_penalty_last_n": 1.5}), "dry_penalty_last_n"),
            (
                json!({"dry_sequence_breakers": []}),
                "dry_sequence_breakers",
            ),
            (
                json!({"dry_sequence_breakers": "\n"}),
                "dry_sequence_breakers",
            ),
            (
                json!({"dry_sequence_breakers": ["a", 1]}),
                "dry_sequence_breakers",
            ),
        ] {
            let e = gen(body.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            assert!(e.message.starts_with(field), "{body}: {}", e.message);
        }
    }

    #[test]
    fn logit_bias_is_parsed_sorted_and_checked() {
        let g = gen(json!({"logit_bias": {"17": 5, "3": -100, "999": 100.0}})).unwrap();
        assert_eq!(
            g.params.logit_bias,
            vec![(3, -100.0), (17, 5.0), (999, 100.0)]
        );
        assert!(gen(json!({"logit_bias": {}}))
            .unwrap()
            .params
            .logit_bias
            .is_empty());
        let many: Map<String, Value> = (0..=MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        for (body, says) in [
            (json!({"logit_bias": [[1, 2]]}), "must be an object"),
            (
                json!({"logit_bias": {"1000": 1}}),
                "not a token id from 0 to 999",
            ),
            (json!({"logit_bias": {"-1": 1}}), "not a token id"),
            (json!({"logit_bias": {"hello": 1}}), "not a token id"),
            (json!({"logit_bias": {"5": 101}}), "from -100 to 100"),
            (json!({"logit_bias": {"5": "big"}}), "from -100 to 100"),
            (json!({ "logit_bias": many }), "at most 300"),
        ] {
            let e = gen(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("logit_bias"), "{body}");
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
    }

    #[test]
    fn tools_are_refused_on_completions_not_ignored() {
        for (body, field) in [
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
                "tools",
            ),
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tool_choice": {"type": "function"}}), "tool_choice"),
            (json!({"function_call": {"name": "f"}}), "function_call"),
        ] {
            let e = gen(body.clone()).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
        }
        // What asks for nothing beyond plain text is accepted.
        for body in [
            json!({"tools": []}),
            json!({"tool_choice": "none"}),
            json!({"tool_choice": "auto"}),
        ] {
            assert!(gen(body.clone()).is_ok(), "{body}");
        }
        // Chat completions read them (`tools::parse_tools`).
        let chat = json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                          "tool_choice": "required"});
        assert!(parse_generation(&Fields(chat.as_object().unwrap()), true, 7, 1000).is_ok());
    }

    #[test]
    fn chat_logprobs() {
        let f = |v: Value| parse_generation(&Fields(v.as_object().unwrap()), true, 0, 1000);
        assert_eq!(
            f(json!({"logprobs": true, "top_logprobs": 3}))
                .unwrap()
                .logprobs,
            Some(3)
        );
        assert_eq!(f(json!({"logprobs": false})).unwrap().logprobs, None);
        assert!(f(json!({"top_logprobs": 3})).is_err());
        assert!(f(json!({"logprobs": 1})).is_err());
    }

    #[test]
    fn bodies() {
        assert_eq!(
            parse_object(b"\xff{}").unwrap_err().code,
            Some("invalid_utf8")
        );
        assert_eq!(
            parse_object(b"{\"a\":").unwrap_err().code,
            Some("invalid_json")
        );
        assert_eq!(parse_object(b"[1]").unwrap_err().code, Some("invalid_json"));
        assert!(parse_object(b"{\"a\": 1}").is_ok());
    }

    #[test]
    fn context_fit() {
        assert_eq!(fit_context(10, None, 512).unwrap(), 502);
        assert_eq!(fit_context(10, Some(502), 512).unwrap(), 502);
        let e = fit_context(10, Some(503), 512).unwrap_err();
        assert_eq!(e.extra["n_prompt_tokens"], 10);
        assert_eq!(e.extra["n_ctx"], 512);
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(fit_context(512, None, 512).is_err());
    }

    #[test]
    fn token_id_arrays() {
        assert_eq!(token_ids(&[json!(0), json!(9)], 10).unwrap(), vec![0, 9]);
        assert!(token_ids(&[json!(10)], 10)
            .unwrap_err()
            .contains("[0] = 10"));
        assert!(token_ids(&[json!(-1)], 10).is_err());
        assert!(token_ids(&[json!(1.5)], 10).is_err());
    }

    #[test]
    fn dry_is_read_as_llama_server_reads_it() {
        let p = gen(
            json!({"dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3,
                           "dry_penalty_last_n": 0, "dry_sequence_breakers": ["ab", "\n"]}),
        )
        .unwrap()
        .params;
        assert_eq!((p.dry_multiplier, p.dry_base), (0.8, 2.0));
        assert_eq!((p.dry_allowed_length, p.dry_penalty_last_n), (3, 0));
        assert_eq!(p.dry_sequence_breakers, ["ab", "\n"]);
        // A base below 1 is the default; unset, llama.cpp's defaults.
        let d = SamplerParams::default();
        let p = gen(json!({"dry_base": 0.5})).unwrap().params;
        assert_eq!(p.dry_base, 1.75);
        assert_eq!(p.dry_multiplier, 0.0);
        assert_eq!(p.dry_penalty_last_n, d.dry_penalty_last_n);
        assert_eq!(p.dry_sequence_breakers, d.dry_sequence_breakers);
    }
}
