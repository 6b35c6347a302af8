//! llama-server's own completion endpoint, `POST /completion` (not OpenAI's): its request fields
//! turned into the ones `api::parse_generation` reads, and its answer (`content`, `stop_type`,
//! `tokens_predicted`, `generation_settings`, `completion_probabilities`, ...; with `stream`, an
//! event per token, then a last event with `"stop": true` and no `[DONE]`). llama.cpp's samplers
//! (typical-p, top-n-sigma, XTC, DRY, dynamic temperature, mirostat, min_keep) are read as the
//! OpenAI endpoints read them (`api::parse_generation`), and so are `grammar` and `json_schema`
//! (`constrain`); features Muser does not have (`samplers`, `lora`, ...) are a 400 naming them
//! when a request turns them on, never silently ignored.

use crate::api::{show, Fields, Generation, MAX_TOP_LOGPROBS};
use crate::error::ApiError;
use crate::scheduler::{Event, Finish, FinishReason, Logprob};
use crate::ModelInfo;
use axum::response::sse::Event as SseEvent;
use futures_util::stream::{self, Stream};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// What a /completion request asks of the answer beyond the generation itself.
#[derive(Default)]
pub struct Native {
    /// `return_tokens`: the generated ids in `tokens`.
    pub return_tokens: bool,
    /// `n_probs`: each token's logprob and its n most likely alternatives.
    pub n_probs: usize,
}

/// A token's logprob entry, as llama-server's `completion_probabilities` and OpenAI's chat
/// logprobs write it: `bytes` are the token's own bytes (part of a character, for some), `token`
/// their text with an incomplete character replaced.
pub(crate) fn token_entry(m: &ModelInfo, id: u32, logprob: f32) -> Value {
    let raw = m.piece_bytes(id);
    json!({"id": id, "token": String::from_utf8_lossy(raw), "logprob": logprob, "bytes": raw})
}

/// llama-server's fields that change the answer and that Muser does not implement, with the
/// value that leaves each off: a request that sets another value gets a 400 naming the field.
/// llama-server reads them on its OpenAI endpoints too, so those refuse them as well.
pub(crate) fn refuse_unsupported(f: &Fields) -> Result<(), ApiError> {
    let refuse = |k: &str, v: &Value| {
        Err(ApiError::param(
            k,
            format!("{k} {} is not supported by Muser", show(v)),
        ))
    };
    for (k, off) in [("t_max_predict_ms", 0.0), ("n_indent", 0.0)] {
        match f.get(k) {
            Some(v) if v.as_f64() != Some(off) => return refuse(k, v),
            _ => {}
        }
    }
    // llama.cpp's adaptive-p sampler, on at a target of 0 or more (negative is off).
    match f.get("adaptive_target") {
        Some(v) if v.as_f64().is_none_or(|t| t >= 0.0) => return refuse("adaptive_target", v),
        _ => {}
    }
    for k in [
        "post_sampling_probs",
        "timings_per_token",
        "return_progress",
    ] {
        match f.get(k) {
            None | Some(Value::Bool(false)) => {}
            Some(v) => return refuse(k, v),
        }
    }
    for k in ["samplers", "response_fields", "lora"] {
        match f.get(k) {
            None => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(v) => return refuse(k, v),
        }
    }
    Ok(())
}

/// `logit_bias` as llama-server's pairs [token id, bias], `false` banning the token: the object
/// from ids to biases that OpenAI's field is.
fn bias_pairs(pairs: &[Value]) -> Result<Map<String, Value>, ApiError> {
    let mut o = Map::new();
    for (i, pair) in pairs.iter().enumerate() {
        match pair.as_array().map(Vec::as_slice) {
            Some([Value::Number(id), bias @ (Value::Number(_) | Value::Bool(false))]) => {
                let bias = if bias.is_boolean() {
                    json!(-100)
                } else {
                    bias.clone()
                };
                o.insert(id.to_string(), bias);
            }
            _ => {
                return Err(ApiError::param(
                    "logit_bias",
                    format!(
                        "logit_bias[{i}] must be a pair [token id, bias or false], got {} \
                         (token strings are not supported)",
                        show(pair)
                    ),
                ))
            }
        }
    }
    Ok(o)
}

