//! Constrained decoding: llama-server's `grammar` (GBNF) and `json_schema` fields, and OpenAI's
//! `response_format` (`json_object`, `json_schema`), become a grammar the sampler holds every
//! generated token to (`Sampler::set_grammar`). A JSON schema becomes GBNF first
//! (`muser_jsonschema`), as llama-server turns it into GBNF; the grammar text is what a client
//! reads back in `generation_settings.grammar`.
//!
//! Everything here runs before the request is queued (the fields read on its handler, the
//! grammar built on tokio's blocking pool): a grammar that does not parse, or a schema Muser
//! cannot turn into one, is a 400 naming the field and the problem, and the engine thread never
//! sees it. Both conversions do bounded work (muser-jsonschema's and muser-grammar's limits).

use crate::api::{show, Fields};
use crate::error::ApiError;
use crate::ModelInfo;
use muser_sample::{Grammar, GrammarVocab, TriggerKind, Triggers};
use muser_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::fmt;
use std::sync::Arc;

/// A request's grammar: its GBNF text, the grammar parsed from it, and the vocabulary as the
/// grammar sees it.
#[derive(Clone)]
pub struct Constraint {
    /// The GBNF (a JSON schema's conversion for `json_schema` and `response_format`).
    pub gbnf: String,
    pub grammar: Arc<Grammar>,
    pub vocab: Arc<GrammarVocab>,
    /// A lazy grammar's triggers (None: it applies from the first generated token).
    pub triggers: Option<Arc<Triggers>>,
    /// The triggers as llama-server shows them in `generation_settings.grammar_triggers`.
    pub triggers_json: Vec<Value>,
    /// The request field the grammar came from, named by an error mid-generation.
    pub field: &'static str,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("gbnf", &self.gbnf)
            .finish_non_exhaustive()
    }
}

/// Where a request's constraint came from, for error messages.
#[derive(Clone, Copy)]
pub enum Source {
    Grammar,
    JsonSchema,
    ResponseFormat,
    /// The grammar of a chat request's tool calls (`tools::Format::plan`).
    Tools,
}

impl Source {
    pub fn field(self) -> &'static str {
        match self {
            Source::Grammar => "grammar",
            Source::JsonSchema => "json_schema",
            Source::ResponseFormat => "response_format",
            Source::Tools => "tools",
        }
    }
}

/// One trigger of a lazy grammar as a request gives it (llama-server's `grammar_triggers`:
/// `{"type": 0 token | 1 word | 2 pattern | 3 full pattern, "value": text, "token": id}`).
#[derive(Clone, Debug, PartialEq)]
pub enum TriggerSpec {
    Token(u32, String),
    Word(String),
    Pattern(String),
    PatternFull(String),
}

impl TriggerSpec {
    fn json(&self) -> Value {
        match self {
            TriggerSpec::Token(id, v) => json!({"type": 0, "value": v, "token": id}),
            TriggerSpec::Word(v) => json!({"type": 1, "value": v}),
            TriggerSpec::Pattern(v) => json!({"type": 2, "value": v}),
            TriggerSpec::PatternFull(v) => json!({"type": 3, "value": v}),
        }
    }
}

/// The token `text` is, when it is exactly one (special tokens' text included, as llama.cpp
/// tokenizes a preserved token or a trigger word).
pub fn one_token(tok: &Tokenizer, text: &str) -> Option<u32> {
    match tok.encode(text, false, true).as_slice() {
        [id] => Some(*id),
        _ => None,
    }
}

