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
use muser_sample::{Grammar, GrammarVocab};
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
}

impl Source {
    fn field(self) -> &'static str {
        match self {
            Source::Grammar => "grammar",
            Source::JsonSchema => "json_schema",
            Source::ResponseFormat => "response_format",
        }
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
        match tok.encode(&text, false, true).as_slice() {
            [id] => Some(*id),
            _ => None,
        }
    };
    Grammar::parse_with_tokens(text, &lookup).map_err(|e| e.to_string())
}

/// GBNF for a JSON schema, `{}` meaning any JSON object (as llama-server reads it).
pub fn schema_gbnf(schema: &Value) -> Result<String, String> {
    let any_object = json!({"type": "object"});
    let schema = match schema {
        Value::Object(o) if o.is_empty() => &any_object,
        s => s,
    };
    muser_jsonschema::schema_to_gbnf(schema).map_err(|e| e.to_string())
}

/// What a request asks to be constrained by, as read from its fields (`read`), before the work
/// of turning it into a grammar (`build`).
pub enum Spec {
    Grammar(String),
    Schema(Value, Source),
}

/// A request's constraint: `grammar` (GBNF) or `json_schema` (not both), or `response_format`,
/// as llama-server reads them on its OpenAI endpoints (and Muser on /completion too):
/// `{"type": "text"}` is none, `{"type": "json_object"}` any JSON object (or its `schema`, when
/// it has one), `{"type": "json_schema", "json_schema": {"schema": ...}}` that schema (OpenAI's
/// `name` and `strict` are accepted and change nothing: the output always follows the schema).
/// An empty `grammar` is none, as in llama-server.
pub fn read(f: &Fields) -> Result<Option<Spec>, ApiError> {
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
    Ok(match (grammar, schema) {
        (Some(g), _) => Some(Spec::Grammar(g.to_string())),
        (None, Some((s, source))) => Some(Spec::Schema(s, source)),
        (None, None) => None,
    })
}

/// The grammar of a request's `Spec`: a schema turned into GBNF, the GBNF parsed, and the
/// model's grammar vocabulary (made by the first request that needs it). Bounded work
/// (muser-jsonschema and muser-grammar cap what an input may cost), but up to a fraction of a
/// second on a large vocabulary or grammar: `build` runs it off the async workers.
pub fn compile(spec: Spec, m: &ModelInfo) -> Result<Constraint, ApiError> {
    let tok = &m.tokenizer;
    let (gbnf, source) = match spec {
        Spec::Grammar(g) => (g, Source::Grammar),
        Spec::Schema(s, source) => {
            let gbnf = schema_gbnf(&s).map_err(|e| {
                ApiError::param(
                    source.field(),
                    format!("{}: the JSON schema cannot be used: {e}", source.field()),
                )
            })?;
            (gbnf, source)
        }
    };
    let grammar = parse_gbnf(&gbnf, tok).map_err(|e| {
        let what = match source {
            Source::Grammar => "the grammar does not parse",
            _ => "the grammar made from the JSON schema does not parse",
        };
        ApiError::param(source.field(), format!("{}: {what}: {e}", source.field()))
    })?;
    let vocab = m
        .grammar_vocab
        .get_or_init(|| Arc::new(grammar_vocab(tok)))
        .clone();
    Ok(Constraint {
        gbnf,
        grammar: Arc::new(grammar),
        vocab,
    })
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