/// A /completion request as the OpenAI completion request `parse_generation` reads.
pub fn translate(mut obj: Map<String, Value>) -> Result<(Map<String, Value>, Native), ApiError> {
    let f = Fields(&obj);
    refuse_unsupported(&f)?;
    // n_predict: -1 (llama-server's default) is until the context is full.
    let until_full =
        match f.integer("n_predict", -1, i32::MAX as i64)? {
            Some(-1) => true,
            Some(0) => return Err(ApiError::param(
                "n_predict",
                "n_predict 0 (evaluating the prompt only) is not supported; ask for 1 token or \
                 more",
            )),
            _ => false,
        };
    // A negative temperature is llama-server's greedy.
    let greedy = f
        .get("temperature")
        .and_then(Value::as_f64)
        .is_some_and(|t| t < 0.0);
    // `logprobs` is llama-server's alias of n_probs, read when n_probs is absent.
    let probs_field = if f.get("n_probs").is_none() && f.get("logprobs").is_some() {
        "logprobs"
    } else {
        "n_probs"
    };
    let n_probs = f
        .integer(probs_field, 0, MAX_TOP_LOGPROBS as i64)?
        .unwrap_or(0) as usize;
    let bias = match f.get("logit_bias") {
        Some(Value::Array(pairs)) => Some(bias_pairs(pairs)?),
        _ => None,
    };
    let return_tokens = f.boolean("return_tokens")?.unwrap_or(false);
    f.boolean("cache_prompt")?;

    if until_full {
        // llama-server's n_predict wins over an OpenAI max_tokens in the same request.
        obj.remove("n_predict");
        obj.remove("max_tokens");
        obj.remove("max_completion_tokens");
    }
    if greedy {
        obj.insert("temperature".into(), json!(0));
    }
    obj.remove("logprobs");
    // llama-server's /completion has no echo.
    obj.remove("echo");
    if n_probs > 0 {
        obj.insert("logprobs".into(), json!(n_probs));
    }
    if let Some(bias) = bias {
        obj.insert("logit_bias".into(), Value::Object(bias));
    }
    Ok((
        obj,
        Native {
            return_tokens,
            n_probs,
        },
    ))
}

/// How to write the answer to one /completion request.
pub struct NativeReply {
    pub info: Arc<ModelInfo>,
    pub native: Native,
    /// `generation_settings`: the request's settings as they were read.
    pub settings: Value,
    /// The prompt as text (its tokens decoded, special tokens included).
    pub prompt: String,
    pub n_prompt: usize,
}

/// llama-server's `generation_settings` of a request: its settings as they were read (the
/// answer of /completion, the `params` of a slot in GET /slots, and, for a request that sets
/// nothing, the defaults in GET /props).
pub(crate) fn generation_settings(gen: &Generation) -> Value {
    let p = &gen.params;
    let window = if p.repeat_last_n == usize::MAX {
        -1
    } else {
        p.repeat_last_n as i64
    };
    let bias: Vec<Value> = p
        .logit_bias
        .iter()
        .map(|&(id, b)| json!({"token": id, "bias": b}))
        .collect();
    let n_predict = gen.max_tokens.map_or(-1, |n| n as i64);
    // llama-server's names and order.
    json!({
        "seed": p.seed,
        "temperature": p.temperature,
        "dynatemp_range": p.dynatemp_range,
        "dynatemp_exponent": p.dynatemp_exponent,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "repeat_last_n": window,
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
        "dry_sequence_breakers": p.dry_sequence_breakers,
        "mirostat": p.mirostat,
        "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta,
        "stop": gen.stop,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "ignore_eos": gen.ignore_eos,
        "stream": gen.stream,
        "logit_bias": bias,
        // `translate` makes /completion's n_probs the request's logprobs.
        "n_probs": gen.logprobs.unwrap_or(0),
        "min_keep": p.min_keep,
        "grammar": gen.grammar.as_ref().map_or("", |c| c.gbnf.as_str()),
        "grammar_lazy": gen.grammar.as_ref().is_some_and(|c| c.triggers.is_some()),
        "grammar_triggers": gen.grammar.as_ref().map_or(&[][..], |c| &c.triggers_json[..]),
        "preserved_tokens": gen.preserved,
    })
}

impl NativeReply {
    pub fn new(info: Arc<ModelInfo>, native: Native, gen: &Generation, prompt: &[u32]) -> Self {
        let text = info.tokenizer.decode(prompt).unwrap_or_default();
        NativeReply {
            prompt: String::from_utf8_lossy(&text).into_owned(),
            n_prompt: prompt.len(),
            info,
            native,
            settings: generation_settings(gen),
        }
    }

    fn probs(&self, lps: &[Logprob]) -> Value {
        let m = &self.info;
        lps.iter()
            .map(|l| {
                let mut e = token_entry(m, l.id, l.logprob);
                e["top_logprobs"] = l
                    .top
                    .iter()
                    .map(|&(id, lp)| token_entry(m, id, lp))
                    .collect();
                e
            })
            .collect()
    }