/// The tokens a request's `preserved_tokens` name (each string that is one token, special
/// tokens included, as llama-server reads them; others name no token and are skipped, as
/// there). Their text is part of the output even when they are control tokens, and a word
/// trigger that is one of them triggers on that token.
pub fn preserved_tokens(f: &Fields, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let key = "preserved_tokens";
    let mut ids = Vec::new();
    match f.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                let Value::String(t) = t else {
                    return Err(ApiError::param(
                        key,
                        format!("{key}[{i}] must be a string, got {}", show(t)),
                    ));
                };
                ids.extend(one_token(tok, t));
            }
        }
        Some(v) => {
            return Err(ApiError::param(
                key,
                format!("{key} must be an array of strings, got {}", show(v)),
            ))
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Most triggers a lazy grammar may have, and most bytes of trigger text in all.
pub const MAX_TRIGGERS: usize = 64;
pub const MAX_TRIGGER_BYTES: usize = 16 << 10;

/// `grammar_lazy` and `grammar_triggers`: None when the grammar applies from the first token.
/// A lazy grammar needs a trigger; triggers without `grammar_lazy: true` are an error rather
/// than ignored.
fn read_lazy(f: &Fields, n_vocab: usize) -> Result<Option<Vec<TriggerSpec>>, ApiError> {
    let key = "grammar_triggers";
    let lazy = f.boolean("grammar_lazy")?.unwrap_or(false);
    let mut triggers = Vec::new();
    match f.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                let bad = |what: &str| {
                    ApiError::param(key, format!("{key}[{i}] {what}, got {}", show(t)))
                };
                let kind = t.get("type").and_then(Value::as_i64);
                let value = t.get("value").and_then(Value::as_str).map(str::to_string);
                let Some(value) = value else {
                    return Err(bad("needs a string \"value\""));
                };
                if value.is_empty() && kind != Some(0) {
                    return Err(bad("has an empty \"value\" (it would fire at once)"));
                }
                triggers.push(match kind {
                    Some(0) => {
                        let id = t
                            .get("token")
                            .and_then(Value::as_u64)
                            .filter(|&id| (id as usize) < n_vocab)
                            .ok_or_else(|| {
                                bad(&format!(
                                    "of type 0 (token) needs a \"token\" id from 0 to {}",
                                    n_vocab.saturating_sub(1)
                                ))
                            })?;
                        TriggerSpec::Token(id as u32, value)
                    }
                    Some(1) => TriggerSpec::Word(value),
                    Some(2) => TriggerSpec::Pattern(value),
                    Some(3) => TriggerSpec::PatternFull(value),
                    _ => {
                        return Err(bad(
                            "needs a \"type\": 0 (token), 1 (word), 2 (pattern) or 3 (full \
                             pattern)",
                        ))
                    }
                });
            }
        }
        Some(v) => {
            return Err(ApiError::param(
                key,
                format!("{key} must be an array of triggers, got {}", show(v)),
            ))
        }
    }
    // Each text trigger is searched over the output after every token until one fires: a bound
    // on their number and size bounds that work.
    if triggers.len() > MAX_TRIGGERS {
        return Err(ApiError::param(
            key,
            format!(
                "{key} has {} triggers; at most {MAX_TRIGGERS}",
                triggers.len()
            ),
        ));
    }
    let bytes: usize = triggers
        .iter()
        .map(|t| match t {
            TriggerSpec::Token(..) => 0,
            TriggerSpec::Word(v) | TriggerSpec::Pattern(v) | TriggerSpec::PatternFull(v) => v.len(),
        })
        .sum();
    if bytes > MAX_TRIGGER_BYTES {
        return Err(ApiError::param(
            key,
            format!("{key}' values total {bytes} bytes; at most {MAX_TRIGGER_BYTES}"),
        ));
    }
    match (lazy, triggers.is_empty()) {
        (true, true) => Err(ApiError::param(
            key,
            "grammar_lazy needs at least one trigger in grammar_triggers",
        )),
        (false, false) => Err(ApiError::param(
            "grammar_lazy",
            "grammar_triggers apply only to a lazy grammar: set grammar_lazy to true",
        )),
        (true, false) => Ok(Some(triggers)),
        (false, true) => Ok(None),
    }
}

/// The vocabulary as a grammar sees it: each token's bytes as llama.cpp's `token_to_piece`
/// (special tokens rendered as their text) gives them, and whether it ends generation.
pub fn grammar_vocab(tok: &Tokenizer) -> GrammarVocab {
    let n = tok.n_vocab() as u32;
    let pieces = (0..n)
        .map(|id| tok.token_to_piece_bytes(id).unwrap_or(b"").to_vec())
        .collect();
    let eog = (0..n).map(|id| tok.is_eog(id)).collect();
    GrammarVocab::new(pieces, eog)
}

/// Parses GBNF, its `<token>` references resolved by the tokenizer (the text inside and with
/// the angle brackets must be exactly one token, special tokens included, as llama.cpp reads
/// them).
pub fn parse_gbnf(text: &str, tok: &Tokenizer) -> Result<Grammar, String> {
    let lookup = |t: &str| -> Option<u32> {
        let text = if t.starts_with('<') {
            t.to_string()
        } else {
            format!("<{t}>")
        };
        one_token(tok, &text)
    };
    Grammar::parse_with_tokens(text, &lookup).map_err(|e| e.to_string())
}

