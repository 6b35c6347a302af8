//! JSON Schema → GBNF conversion.
//!
//! [`schema_to_gbnf`] turns a JSON Schema (as a `serde_json::Value`) into a GBNF grammar whose
//! start rule is `root`, the way llama-server does for its `json_schema` request field and for
//! OpenAI-style `response_format` (`{"type":"json_object"}` corresponds to the schema
//! `{"type":"object"}`, `{"type":"json_schema","json_schema":{"schema":S}}` to `S`).
//!
//! The produced language is *sound*: every string the grammar accepts is a JSON document that
//! validates against the schema. Constraints that cannot be expressed exactly are either
//! narrowed safely (e.g. objects without `additionalProperties` get no extra keys, as in
//! llama.cpp) or rejected with a [`SchemaError`] naming the keyword and its JSON pointer.
//!
//! Layout of the generated JSON: no whitespace before the first or after the last token;
//! between tokens (after `{`, `[`, `,`, `:` and before `}`/`]`) an optional whitespace run
//! (`" "`, or one or two newlines followed by up to 20 spaces/tabs). Compact `serde_json`
//! output, `serde_json::to_string_pretty` output (up to 10 levels deep) and Python's default
//! `json.dumps` layout are all accepted.

mod budget;
mod charset;
mod convert;
mod grammar;

/// A GBNF string literal (quoted, escaped) matching exactly its argument.
pub use grammar::literal as gbnf_literal;
mod merge;
mod numeric;
mod pattern;

#[cfg(test)]
mod tests;

use serde_json::Value;

/// Maximum nesting depth of subschemas (and of `$ref`/`allOf` chains) before conversion stops
/// with [`SchemaError::TooDeep`].
pub const MAX_DEPTH: usize = 64;

/// Most alternatives that folding `allOf`/`$ref` into `anyOf`/`oneOf` may produce for one
/// schema (`allOf: [{anyOf: [a, b]}, {anyOf: [c, d]}]` has 4) before conversion stops with
/// [`SchemaError::TooComplex`].
pub const MAX_ALTERNATIVES: usize = 256;

/// Most units of work one conversion may do: one per subschema converted, per `allOf`/`$ref`
/// folding step and per `oneOf` analysis step, plus the size (in JSON nodes) of every schema
/// copied while merging. Beyond it conversion stops with [`SchemaError::TooComplex`].
pub const MAX_WORK: u64 = 200_000;

/// Most rules a generated grammar may have.
pub const MAX_RULES: usize = 10_000;

/// Most bytes a generated grammar may have.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// Most repetitions (`*`, `+`, `{n,m}`) a `pattern` may nest inside each other.
pub const MAX_PATTERN_NESTING: usize = 5;

/// Why a schema could not be converted. Every variant names the keyword and the JSON pointer
/// (`#/properties/a/items`, RFC 6901 escaping) of the schema it sits in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A keyword (or a value of a keyword) that the converter does not support.
    #[error("unsupported `{keyword}` at {pointer}: {detail}")]
    Unsupported {
        keyword: String,
        pointer: String,
        detail: String,
    },
    /// A keyword whose value is malformed.
    #[error("invalid `{keyword}` at {pointer}: {detail}")]
    Invalid {
        keyword: String,
        pointer: String,
        detail: String,
    },
    /// The constraints admit no JSON value (within the converter's limits).
    #[error("`{keyword}` at {pointer} cannot be satisfied: {detail}")]
    Unsatisfiable {
        keyword: String,
        pointer: String,
        detail: String,
    },
    /// Subschemas nested deeper than [`MAX_DEPTH`].
    #[error("`{keyword}` at {pointer}: schema nesting exceeds {limit} levels")]
    TooDeep {
        keyword: String,
        pointer: String,
        limit: usize,
    },
    /// The conversion would exceed one of the work or size limits ([`MAX_ALTERNATIVES`],
    /// [`MAX_WORK`], [`MAX_RULES`], [`MAX_GRAMMAR_BYTES`], [`MAX_PATTERN_NESTING`]).
    #[error("`{keyword}` at {pointer} is too complex to convert: {detail}")]
    TooComplex {
        keyword: String,
        pointer: String,
        detail: String,
    },
}