    /// A streamed token: its text and id (none for the held-back text released at the end), and
    /// the slot that runs the request.
    fn event(
        &self,
        text: &str,
        id: Option<u32>,
        lps: &[Logprob],
        n_predicted: usize,
        slot: usize,
    ) -> Value {
        let mut v = json!({
            "index": 0,
            "content": text,
            "tokens": id.into_iter().collect::<Vec<_>>(),
            "stop": false,
            "id_slot": slot,
            "tokens_predicted": n_predicted,
            "tokens_evaluated": self.n_prompt,
        });
        if self.native.n_probs > 0 && !lps.is_empty() {
            v["completion_probabilities"] = self.probs(lps);
        }
        v
    }

    /// The whole answer (streamed: its last event, whose content is empty; `new_line`: whether
    /// the generated text holds a newline, streamed or not).
    pub(crate) fn last(
        &self,
        content: &str,
        new_line: bool,
        ids: &[u32],
        lps: &[Logprob],
        f: &Finish,
        stream: bool,
    ) -> Value {
        let stop_type = match (f.reason, &f.stop_word) {
            (FinishReason::Length, _) => "limit",
            (FinishReason::Stop, Some(_)) => "word",
            (FinishReason::Stop, None) => "eos",
        };
        let mut settings = self.settings.clone();
        settings["stream"] = json!(stream);
        let mut v = json!({
            "index": 0,
            "content": content,
            "tokens": if self.native.return_tokens && !stream { ids.to_vec() } else { Vec::new() },
            "id_slot": f.slot,
            "stop": true,
            "model": self.info.id,
            "tokens_predicted": f.completion_tokens,
            "tokens_evaluated": f.prompt_tokens,
            "generation_settings": settings,
            "prompt": self.prompt,
            "has_new_line": new_line,
            // As llama-server: the generation ran until the context was full.
            "truncated": f.reason == FinishReason::Length
                && f.prompt_tokens + f.completion_tokens >= self.info.n_ctx,
            "stop_type": stop_type,
            "stopping_word": f.stop_word.as_deref().unwrap_or(""),
            "tokens_cached": f.cached_tokens,
            "timings": crate::http::timings(f),
        });
        if self.native.n_probs > 0 && !stream {
            v["completion_probabilities"] = self.probs(lps);
        }
        v
    }
}

/// The answer of a request that does not stream.
pub async fn collect(
    reply: NativeReply,
    mut rx: UnboundedReceiver<Event>,
) -> Result<Value, ApiError> {
    let (mut text, mut ids, mut lps) = (String::new(), Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token {
                id,
                text: t,
                logprob,
                offset,
                ..
            } => {
                text.push_str(&t);
                ids.extend(id);
                lps.extend(logprob.map(|l| (l, offset)));
            }
            Event::Done(f) => {
                let lps = crate::scheduler::before_stop(lps, &text, &f);
                let new_line = text.contains('\n');
                return Ok(reply.last(&text, new_line, &ids, &lps, &f, false));
            }
            Event::Error(e) => return Err(e),
            // (never sent: `translate` drops echo, which llama-server's /completion lacks)
            Event::Prompt(_) => {}
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the answer was complete",
    ))
}