/// GBNF for a JSON schema, `{}` meaning any JSON object (as llama-server reads it).
pub fn schema_gbnf(schema: &Value) -> Result<String, String> {
    muser_jsonschema::schema_to_gbnf(&any_object_if_empty(schema)).map_err(|e| e.to_string())
}

/// `schema_gbnf`, its error naming the request field the schema came from.
pub fn schema_grammar(schema: &Value, source: Source) -> Result<String, ApiError> {
    schema_gbnf(schema).map_err(|e| {
        ApiError::param(
            source.field(),
            format!("{}: the JSON schema cannot be used: {e}", source.field()),
        )
    })
}

/// The schema, `{}` read as any JSON object (as llama-server reads it).
pub fn any_object_if_empty(schema: &Value) -> Value {
    match schema {
        Value::Object(o) if o.is_empty() => json!({"type": "object"}),
        s => s.clone(),
    }
}

/// What a request asks to be constrained by, as read from its fields (`read`), before the work
/// of turning it into a grammar (`build`).
pub struct Spec {
    pub kind: SpecKind,
    /// A lazy grammar's triggers (None: the grammar applies from the first token).
    pub lazy: Option<Vec<TriggerSpec>>,
    /// `preserved_tokens`: a word trigger that is one of these tokens triggers on the token.
    pub preserved: Vec<u32>,
}

pub enum SpecKind {
    Grammar(String),
    Schema(Value, Source),
    /// GBNF made by the server (a tool-call plan): its errors are Muser's or the tools'.
    Made(String, Source),
}

impl Spec {
    /// A tool-call plan's grammar, lazy from its triggers when the plan is.
    pub fn tools(plan: &crate::tools::Plan, preserved: Vec<u32>) -> Spec {
        use crate::tools::Trigger;
        let lazy = plan.lazy.then(|| {
            plan.triggers
                .iter()
                .map(|t| match t {
                    Trigger::Word(w) => TriggerSpec::Word(w.clone()),
                    Trigger::Pattern(p) => TriggerSpec::Pattern(p.clone()),
                    Trigger::PatternFull(p) => TriggerSpec::PatternFull(p.clone()),
                })
                .collect()
        });
        Spec {
            kind: SpecKind::Made(plan.gbnf.clone(), Source::Tools),
            lazy,
            preserved,
        }
    }
}

/// A request's constraint: `grammar` (GBNF) or `json_schema` (not both), or `response_format`,
/// as llama-server reads them on its OpenAI endpoints (and Muser on /completion too):
/// `{"type": "text"}` is none, `{"type": "json_object"}` any JSON object (or its `schema`, when
/// it has one), `{"type": "json_schema", "json_schema": {"schema": ...}}` that schema (OpenAI's
/// `name` and `strict` are accepted and change nothing: the output always follows the schema).
/// An empty `grammar` is none, as in llama-server.
pub fn read(f: &Fields, tok: &Tokenizer, preserved: &[u32]) -> Result<Option<Spec>, ApiError> {
    let grammar = f.string("grammar")?.filter(|g| !g.is_empty());
    let mut schema = f
        .get("json_schema")
        .cloned()
        .map(|s| (s, Source::JsonSchema));
    if schema.is_some() && grammar.is_some() {
        return Err(ApiError::param(
            "grammar",
            "grammar and json_schema cannot be used together: give one of them",
        ));
    }
    if let Some(rf) = f.get("response_format") {
        let key = "response_format";
        let Value::Object(o) = rf else {
            return Err(ApiError::param(
                key,
                format!(
                    "{key} must be an object such as {{\"type\": \"json_object\"}}, got {}",
                    show(rf)
                ),
            ));
        };
        let kind = match o.get("type") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(v) => {
                return Err(ApiError::param(
                    key,
                    format!("{key}.type must be a string, got {}", show(v)),
                ))
            }
        };
        match kind {
            "" | "text" => {}
            "json_object" => {
                if o.contains_key("schema") || schema.is_none() {
                    let s = o.get("schema").cloned().unwrap_or_else(|| json!({}));
                    schema = Some((s, Source::ResponseFormat));
                }
            }
            "json_schema" => {
                let s = o
                    .get("json_schema")
                    .and_then(|w| w.get("schema"))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                schema = Some((s, Source::ResponseFormat));
            }
            other => {
                return Err(ApiError::param(
                    key,
                    format!(
                        "{key}.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                        show(&Value::String(other.into()))
                    ),
                ))
            }
        }
        if schema.is_some() && grammar.is_some() {
            return Err(ApiError::param(
                "grammar",
                "grammar and a JSON response_format cannot be used together: give one of them",
            ));
        }
    }
    let lazy = read_lazy(f, tok.n_vocab())?;
    let kind = match (grammar, schema) {
        (Some(g), _) => SpecKind::Grammar(g.to_string()),
        (None, Some((s, source))) => SpecKind::Schema(s, source),
        (None, None) => {
            if lazy.is_some() {
                return Err(ApiError::param(
                    "grammar_lazy",
                    "grammar_lazy needs a grammar (grammar, json_schema or response_format)",
                ));
            }
            return Ok(None);
        }
    };
    Ok(Some(Spec {
        kind,
        lazy,
        preserved: preserved.to_vec(),
    }))
}