impl SchemaError {
    /// The keyword the error is about.
    pub fn keyword(&self) -> &str {
        match self {
            SchemaError::Unsupported { keyword, .. }
            | SchemaError::Invalid { keyword, .. }
            | SchemaError::Unsatisfiable { keyword, .. }
            | SchemaError::TooDeep { keyword, .. }
            | SchemaError::TooComplex { keyword, .. } => keyword,
        }
    }

    /// JSON pointer (with a leading `#`) of the schema holding the keyword.
    pub fn pointer(&self) -> &str {
        match self {
            SchemaError::Unsupported { pointer, .. }
            | SchemaError::Invalid { pointer, .. }
            | SchemaError::Unsatisfiable { pointer, .. }
            | SchemaError::TooDeep { pointer, .. }
            | SchemaError::TooComplex { pointer, .. } => pointer,
        }
    }

    pub(crate) fn unsupported(keyword: &str, pointer: &str, detail: impl Into<String>) -> Self {
        SchemaError::Unsupported {
            keyword: keyword.to_string(),
            pointer: pointer.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(keyword: &str, pointer: &str, detail: impl Into<String>) -> Self {
        SchemaError::Invalid {
            keyword: keyword.to_string(),
            pointer: pointer.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn unsat(keyword: &str, pointer: &str, detail: impl Into<String>) -> Self {
        SchemaError::Unsatisfiable {
            keyword: keyword.to_string(),
            pointer: pointer.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn too_complex(keyword: &str, pointer: &str, detail: impl Into<String>) -> Self {
        SchemaError::TooComplex {
            keyword: keyword.to_string(),
            pointer: pointer.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn too_deep(keyword: &str, pointer: &str) -> Self {
        SchemaError::TooDeep {
            keyword: keyword.to_string(),
            pointer: pointer.to_string(),
            limit: MAX_DEPTH,
        }
    }
}

/// Converts a JSON Schema into a GBNF grammar with start rule `root`.
pub fn schema_to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    convert::Converter::new(schema).run()
}

/// Converts a JSON Schema into GBNF rules meant to be combined with other rules in one
/// grammar: returns the name of the rule matching the schema's instances and the rules, one per
/// line, without a `root` rule. Every rule name, defined or referenced, starts with `prefix`,
/// so that the rules of conversions with different prefixes (none a prefix of another, for
/// example `a-` and `b-`) never clash, nor clash with rules whose names do not start with them.
/// The rules are those [`schema_to_gbnf`] writes for the same schema, renamed; the limits apply
/// to each conversion.
///
/// # Panics
/// If `prefix` has a character other than ASCII letters, digits and `-` (the characters of
/// the rule names the converter writes; `_` is left to the names a GBNF parser generates), or
/// starts with a digit.
pub fn schema_to_gbnf_rules(schema: &Value, prefix: &str) -> Result<(String, String), SchemaError> {
    subschema_to_gbnf_rules(schema, "#", prefix)
}

/// As [`schema_to_gbnf_rules`], for the subschema of `document` at `pointer` (`#` for the whole
/// document, else `#/...` with RFC 6901 escaping and no percent-decoding), its `$ref`s
/// resolving against `document` (for example a tool's parameter `#/properties/x` whose schema
/// refers to `#/$defs/y`). Errors name pointers into `document`; a pointer that does not
/// resolve is an [`SchemaError::Invalid`] for the keyword `pointer`.
///
/// # Panics
/// As [`schema_to_gbnf_rules`].
pub fn subschema_to_gbnf_rules(
    document: &Value,
    pointer: &str,
    prefix: &str,
) -> Result<(String, String), SchemaError> {
    assert!(
        prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !prefix.starts_with(|c: char| c.is_ascii_digit()),
        "invalid GBNF rule name prefix {prefix:?}"
    );
    let (top, rules) = convert::Converter::new(document).build(pointer)?;
    Ok((format!("{prefix}{top}"), rules.render_rules(prefix)))
}

/// Appends one RFC 6901 reference token to a pointer.
pub(crate) fn child_ptr(ptr: &str, token: &str) -> String {
    let mut out = String::with_capacity(ptr.len() + token.len() + 1);
    out.push_str(ptr);
    out.push('/');
    for c in token.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
    out
}