/// Server-sent events: one per token, then the whole answer's fields with `"stop": true` (as
/// llama-server: no `[DONE]`). Dropping the stream (the client went away) drops the receiver,
/// which the engine notices at its next step.
pub fn sse(
    reply: NativeReply,
    rx: UnboundedReceiver<Event>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    stream::unfold(
        (reply, rx, 0usize, false, false),
        move |(reply, mut rx, mut n, mut new_line, ended)| async move {
            if ended {
                return None;
            }
            let (v, end) = loop {
                break match rx.recv().await {
                    Some(Event::Token {
                        id,
                        text,
                        logprob,
                        slot,
                        ..
                    }) => {
                        n += usize::from(id.is_some());
                        new_line |= text.contains('\n');
                        let lps: Vec<Logprob> = logprob.into_iter().collect();
                        (reply.event(&text, id, &lps, n, slot), false)
                    }
                    Some(Event::Done(f)) => (reply.last("", new_line, &[], &[], &f, true), true),
                    Some(Event::Error(e)) => (e.body(), true),
                    // (never sent: `translate` drops echo)
                    Some(Event::Prompt(_)) => continue,
                    None => (
                        ApiError::internal("the engine stopped before the answer was complete")
                            .body(),
                        true,
                    ),
                };
            };
            Some((data(v), (reply, rx, n, new_line, end)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::parse_generation;

    fn read(v: Value) -> Result<(Generation, Native), ApiError> {
        let (obj, native) = translate(v.as_object().unwrap().clone())?;
        Ok((parse_generation(&Fields(&obj), false, 7, 1000)?, native))
    }

    #[test]
    fn llama_server_fields_become_the_generation() {
        let (g, n) = read(json!({"n_predict": -1, "temperature": -0.5, "n_probs": 4,
                                 "logit_bias": [[5, false], [9, 2.5]], "repeat_last_n": -1,
                                 "return_tokens": true, "cache_prompt": true, "mirostat": 0,
                                 "grammar": "", "typical_p": 1.0, "top_n_sigma": -1}))
        .unwrap();
        assert_eq!(g.max_tokens, None);
        assert_eq!(g.params.temperature, 0.0);
        assert_eq!(g.logprobs, Some(4));
        assert_eq!(g.params.logit_bias, vec![(5, -100.0), (9, 2.5)]);
        assert_eq!(g.params.repeat_last_n, usize::MAX);
        assert!(n.return_tokens && n.n_probs == 4);
        // `logprobs` is n_probs' alias when n_probs is absent, as in llama-server.
        let (g, n) = read(json!({"n_predict": 3, "logprobs": 5})).unwrap();
        assert_eq!((g.max_tokens, g.logprobs, n.n_probs), (Some(3), Some(5), 5));
        let (g, n) = read(json!({"logprobs": 3, "n_probs": 2})).unwrap();
        assert_eq!((g.logprobs, n.n_probs), (Some(2), 2));
        assert_eq!(
            read(json!({"logprobs": "x"}))
                .err()
                .unwrap()
                .param
                .as_deref(),
            Some("logprobs")
        );
    }

    #[test]
    fn llama_cpp_samplers_are_read_and_shown_in_the_settings() {
        let (g, _) = read(
            json!({"typical_p": 0.5, "top_n_sigma": 1.5, "xtc_probability": 0.25,
                                 "xtc_threshold": 0.2, "dynatemp_range": 0.3,
                                 "dynatemp_exponent": 2, "mirostat": 2, "mirostat_tau": 4,
                                 "mirostat_eta": 0.2, "min_keep": 3, "dry_multiplier": 0.8,
                                 "dry_sequence_breakers": ["x"]}),
        )
        .unwrap();
        let p = &g.params;
        assert_eq!((p.typical_p, p.top_n_sigma), (0.5, 1.5));
        assert_eq!((p.xtc_probability, p.xtc_threshold), (0.25, 0.2));
        assert_eq!((p.dynatemp_range, p.dynatemp_exponent), (0.3, 2.0));
        assert_eq!((p.mirostat, p.mirostat_tau, p.mirostat_eta), (2, 4.0, 0.2));
        assert_eq!(p.min_keep, 3);
        let s = generation_settings(&g);
        assert_eq!((&s["mirostat"], &s["min_keep"]), (&json!(2), &json!(3)));
        assert_eq!(s["dry_multiplier"], json!(0.8f32));
        assert_eq!(s["dry_sequence_breakers"], json!(["x"]));
        assert_eq!(
            (&s["typical_p"], &s["xtc_threshold"]),
            (&json!(0.5), &json!(0.2f32))
        );
        // Unset, llama.cpp's defaults.
        let s = generation_settings(&read(json!({})).unwrap().0);
        for (k, v) in [
            ("top_n_sigma", -1.0),
            ("typical_p", 1.0),
            ("mirostat_tau", 5.0),
            ("dynatemp_exponent", 1.0),
            ("xtc_probability", 0.0),
            ("dry_multiplier", 0.0),
            ("dry_base", 1.75),
            ("dry_allowed_length", 2.0),
            ("dry_penalty_last_n", 64.0),
        ] {
            assert_eq!(s[k].as_f64(), Some(v), "{k}");
        }
        assert_eq!((&s["mirostat"], &s["min_keep"]), (&json!(0), &json!(0)));
    }

    #[test]
    fn features_muser_lacks_are_refused_by_name() {
        for (v, field) in [
            (json!({"samplers": ["top_k"]}), "samplers"),
            (json!({"post_sampling_probs": true}), "post_sampling_probs"),
            (json!({"n_predict": 0}), "n_predict"),
            (json!({"n_predict": -2}), "n_predict"),
            (json!({"logit_bias": [["hello", 1.0]]}), "logit_bias"),
            (json!({"logit_bias": [[5]]}), "logit_bias"),
            (json!({"logit_bias": [[5, true]]}), "logit_bias"),
            (json!({"n_probs": 21}), "n_probs"),
            (json!({"adaptive_target": 0.5}), "adaptive_target"),
            (json!({"adaptive_target": "x"}), "adaptive_target"),
        ] {
            let e = read(v.clone()).err().unwrap();
            assert_eq!(e.status, 400, "{v}");
            assert_eq!(e.param.as_deref(), Some(field), "{v}: {}", e.message);
        }
        // llama.cpp's off values pass.
        for v in [
            json!({"adaptive_target": -1.0}),
            json!({"adaptive_decay": 0.9}),
        ] {
            assert!(read(v.clone()).is_ok(), "{v}");
        }
    }
}