/// The grammar of a request's `Spec`: a schema turned into GBNF, the GBNF parsed, and the
/// model's grammar vocabulary (made by the first request that needs it). Bounded work
/// (muser-jsonschema and muser-grammar cap what an input may cost), but up to a fraction of a
/// second on a large vocabulary or grammar: `build` runs it off the async workers.
pub fn compile(spec: Spec, m: &ModelInfo) -> Result<Constraint, ApiError> {
    let tok = &m.tokenizer;
    let (gbnf, source) = match spec.kind {
        SpecKind::Grammar(g) => (g, Source::Grammar),
        SpecKind::Made(g, source) => (g, source),
        SpecKind::Schema(s, source) => (schema_grammar(&s, source)?, source),
    };
    let grammar = parse_gbnf(&gbnf, tok).map_err(|e| {
        let what = match source {
            Source::Grammar => "the grammar does not parse",
            Source::Tools => "the grammar made from the tools does not parse",
            _ => "the grammar made from the JSON schema does not parse",
        };
        ApiError::param(source.field(), format!("{}: {what}: {e}", source.field()))
    })?;
    let vocab = m
        .grammar_vocab
        .get_or_init(|| Arc::new(grammar_vocab(tok)))
        .clone();
    let (triggers, triggers_json) = match spec.lazy {
        None => (None, Vec::new()),
        Some(list) => {
            let field = match source {
                Source::Tools => "tools",
                _ => "grammar_triggers",
            };
            let (t, shown) = triggers(list, &spec.preserved, tok)
                .map_err(|e| ApiError::param(field, format!("{field}: {e}")))?;
            (Some(Arc::new(t)), shown)
        }
    };
    Ok(Constraint {
        gbnf,
        grammar: Arc::new(grammar),
        vocab,
        triggers,
        triggers_json,
        field: source.field(),
    })
}

/// A lazy grammar's triggers for the sampler, as llama-server makes them: a word that is one
/// preserved token triggers on that token (a word that is one token and not preserved is an
/// error, as there), other words and patterns on the text. Also the list as
/// `generation_settings` shows it.
fn triggers(
    list: Vec<TriggerSpec>,
    preserved: &[u32],
    tok: &Tokenizer,
) -> Result<(Triggers, Vec<Value>), String> {
    let mut tokens = Vec::new();
    let mut patterns = Vec::new();
    let mut shown = Vec::new();
    for t in list {
        let t = match t {
            TriggerSpec::Word(w) => match one_token(tok, &w) {
                Some(id) if preserved.binary_search(&id).is_ok() => TriggerSpec::Token(id, w),
                Some(_) => {
                    return Err(format!(
                        "the trigger word {w:?} is one token: mark it as a preserved token \
                         (preserved_tokens)"
                    ))
                }
                _ => TriggerSpec::Word(w),
            },
            other => other,
        };
        shown.push(t.json());
        match t {
            TriggerSpec::Token(id, _) => tokens.push(id),
            TriggerSpec::Word(w) => patterns.push((TriggerKind::Word, w)),
            TriggerSpec::Pattern(p) => patterns.push((TriggerKind::Pattern, p)),
            TriggerSpec::PatternFull(p) => patterns.push((TriggerKind::PatternFull, p)),
        }
    }
    Ok((Triggers::new(tokens, &patterns)?, shown))
}

/// `compile` on tokio's blocking pool, so a large grammar never holds up the server's other
/// requests.
pub async fn build(spec: Option<Spec>, m: &Arc<ModelInfo>) -> Result<Option<Constraint>, ApiError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let m = m.clone();
    tokio::task::spawn_blocking(move || compile(spec, &m))
        .await
        .map_err(|e| ApiError::internal(format!("building the grammar failed: {e}")))?
        .map(Some)
}
